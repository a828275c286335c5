"""`dlbench compare`, the noise rule and the row filters, on stored rows.

Rows whose numbers must fall on a chosen side of a rule are runner results taken through the
real collect -> store -> load chain (``runner_rows``, as the report's verdict tests make
them), with the host's facts a test needs (machine, image, BLAS library) written into their
stored rows (``stored``); the committed Torch7 rows (docs/measurements/) are the real rows of
a disturbed machine: both trained beside other work, load average 2.99 and 4.11 on 2 CPUs.
"""

from __future__ import annotations

import io
import json
import shutil

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import REPO, dlbench
from orchestrator import store
from orchestrator.report import compare
from test_report import one_line_error, report_json, runner_rows

TORCH7 = REPO / "docs" / "measurements" / "2026-11-25-torch7-test-pass"
BASE = [100.0, 101.5, 99.0, 102.0, 100.5]


def caffe(times, version, **extra) -> list[dict]:
    return [dict(framework="caffe", train_time_s=t, accuracy=0.99, framework_version=version, **extra)
            for t in times]


def compare_json(*args, code=0) -> dict:
    proc = dlbench("compare", *args, "--format", "json")
    assert proc.returncode == code, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


HOST_FACTS = ("host_name", "host_cpu_model", "image_id", "blas")
XEON, EPYC = "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "AMD EPYC 7R13 Processor"


def stored(directory, specs: list[dict]):
    """``runner_rows``, with the host's facts a spec names (``HOST_FACTS``: what the host, not
    the runner, writes into a row) written into its stored row."""
    facts = [{k: spec[k] for k in HOST_FACTS if k in spec} for spec in specs]
    results = runner_rows(directory, [{k: v for k, v in spec.items() if k not in HOST_FACTS}
                                      for spec in specs])
    path, = store.row_files(results)
    table = pq.read_table(path)
    for key in {k for f in facts for k in f}:
        i = table.schema.get_field_index(key)
        values = [f.get(key, old) for f, old in zip(facts, table[key].to_pylist())]
        table = table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type))
    pq.write_table(table, path)
    return results


def test_a_slower_version_is_significant_and_fails_ci_past_its_threshold(tmp_path):
    a = runner_rows(tmp_path / "a", caffe(BASE, "1.0.0"))
    b = runner_rows(tmp_path / "b", caffe([t * 1.10 for t in BASE], "1.1.0"))
    document = compare_json(a, b)
    pair, = document["groups"]
    assert (pair["a_framework_version"], pair["b_framework_version"]) == ("1.0.0", "1.1.0")
    assert pair["a_median"] == 100.5 and pair["b_median"] == pytest.approx(110.55)
    assert pair["ratio"] == pytest.approx(1.10)
    assert pair["ratio_low"] <= 1.10 <= pair["ratio_high"] and pair["ratio_low"] > 1.0
    assert pair["p_value"] < 0.05 and pair["verdict"] == "slower"
    # the other way round, faster; the seeded interval is the same run after run
    back, = compare_json(b, a)["groups"]
    assert back["verdict"] == "faster" and back["ratio"] == pytest.approx(1 / 1.10)
    assert compare_json(a, b)["groups"][0]["ratio_low"] == pair["ratio_low"]

    assert dlbench("compare", a, b, "--fail-on-slowdown", "5%").returncode == 4
    assert dlbench("compare", a, b, "--fail-on-slowdown", "15%").returncode == 0
    table = dlbench("compare", a, b, check=True).stdout
    assert "slower" in table and "1.10×" in table and "1.0.0 / 1.1.0" in table


