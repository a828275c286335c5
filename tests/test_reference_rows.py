"""Quick runs against dlbench's reference rows, the end-of-run summary and the estimates.

The rows are the committed Lua Torch7 MNIST quick rows (docs/measurements/): one with two
epochs, one with one.  Both were measured before the quick defaults changed (train_subset
5,000 then, 1,500 now; test_subset 0 then, 1,000 now), so as committed they are "changed
settings"; where a test needs rows of today's defaults it relabels their hyper-parameters
and says so.  The reference directory is a temporary copy (``reference=``), the shipped one
(``reference_rows.LOCATION``) being the lead's to fill.  A rule's other side (an accuracy
that misses, another framework version) is the real row with that one field changed.
"""

from __future__ import annotations

import datetime as dt
import shutil
import socket
import tomllib
from pathlib import Path

import pytest

from conftest import dlbench, make_plan
from orchestrator import catalog, hostinfo, plan, store
from orchestrator.report import estimate, make_report, paper, reference_rows, summary
from orchestrator.records import RunRecord
from orchestrator.schema import SCHEMA_VERSION, dumps

REPO = Path(__file__).resolve().parent.parent
TORCH7 = REPO / "docs" / "measurements" / "2026-11-25-torch7-test-pass"
TODAY = dumps(paper.defaults("torch", "mnist", "quick"))     # today's quick defaults


def committed() -> dict[int, RunRecord]:
    """The committed rows by their epochs: 1 (the quick defaults of the day) and 2."""
    rows = [RunRecord(**dict(row, schema_version=SCHEMA_VERSION))      # upgraded, as read
            for f in store.row_files(TORCH7) for row in store.upgrades._read_rows(f).to_pylist()]
    return {len(r.epoch_time_s): r for r in rows}


def today(record: RunRecord, **changes) -> RunRecord:
    """A committed row relabelled with today's quick defaults (and ``changes``)."""
    return record.model_copy(update={"hyperparameters": TODAY, **changes})


def here(record: RunRecord, run_id: str) -> RunRecord:
    """A row relabelled as measured on this machine, as another run."""
    return record.model_copy(update={"run_id": run_id, "host_name": socket.gethostname(),
                                     "host_cpu_model": hostinfo.cpu_model()})


def directory(path: Path, *records: RunRecord) -> Path:
    store.append(path, list(records))
    return path


@pytest.fixture
def reference(tmp_path) -> Path:
    """The reference rows: the one-epoch row, relabelled with today's quick defaults."""
    return directory(tmp_path / "reference", today(committed()[1]))


def judged(results: Path, reference: Path) -> reference_rows.Judgement:
    return reference_rows.judge(paper.build(store.load(results)), reference)


def test_the_committed_rows_as_they_are_are_not_comparable_and_say_which_settings(tmp_path):
    shutil.copytree(TORCH7 / "runs", tmp_path / "reference" / "runs")
    j = judged(TORCH7, tmp_path / "reference")
    assert j.machine == "AMD EPYC, 2 CPUs"
    assert sorted(j.groups["verdict"]) == [
        "not comparable: changed hyper-parameters (epochs=2, test_subset=0, train_subset=5000)",
        "not comparable: changed hyper-parameters (test_subset=0, train_subset=5000)"]
    assert j.judged.empty and j.speed_ratio() is None


def test_a_quick_run_of_todays_defaults_trains_as_expected_with_a_speed_ratio(tmp_path, reference):
    one, two = committed()[1], committed()[2]
    results = directory(tmp_path / "results", today(two, run_id="two-epochs", host_name="other"))
    j = judged(results, reference)
    g = j.groups.iloc[0]
    assert g["verdict"] == reference_rows.AS_EXPECTED
    assert g["diff_points"] == pytest.approx(100 * (two.accuracy - one.accuracy))   # +1.16
    assert g["tolerance_points"] == reference_rows.TOLERANCE_POINTS
    assert g["speed_ratio"] == pytest.approx(two.train_time_s / one.train_time_s)    # 2.37
    assert j.speed_ratio() == pytest.approx(two.train_time_s / one.train_time_s)


