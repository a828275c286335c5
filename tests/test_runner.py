"""The stand-alone runner on the host, with a small real numpy adapter and the real MNIST."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlbench_runner import spec as specs
from dlbench_runner.contract import EVENT_TAG, SCHEMA_VERSION, gpu_index
from orchestrator.schema import RunnerResult

FIXTURE = Path(__file__).parent / "fixtures" / "numpy_softmax"


def run_runner(data_root, out, *args):
    return subprocess.run([sys.executable, "-m", "dlbench_runner", "--framework-dir", str(FIXTURE),
                           "--data", str(data_root), "--out", str(out), "--dataset", "mnist", *args],
                          capture_output=True, text=True, timeout=600)


def events(stdout):
    return [json.loads(line[len(EVENT_TAG):]) for line in stdout.splitlines() if line.startswith(EVENT_TAG)]


def test_runner_trains_and_writes_a_valid_result(data_root, tmp_path):
    proc = run_runner(data_root, tmp_path, "--profile", "quick", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    RunnerResult.model_validate(result)
    assert result["schema_version"] == SCHEMA_VERSION
    assert result["status"] == "ok"
    assert result["accuracy"] > 0.85           # softmax regression, one epoch
    assert result["train_samples"] == 60000 and result["test_samples"] == 10000
    assert result["param_count"] == 784 * 10
    assert len(result["epochs"]) == 1
    for key in ("setup_time_s", "train_time_s", "test_time_s"):
        assert 0 < result[key] < result["total_time_s"]
    assert result["train_images_per_s"] == pytest.approx(60000 / result["train_time_s"])
    assert result["threads"]["env"]["OMP_NUM_THREADS"] == "1"
    kinds = [e["event"] for e in events(proc.stdout)]
    assert kinds[0] == "phase" and kinds[-1] == "done" and "epoch" in kinds


def test_every_span_waits_for_the_work_queued_on_an_asynchronous_device(data_root, tmp_path):
    """The runner reads its clock through ctx.now(), which first calls the adapter's
    synchronize(): work a framework queued on its device and has not finished is
    inside the span it was queued in (the fixture's device takes 1.5 s a launch)."""
    proc = run_runner(data_root, tmp_path, "--profile", "quick", "--threads", "1",
                      "--set", "device_lag_s=1.5")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["epochs"][0]["time_s"] >= 1.5
    assert result["train_time_s"] >= 1.5 and result["test_time_s"] >= 1.5


def test_runner_failure_is_a_result_not_a_crash(data_root, tmp_path):
    proc = run_runner(data_root, tmp_path, "--profile", "quick", "--set", "fail_in=train")
    assert proc.returncode == 1
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "failed"
    assert "during train" in result["error"] and "asked to fail" in result["error"]
    assert result["setup_time_s"] > 0 and "train_time_s" not in result


def test_runner_rejects_an_unknown_hyperparameter(data_root, tmp_path):
    proc = run_runner(data_root, tmp_path, "--set", "momentum=0.9")
    assert proc.returncode == 2
    assert "no hyper-parameter 'momentum'" in proc.stderr
    assert not (tmp_path / "result.json").exists()


def test_the_device_is_read_once_by_the_contract_and_a_bad_one_refused(data_root, tmp_path):
    assert [gpu_index(d) for d in ("cpu", "cuda", "cuda:0", "cuda:3")] == [None, 0, 0, 3]
    for device in ("tpu", "cuda:", "cuda:x", "cuda0", "cuda:-1", "cuda:\u0661", "", None):
        with pytest.raises(specs.SpecError, match="use cpu, cuda or cuda:N"):
            gpu_index(device)
    proc = run_runner(data_root, tmp_path, "--device", "cuda:x")
    assert proc.returncode == 2
    assert "device 'cuda:x': use cpu, cuda or cuda:N" in proc.stderr
    assert not (tmp_path / "result.json").exists()


def test_profiles_and_overrides_resolve_in_order():
    catalog = specs.load_catalog(str(FIXTURE))
    assert specs.resolve_hyperparameters(catalog, "mnist", "paper")["epochs"] == 2
    assert specs.resolve_hyperparameters(catalog, "mnist", "quick")["epochs"] == 1
    params = specs.resolve_hyperparameters(catalog, "mnist", "quick", {"epochs": 3, "learning_rate": 1})
    assert params["epochs"] == 3 and params["learning_rate"] == 1.0
    assert isinstance(params["learning_rate"], float)


@pytest.mark.parametrize("overrides, message", [
    ({"epochs": 1.5}, "must be int"),
    ({"learning_rate": "fast"}, "must be float"),
    ({"nope": 1}, "no hyper-parameter"),
])
def test_bad_overrides_are_refused(overrides, message):
    catalog = specs.load_catalog(str(FIXTURE))
    with pytest.raises(specs.SpecError, match=message):
        specs.resolve_hyperparameters(catalog, "mnist", "paper", overrides)


def test_unknown_dataset_and_profile_are_refused():
    catalog = specs.load_catalog(str(FIXTURE))
    with pytest.raises(specs.SpecError, match="no model for data set 'cifar10'"):
        specs.resolve_hyperparameters(catalog, "cifar10", "paper")
    with pytest.raises(specs.SpecError, match="unknown profile"):
        specs.resolve_hyperparameters(catalog, "mnist", "fast")


def test_an_epochs_time_leaves_out_the_work_its_adapter_excluded(monkeypatch):
    """Work an adapter keeps out of training (``train_excluded_s``) in the middle of an
    epoch, as Caffe's solver tests mid-epoch, is kept out of that epoch's time_s too."""
    from types import SimpleNamespace

    from dlbench_runner import runner
    now = [100.0]
    monkeypatch.setattr(runner, "time", SimpleNamespace(perf_counter=lambda: now[0],
                                                        monotonic=lambda: now[0]))
    ctx = runner.Context({"hyperparameters": {}, "dataset": "mnist", "device": "cpu", "seed": 1,
                          "threads": None}, None)
    ctx.epoch_start()
    now[0] += 5.0
    ctx.train_excluded_s += 2.0         # a test pass of 2 s inside epoch 1
    now[0] += 4.0
    ctx.epoch_done(1, 0.5, 0.9)
    ctx.epoch_start()
    now[0] += 3.0
    ctx.epoch_done(2, 0.4, 0.95)
    assert [e["time_s"] for e in ctx.epochs] == [7.0, 3.0]