def test_sides_as_conditions_or_campaigns_of_one_directory(tmp_path):
    results = runner_rows(tmp_path, caffe(BASE, "1.0.0") + caffe([t * 0.8 for t in BASE], "1.1.0")
                          + caffe(BASE, "1.0.0", dataset="cifar10"))
    document = compare_json("framework_version=1.0.0", "framework_version=1.1.0", "--results", results,
                            "--dataset", "mnist")
    pair, = document["groups"]
    assert pair["verdict"] == "faster" and pair["ratio"] == pytest.approx(0.8)
    everything = compare_json("framework_version=1.0.0", "framework_version=1.1.0", "--results", results)
    assert sorted(g["verdict"] for g in everything["groups"]) == ["faster", "only in A"]
    one_line_error(dlbench("compare", "no-such-campaign", "framework_version=1.0.0", "--results", results),
                   r"^dlbench: error: no-such-campaign: no such results directory, and no campaign "
                   r"of that name in .*results \(a side is a results directory, a condition")


def test_a_missing_side_is_named_as_typed(tmp_path):
    # no --results: the default results directory is not there either; the side comes first
    one_line_error(dlbench("compare", "old-results", "new-results",
                           env={"DLBENCH_RESULTS_DIR": str(tmp_path / "nowhere")}),
                   r"^dlbench: error: old-results: no such results directory \(nor a campaign "
                   r"of --results .*nowhere, which does not exist\)$")


def test_rows_of_two_versions_in_one_side_are_never_merged(tmp_path):
    a = runner_rows(tmp_path / "a", caffe(BASE, "1.0.0") + caffe([t * 2 for t in BASE], "2.0.0"))
    b = runner_rows(tmp_path / "b", caffe(BASE, "1.0.0"))
    groups = compare_json(a, b)["groups"]
    assert sorted((g["a_framework_version"], g["a_runs"], g["verdict"]) for g in groups) == [
        ("1.0.0", 5, "no significant difference"), ("2.0.0", 5, "faster")]




def test_accuracy_is_compared_in_percent(tmp_path):
    a = runner_rows(tmp_path / "a", caffe(BASE, "1.0.0"))
    pair, = compare_json(a, a, "--metric", "accuracy")["groups"]
    assert pair["a_median"] == pytest.approx(99.0) and pair["verdict"] == "no significant difference"
    one_line_error(dlbench("compare", a, a, "--metric", "accuracy", "--fail-on-slowdown", "5%"),
                   r"--fail-on-slowdown goes with a time metric")


def test_the_other_formats_carry_the_same_pairs(tmp_path):
    a = runner_rows(tmp_path / "a", caffe(BASE, "1.0.0"))
    b = runner_rows(tmp_path / "b", caffe([t * 1.10 for t in BASE], "1.1.0"))
    frame = pd.read_csv(io.StringIO(dlbench("compare", a, b, "--format", "csv", check=True).stdout))
    assert list(frame["verdict"]) == ["slower"] and frame["b_framework_version"][0] == "1.1.0"
    markdown = dlbench("compare", a, b, "--format", "md", check=True).stdout
    assert "| caffe mnist cpu paper, own defaults, 2 threads | 100.5 | 110.6 | 1.10× [" in markdown


# --- the CI gate: closed to what it cannot judge ---

def test_a_gate_fails_on_groups_it_cannot_judge_with_a_status_of_their_own(tmp_path):
    # 2x slower with 1 run a side and with 3: too few runs for any verdict (3 and 3 cannot
    # reach p < 0.05 however far apart), so the gate cannot pass them
    for n in (1, 3):
        a = runner_rows(tmp_path / f"a{n}", caffe(BASE[:n], "1.0.0"))
        b = runner_rows(tmp_path / f"b{n}", caffe([2 * t for t in BASE[:n]], "1.0.0"))
        document = compare_json(a, b, "--fail-on-slowdown", "5%", code=compare.EXIT_INCONCLUSIVE)
        pair, = document["groups"]
        assert pair["verdict"] == "too few runs" and pair["ratio"] == pytest.approx(2.0)
        assert pair["p_value"] is None and pair["ratio_low"] is None    # no interval under 4 a side
        assert document["tally"] == {"slower": 0, "faster": 0, "no significant difference": 0,
                                     "inconclusive": 1}
    assert dlbench("compare", a, b, "--fail-on-slowdown", "5%", "--allow-inconclusive").returncode == 0
    assert dlbench("compare", a, b).returncode == 0          # no gate asked for
    # a definition on one side only cannot be judged either; a slower group fails first
    c = runner_rows(tmp_path / "c", caffe(BASE, "1.0.0") + caffe(BASE, "1.0.0", dataset="cifar10"))
    d = runner_rows(tmp_path / "d", caffe([t * 1.5 for t in BASE], "1.0.0"))
    groups = compare_json(c, d, "--fail-on-slowdown", "5%", code=compare.EXIT_SLOWER)["groups"]
    assert sorted(g["verdict"] for g in groups) == ["only in A", "slower"]
    proc = dlbench("compare", c, d, "--fail-on-slowdown", "60%")
    assert proc.returncode == compare.EXIT_INCONCLUSIVE
    assert "Tally: 1 slower, 0 faster, 0 no significant difference, 1 inconclusive (1 only in A)." \
        in proc.stdout


