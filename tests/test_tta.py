"""Time to accuracy (report/tta.py) on the committed paper rows: the figures `dlbench report`
gives are the ones computed here from the raw Parquet rows by hand; --target overrides the
documented defaults; a bad --target is one line and exit 2."""

from __future__ import annotations

import io
import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from conftest import REPO, dlbench
from orchestrator.report import paper, tta

MEASUREMENTS = REPO / "docs" / "measurements"
CAFFE = MEASUREMENTS / "2026-11-26-caffe-mnist-paper"
CHECKS = MEASUREMENTS / "2026-11-26-mnist-paper-checks"


def raw(directory) -> list[dict]:
    """The stored rows as the Parquet files hold them, read without dlbench."""
    return [row for f in sorted((directory / "runs").glob("*.parquet")) for row in pq.read_table(f).to_pylist()]


def by_hand(row: dict, target: float) -> tuple[int, float] | None:
    """(epoch from 1, seconds summed up to it) of the first epoch at or above ``target``."""
    total = 0.0
    for epoch, (accuracy, seconds) in enumerate(zip(row["epoch_accuracy"], row["epoch_time_s"]), start=1):
        total += seconds
        if accuracy >= target:
            return epoch, total
    return None


def report_json(*args) -> dict:
    return json.loads(dlbench("report", *args, "--format", "json", check=True).stdout)


def test_caffe_mnist_reaches_99_percent_after_the_seconds_its_epochs_add_up_to():
    row, = raw(CAFFE)
    epoch, seconds = by_hand(row, 0.99)
    assert epoch == 4 and 180 < seconds < 190          # 47.1 + 46.6 + 42.2 + 49.3 s
    found, = report_json("--results", CAFFE)["time_to_accuracy"]
    assert (found["framework"], found["target_pct"], found["reached"], found["runs"]) == ("caffe", 99, 1, 1)
    assert found["epoch_median"] == epoch and found["time_s_median"] == pytest.approx(seconds, rel=1e-12)
    table = dlbench("report", "--results", CAFFE, check=True).stdout
    assert f"{seconds:,.1f} s (epoch 4)" in table


def test_each_framework_of_the_checks_against_the_rows_and_a_target_set_by_hand():
    rows = {r["framework"]: r for r in raw(CHECKS)}
    assert set(rows) == {"caffe", "mxnet"}
    for target in ("0.995", "99.5%"):
        found = {g["framework"]: g for g in report_json("--results", CHECKS, "--target", target)["time_to_accuracy"]}
        for framework, row in rows.items():
            epoch, seconds = by_hand(row, 0.995)
            assert found[framework]["target_pct"] == pytest.approx(99.5)
            assert (found[framework]["epoch_median"], found[framework]["time_s_median"]) == (
                epoch, pytest.approx(seconds, rel=1e-12))
    csv = pd.read_csv(io.StringIO(dlbench("report", "--results", CHECKS, "--format", "csv", check=True).stdout))
    caffe = csv[csv["framework"] == "caffe"].iloc[0]
    assert caffe["tta_time_s_median"] == pytest.approx(by_hand(rows["caffe"], 0.99)[1], rel=1e-9)


def test_a_target_no_epoch_reaches_is_not_reached_with_the_best_accuracy():
    row, = raw(CAFFE)
    assert max(row["epoch_accuracy"]) < 1.0 and by_hand(row, 1.0) is None
    found, = report_json("--results", CAFFE, "--target", "100%")["time_to_accuracy"]
    assert found["reached"] == 0 and found["time_s_median"] is None
    assert found["best_accuracy_pct"] == pytest.approx(max(row["epoch_accuracy"]) * 100)
    md = dlbench("report", "--results", CAFFE, "--target", "1", "--format", "md", check=True).stdout
    assert f"not reached (best {max(row['epoch_accuracy']) * 100:.2f}%, 11 epochs)" in md


@pytest.mark.parametrize("given", ["99", "0", "-0.5", "150%", "ninety", "0.99.1", ""])
def test_a_bad_target_is_one_line_and_exit_2(given):
    proc = dlbench("report", "--results", CAFFE, "--target", given)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "--target" in proc.stderr


def test_the_default_targets_are_the_papers_lowest_accuracy_rounded_down():
    ref = paper.reference()
    assert tta.default_target("caffe-lenet", "mnist") == 0.99
    assert tta.default_target("caffe-cifar10-quick", "cifar10") == 0.75      # 75.79 and 75.86
    assert tta.default_target("tf-cifar10-tutorial", "cifar10") == 0.86     # 87.0 and 86.0
    assert tta.default_target("torch7-cifar10-convnet", "cifar10") == 0.65   # 66.2 and 65.52
    assert tta.default_target("theano-reslab-convnet-cifar10", "cifar10") == 0.49
    assert tta.default_target("mxnet-resnet110", "cifar10") == tta.DATASET_TARGETS["cifar10"]
    for (framework, dataset, _), cell in ref.cells.items():       # never above what the paper got
        assert min(tta.paper_targets().values()) > 0
        if dataset == "mnist":
            assert cell["accuracy_pct"] >= 99


def test_an_epoch_without_its_time_gives_no_time():
    assert tta.first_at([0.5, 0.995], [10.0, 20.0], 0.99) == (2, 30.0)
    assert tta.first_at([0.5, 0.995], [10.0, 0.0], 0.99) == (2, None)
    assert tta.first_at([0.5, 0.9], [10.0, 20.0], 0.99) == (None, None)
    assert tta.first_at([0.99], [3.0], 0.99) == (1, 3.0)                   # at the target counts