def test_an_accuracy_beyond_the_tolerance_does_not_train_as_expected(tmp_path, reference):
    one = committed()[1]
    results = directory(tmp_path / "results", today(one, run_id="broken", accuracy=one.accuracy - 0.0301))
    g = judged(results, reference).groups.iloc[0]
    assert g["verdict"] == reference_rows.NOT_AS_EXPECTED
    assert g["diff_points"] == pytest.approx(-3.01)


def test_a_wide_reference_range_widens_the_tolerance(tmp_path):
    one, two = committed()[1], committed()[2]
    spread = directory(tmp_path / "reference", today(one), today(two))          # 94.42 and 95.58
    results = directory(tmp_path / "results", today(one, run_id="low", accuracy=one.accuracy - 0.02))
    g = judged(results, spread).groups.iloc[0]
    assert g["tolerance_points"] == pytest.approx(3 * 100 * (two.accuracy - one.accuracy))   # 3.48
    assert g["verdict"] == reference_rows.AS_EXPECTED       # 2.58 points below the median 95.0


def test_a_second_machines_reference_rows_widen_the_tolerance_not_the_speed(tmp_path):
    """MXNet's quick CIFAR-10 model gave 17.1% on the Intel reference machine and 21.7% on an
    AMD one: with one machine's rows a fresh AMD machine read "does not train as expected".
    Rows of a second machine widen the range; the first machine stays the reference."""
    one, two = committed()[1], committed()[2]
    later = one.recorded_at + dt.timedelta(days=1)
    other = today(two, run_id="amd", host_cpu_model="Other CPU", recorded_at=later)   # +1.16 points
    spread = directory(tmp_path / "reference", today(one), other)
    results = directory(tmp_path / "results", today(one, run_id="here", accuracy=one.accuracy + 0.0301,
                                                    train_time_s=2 * one.train_time_s))
    j = judged(results, spread)
    g = j.groups.iloc[0]
    assert g["reference_accuracy_pct"] == pytest.approx(100 * one.accuracy)       # the first machine's
    assert g["tolerance_points"] == pytest.approx(3 * 100 * (two.accuracy - one.accuracy))   # 3.48
    assert g["verdict"] == reference_rows.AS_EXPECTED and g["speed_ratio"] == pytest.approx(2)
    assert j.machine == f"{one.host_cpu_model}, {one.host_cpus} CPUs"
    alone = judged(results, directory(tmp_path / "first-only", today(one))).groups.iloc[0]
    assert alone["verdict"] == reference_rows.NOT_AS_EXPECTED       # 3.01 points off, 3 allowed
    # an estimate scales the reference machine's speeds, not the second machine's
    speeds = estimate.machine_speeds(None, spread)
    speed, = speeds.values()
    assert speed.train_images_per_s == pytest.approx(one.train_images_per_s)


def test_the_shipped_reference_rows_hold_every_quick_job_of_todays_defaults_with_three_seeds():
    """Every quick job, as today's quick defaults train it (a change to them fails this until
    the rows are measured again), three seeds each: their spread widens the tolerance."""
    rows = store.load(reference_rows.LOCATION)
    jobs = 2 * len(catalog.BUILT_IN)            # every built-in framework's two quick jobs
    assert len(rows) == 3 * jobs and (rows["status"] == "ok").all() and (rows["profile"] == "quick").all()
    assert rows.groupby(["framework", "dataset"])["seed"].nunique().eq(3).all()
    groups = paper.build(rows).groups
    assert len(groups) == jobs and set(groups["settings"]) == {"own defaults"}


def test_a_framework_whose_reference_rows_are_another_machine_s_is_judged_without_a_speed():
    """The shipped rows judged as if they were a run: the study's frameworks against the
    reference machine's own rows (speed 1), pytorch2's against its rows of the second machine
    (its accuracy judged, no speed: nothing of it was measured on the reference machine)."""
    j = reference_rows.judge(paper.build(store.load(reference_rows.LOCATION)))
    groups = j.groups.set_index(["framework", "dataset"])
    assert (groups["verdict"] == reference_rows.AS_EXPECTED).all()
    assert groups.loc["pytorch2", "speed_ratio"].isna().all()
    assert groups.drop(index="pytorch2", level=0)["speed_ratio"].eq(1.0).all()
    assert j.speed_ratio() == pytest.approx(1.0)