def test_slower_past_the_threshold_means_the_intervals_lower_end_is_above_it(tmp_path):
    # 4 against 4 runs 5.6% slower: significant (p 2/70, the least 4 and 4 allow), but the
    # interval reaches down to 1.03: not shown to be 5% slower, so the build passes
    four = BASE[:4]
    a = runner_rows(tmp_path / "a", caffe(four, "1.0.0"))
    b = runner_rows(tmp_path / "b", caffe([t * 1.056 for t in four], "1.1.0"))
    document = compare_json(a, b, "--fail-on-slowdown", "5%")
    pair, = document["groups"]
    assert pair["verdict"] == "slower" and pair["p_value"] == pytest.approx(2 / 70)
    assert pair["ratio"] == pytest.approx(1.056) and pair["ratio_low"] < 1.05 < pair["ratio"]
    assert any("its interval's lower end is above 1.05×: 0 group(s)" in note for note in document["notes"])
    assert dlbench("compare", a, b, "--fail-on-slowdown", "3%").returncode == compare.EXIT_SLOWER


def test_a_folder_against_itself_is_no_difference_in_every_group(tmp_path):
    # two images of one version (a rebuild), 13% apart: each group is paired with itself only
    results = stored(tmp_path, caffe(BASE, "1.0.0", image_id="sha256:" + "1" * 64)
                     + caffe([t * 1.13 for t in BASE], "1.0.0", image_id="sha256:" + "2" * 64)
                     + caffe(BASE, "1.0.0", dataset="cifar10"))
    document = compare_json(results, results, "--fail-on-slowdown", "5%")
    assert len(document["groups"]) == 3
    for pair in document["groups"]:
        assert pair["verdict"] == "no significant difference" and pair["ratio"] == 1.0
        assert pair["a_image_id"] == pair["b_image_id"]
    assert document["tally"]["no significant difference"] == 3 and document["warnings"] == []


def test_two_machines_are_never_one_and_a_pair_of_them_is_warned_of(tmp_path):
    # one host name, two CPUs: the report's two machines, and compare's
    a = stored(tmp_path / "a", caffe(BASE, "1.0.0", host_name="vm", host_cpu_model=XEON))
    b = stored(tmp_path / "b", caffe(BASE, "1.0.0", host_name="vm", host_cpu_model=EPYC))
    document = compare_json(a, b)
    pair, = document["groups"]
    assert (pair["a_host_cpu_model"], pair["b_host_cpu_model"]) == (XEON, EPYC)
    assert document["warnings"] == [f"Warning: the two sides ran on different machines: A on vm "
                                    f"({XEON}), B on vm ({EPYC}); their times differ by the "
                                    f"machine too."]
    both = stored(tmp_path / "both", caffe(BASE, "1.0.0", host_name="vm", host_cpu_model=XEON)
                  + caffe([t * 1.3 for t in BASE], "1.0.0", host_name="vm", host_cpu_model=EPYC))
    document = compare_json(both, both)
    assert sorted((g["a_host_cpu_model"], g["b_host_cpu_model"], g["verdict"])
                  for g in document["groups"]) == [(EPYC, EPYC, "no significant difference"),
                                                   (XEON, XEON, "no significant difference")]
    assert document["warnings"] == []
    if shutil.which("tmux") is not None:        # and it all fits an 80-column terminal
        from test_terminal import fits, pane

        lines = pane("compare", str(a), str(b), "--fail-on-slowdown", "5%")
        fits(lines)
        text = " ".join(lines)
        assert "different machines" in text and "Tally: 0 slower" in text


