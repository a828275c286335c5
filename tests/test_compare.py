"""`dlbench compare`, the noise rule and the row filters, on stored rows.

Rows whose numbers must fall on a chosen side of a rule are runner results taken through the
real collect -> store -> load chain (``runner_rows``, as the report's verdict tests make
them); the committed Torch7 rows (docs/measurements/) are the real rows of a disturbed
machine: both trained beside other work, load average 2.99 and 4.11 on 2 CPUs.
"""

from __future__ import annotations

import io
import json
import shutil

import pandas as pd
import pytest

from conftest import REPO, dlbench
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
                   r"no-such-campaign: no stored run \(a side is a results directory, a condition")


def test_rows_of_two_versions_in_one_side_are_never_merged(tmp_path):
    a = runner_rows(tmp_path / "a", caffe(BASE, "1.0.0") + caffe([t * 2 for t in BASE], "2.0.0"))
    b = runner_rows(tmp_path / "b", caffe(BASE, "1.0.0"))
    groups = compare_json(a, b)["groups"]
    assert sorted((g["a_framework_version"], g["a_runs"], g["verdict"]) for g in groups) == [
        ("1.0.0", 5, "no significant difference"), ("2.0.0", 5, "faster")]


def test_too_few_runs_get_no_verdict_and_never_fail(tmp_path):
    a = runner_rows(tmp_path / "a", caffe([100.0, 101.0, 99.0], "1.0.0"))
    b = runner_rows(tmp_path / "b", caffe([300.0, 310.0, 305.0], "1.0.0"))
    pair, = compare_json(a, b, "--fail-on-slowdown", "5%")["groups"]
    assert pair["verdict"] == "too few runs" and pair["p_value"] is None     # 3 a side: p >= 0.1
    assert pair["ratio"] == pytest.approx(3.05)
    one, = compare_json(TORCH7, TORCH7)["groups"][:1]
    assert one["verdict"] == "too few runs" and one["ratio_low"] is None     # one run a side


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