@pytest.mark.parametrize("change, reason", [
    (dict(framework_version="torch7@other"), "torch7@other here, torch7@3e9e141"),
    (dict(hyperparameters=dumps({**paper.defaults("torch", "mnist", "quick"), "epochs": 2})),
     "changed hyper-parameters (epochs=2)"),
    (dict(status="failed", accuracy=None), "no ok run"),
])
def test_what_is_not_comparable_says_why(tmp_path, reference, change, reason):
    results = directory(tmp_path / "results", today(committed()[1], run_id="other", **change))
    verdict = judged(results, reference).groups.iloc[0]["verdict"]
    assert verdict.startswith(f"not comparable: {reason}")


def test_reference_rows_of_other_settings_or_none_say_so(tmp_path):
    results = directory(tmp_path / "results", today(committed()[1], run_id="now"))
    shutil.copytree(TORCH7 / "runs", tmp_path / "stale" / "runs")
    assert judged(results, tmp_path / "stale").groups.iloc[0]["verdict"] == (
        "not comparable: the reference rows of torch mnist were measured with other settings "
        "(epochs=2, test_subset=0, train_subset=5000)")
    (tmp_path / "empty").mkdir()
    assert judged(results, tmp_path / "empty").groups.iloc[0]["verdict"] == (
        "not comparable: no reference rows ship with this dlbench")


def test_the_work_of_a_job_is_counted_from_its_settings():
    published = estimate.paper_hyperparameters
    assert estimate.work("torch", "mnist", published("torch", "mnist")) == (20 * 60_000, 10_000)
    assert estimate.work("caffe", "cifar10", published("caffe", "cifar10")) == (5_000 * 100, 10_000)
    assert estimate.work("torch", "mnist", paper.defaults("torch", "mnist", "quick")) == (1_500, 1_000)
    # Theano's LeNet5 validates on the last 10,000 of the 35,000 its quick profile gives it
    assert estimate.work("theano", "mnist", paper.defaults("theano", "mnist", "quick")) == (25_000, 10_000)
    assert estimate.work("mxnet", "mnist", paper.defaults("mxnet", "mnist", "quick")) == (200 * 64, 10_000)


def test_the_run_ends_with_a_summary_and_the_paper_commands_estimate(tmp_path, reference):
    two = committed()[2]
    results = directory(tmp_path / "results", today(two, run_id="two-epochs"))
    lines = summary.run_summary(results, ["two-epochs"], reference)
    assert all(len(line) <= 80 for line in lines), lines
    text = " ".join(" ".join(lines).split())       # the words, however wrapped
    assert "Against dlbench's reference rows (AMD EPYC, 2 CPUs):" in text
    assert "1 quick job judged: 1 trained as expected" in text
    assert f"training here takes {two.train_time_s / committed()[1].train_time_s:.2f}x" in text
    seconds = 20 * 60_000 / two.train_images_per_s + 10_000 / two.test_images_per_s
    assert f"about {estimate.duration(seconds)} on this machine" in text
    assert lines[-1] == "  dlbench run --frameworks torch --datasets mnist"
    assert "not judged" not in text

    stale = tmp_path / "stale"
    shutil.copytree(TORCH7 / "runs", stale / "runs")
    text = " ".join(" ".join(summary.run_summary(results, ["two-epochs"], stale, tmp_path / "r")).split())
    assert "1 not judged: torch mnist: the reference rows of torch mnist were measured with" in text
    assert "dlbench run --results " in text and "speed:" not in text