def test_by_a_setting_pairs_two_blas_libraries_of_one_folder(tmp_path):
    results = stored(tmp_path, caffe(BASE, "1.0.0", blas="blis")
                     + caffe([t * 0.8 for t in BASE], "1.0.0", blas="openblas"))
    # the sides are conditions on one setting: compared across it
    document = compare_json("blas=blis", "blas=openblas", "--results", results)
    pair, = document["groups"]
    assert document["across"] == ["blas"] and (pair["a_blas"], pair["b_blas"]) == ("blis", "openblas")
    assert pair["verdict"] == "faster" and pair["ratio"] == pytest.approx(0.8)
    assert pair["settings"] == "own defaults"
    by = compare_json("blis", "openblas", "--by", "blas", "--results", results)
    assert (by["a"], by["b"]) == ("blas=blis", "blas=openblas") and by["groups"] == document["groups"]
    table = dlbench("compare", "blis", "openblas", "--by", "blas", "--results", results, check=True).stdout
    assert "own defaults; blas blis / openblas" in table
    one_line_error(dlbench("compare", "blis", "openblas", "--by", "blaz", "--results", results),
                   r"--by blaz: not a setting of these runs \(one of .*blas")
    # a hyper-parameter the same way; --ignore pairs what differs in it, like with like
    rates = stored(tmp_path / "rates", [dict(framework="caffe", train_time_s=t * f, accuracy=0.99,
                                             overrides={"learning_rate": rate})
                                        for rate, f in ((0.02, 1.0), (0.03, 1.2)) for t in BASE])
    pair, = compare_json("0.02", "0.03", "--by", "learning_rate", "--results", rates)["groups"]
    assert (pair["a_learning_rate"], pair["b_learning_rate"], pair["verdict"]) == ("0.02", "0.03", "slower")
    groups = compare_json(rates, rates, "--ignore", "learning_rate")["groups"]
    assert sorted((g["a_learning_rate"], g["b_learning_rate"]) for g in groups) == [
        ("0.02", "0.02"), ("0.03", "0.03")]


def test_holms_correction_over_twenty_groups_changes_a_verdict(tmp_path):
    # 6 against 6 runs 3.5 s apart: alone, slower (p 0.015); as one of 20 groups compared
    # (the other 19 the same on both sides), one of 20 chances: Holm's p is 20 x 0.015
    six = [100.0, 101.0, 102.0, 103.0, 104.0, 105.0]
    rates = [round(0.011 + 0.001 * i, 3) for i in range(20)]

    def side(name, shift):
        return runner_rows(tmp_path / name, [
            dict(framework="caffe", train_time_s=t + (shift if rate == rates[0] else 0.0),
                 accuracy=0.99, overrides={"learning_rate": rate}) for rate in rates for t in six])
    a, b = side("a", 0.0), side("b", 3.5)
    alone, = compare_json(a, b, "--where", f"learning_rate={rates[0]}")["groups"]
    assert alone["verdict"] == "slower" and alone["p_value"] == alone["p_uncorrected"] < 0.05
    groups = compare_json(a, b)["groups"]
    assert len(groups) == 20
    first, = [g for g in groups if g["settings"] == alone["settings"]]
    assert first["p_uncorrected"] == alone["p_uncorrected"]
    assert first["p_value"] == pytest.approx(20 * alone["p_uncorrected"]) and first["p_value"] > 0.05
    assert {g["verdict"] for g in groups} == {"no significant difference"}


def test_holms_adjusted_p_values():
    # sorted 0.005, 0.01, 0.03, 0.04: times 4, 3, 2, 1, never less than the one before
    assert compare.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # in a family of 20 of which 2 were tested (the others could not be: p = 1)
    assert compare.holm([0.001, 0.01], 20) == pytest.approx([0.02, 0.19])


# --- the noise rule ---

def test_a_spread_group_has_its_slow_runs_marked_and_they_can_be_left_out(tmp_path):
    # the quick MXNet job of the issue: 2.7 s alone, 52-83 s beside other work
    results = runner_rows(tmp_path, caffe([2.70, 2.75, 2.72, 52.0, 82.9], "1.0.0"))
    group, = report_json(results)["groups"]
    assert group["disturbed"] == 2 and group["train_time_s_max"] == 82.9
    kept = report_json(results, "--exclude-disturbed")
    group, = kept["groups"]
    assert kept["disturbed_left_out"] == 2 and group["ok"] == 3 and group["train_time_s_max"] == 2.75
    assert any("disturbed" in note and "1.5×" in note for note in kept["notes"])
    markdown = dlbench("report", "--results", results, "--format", "md", check=True).stdout
    assert "| 5/5 ok, 2 disturbed |" in markdown
    assert "trained 30.7× as long as the fastest run" in markdown
    pair, = compare_json(results, results, "--exclude-disturbed")["groups"]
    assert pair["a_runs"] == 3 and pair["a_disturbed"] == 0


def test_runs_started_under_load_are_marked_with_the_load(tmp_path):
    groups = report_json(TORCH7)["groups"]
    assert [g["disturbed"] for g in groups] == [1, 1]
    markdown = dlbench("report", "--results", TORCH7, "--format", "md", check=True).stdout
    assert "load 2.99 at start on 2 CPUs" in markdown
    assert "load 4.11 at start on 2 CPUs" in markdown
    one_line_error(dlbench("report", "--results", TORCH7, "--exclude-disturbed"),
                   r"every chosen run is disturbed")


# --- filters and columns ---

def test_filters_choose_rows_and_bad_ones_are_one_line_errors(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(TORCH7, results)

    def run_ids(*args):
        return sorted(r["run_id"][:8] for r in json.loads(dlbench(
            "results", "--results", results, "--format", "json", *args, check=True).stdout))
    assert run_ids("--where", "train_time_s>200") == ["b3ce1a62"]
    assert run_ids("--where", "host_load_avg<=4.11", "--where", "recorded_at>2026-11-25T15:00") == ["f0fe28cd"]
    assert run_ids("--framework", "torch,caffe", "--dataset", "mnist") == ["b3ce1a62", "f0fe28cd"]
    assert run_ids("--where", "campaign=") == ["b3ce1a62", "f0fe28cd"]
    groups = report_json(results, "--where", "train_time_s<200")["groups"]
    # the one-epoch run only (the other trained two: epochs=2)
    assert len(groups) == 1 and "epochs=2" not in groups[0]["settings"]
    for args, error in [
            (("--where", "trian_time_s>1"), r"no stored column trian_time_s \(did you mean train_time_s"),
            (("--where", "framework"), r"not COLUMN OP VALUE"),
            (("--where", "train_time_s>fast"), r"train_time_s holds numbers, not 'fast'"),
            (("--where", "framework>a"), r"compares numbers and times; framework is text"),
            (("--framework", "caffe"), r"no stored run meets framework=caffe \(of 2\)"),
            (("--columns", "run_id,bogus"), r"--columns: no column 'bogus'")]:
        for command in ("results", "report"):
            if command == "report" and args[0] == "--columns":
                args = ("--columns", "train,bogus")
            proc = dlbench(command, "--results", results, *args)
            one_line_error(proc, error)
            assert proc.returncode in (1, 2)