def test_the_estimate_prefers_this_machines_rows_then_scales_the_reference(tmp_path):
    one, two = committed()[1], committed()[2]
    cifar = dumps(paper.defaults("torch", "cifar10", "quick"))
    reference = directory(tmp_path / "reference", today(one), today(
        one, run_id="cifar", dataset="cifar10", model="torch7-cifar10-convnet", hyperparameters=cifar))
    jobs = make_plan(["torch"], None, profile="paper", host_cpus=2).jobs
    mnist, cifar10 = jobs
    only_reference = estimate.of_plan(jobs, tmp_path / "none", reference)
    assert only_reference.sources == {estimate.REFERENCE: 2}
    assert only_reference.seconds == pytest.approx(
        (1_200_000 + 2_250_000) / one.train_images_per_s + 2 * 10_000 / one.test_images_per_s)

    results = directory(tmp_path / "results", here(today(two), "mine"))      # slower here
    found = estimate.of_plan(jobs, results, reference)
    assert found.sources == {estimate.THIS_MACHINE: 1, estimate.SCALED: 1}
    factor = one.train_images_per_s / two.train_images_per_s
    assert found.seconds == pytest.approx(
        1_200_000 / two.train_images_per_s + 10_000 / two.test_images_per_s
        + factor * (2_250_000 / one.train_images_per_s + 10_000 / one.test_images_per_s))
    assert "about" in found.line("estimated time") and "1 from this machine's rows" in found.line("x")


def test_dry_run_prints_the_plans_estimated_time(tmp_path):
    args = ["run", "--dry-run", "--frameworks", "torch", "--datasets", "mnist"]
    proc = dlbench(*args, "--results", tmp_path / "none", check=True)
    assert proc.stderr.strip().splitlines()[-1].startswith("estimated time: ")
    results = directory(tmp_path / "results", here(today(committed()[1]), "mine"))
    proc = dlbench(*args, "--profile", "quick", "--results", results, check=True)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("estimated time: about ") and "(1 from this machine's rows)" in last


def test_the_report_shows_quick_groups_against_the_reference_rows(tmp_path, reference):
    results = directory(tmp_path / "results", today(committed()[2], run_id="two-epochs"))
    md, _ = make_report(results, "md", None, reference=reference)
    assert "### Quick runs against dlbench's reference rows (AMD EPYC, 2 CPUs)" in md
    assert "- torch mnist cpu, own defaults: trains as expected, 95.58% against 94.42%" in md
    assert "not comparable: quick profile" in md            # the paper's verdicts, unchanged
    table, _ = make_report(results, "table", None, reference=reference)
    assert "trains as expected" in " ".join(table.split())
    document = __import__("json").loads(make_report(results, "json", None, reference=reference)[0])
    assert document["format_version"] == 3
    assert document["reference_rows"]["groups"][0]["reference_verdict"] == "trains as expected"
    csv, _ = make_report(results, "csv", None, reference=reference)
    assert "reference_verdict" in csv.splitlines()[0] and "trains as expected" in csv


def test_the_reference_rows_ship_in_the_package():
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "reference/quick/runs/*.parquet" in data["orchestrator.report"]
    assert reference_rows.LOCATION == REPO / "orchestrator" / "report" / "reference" / "quick"


def test_the_summarys_speed_leaves_out_runs_that_builds_disturbed(tmp_path, reference):
    """A job that ran beside image builds shared the CPUs with them: the speed ratio is taken
    from the runs no build (or other work) disturbed, and says how many it left out."""
    one = committed()[1]
    quiet = dict(host_load_avg=0.5)         # the committed rows started under load
    alone = today(one, run_id="alone", builds_alongside=0, **quiet)
    # 1.3x slower: within the spread rule's 1.5x, so only the builds mark it
    beside = today(one, run_id="beside", builds_alongside=2, train_time_s=1.3 * one.train_time_s, **quiet)
    results = directory(tmp_path / "results", alone, beside)
    rows = paper.build(store.load(results)).rows.set_index("run_id")
    assert rows.loc["beside", "disturbed"] == "2 image build(s) ran beside it"
    assert rows.loc["alone", "disturbed"] == ""
    text = " ".join(" ".join(summary.run_summary(results, ["alone", "beside"], reference)).split())
    assert ("training here takes 1.00x the reference machine's time (geometric mean over 1 job; "
            "1 disturbed run left out)") in text

    only = directory(tmp_path / "only", beside)
    text = " ".join(" ".join(summary.run_summary(only, ["beside"], reference)).split())
    assert "training here takes 1.30x the reference machine's time" in text
    assert "every run disturbed" in text and "not a fair figure" in text
