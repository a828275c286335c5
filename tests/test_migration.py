"""The migration check: the trained model exported to ONNX, run by the host with onnxruntime.

The runner's test adapter (a numpy softmax regression, tests/fixtures/numpy_softmax) builds
its graph with the onnx package's helpers, or hands over its layer list for the host to
build (orchestrator/checks/onnx_layers.py); the runner runs it on the real MNIST, and the
host's check (orchestrator/checks/migration.py) runs the file it wrote with the real onnxruntime.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pandas as pd
import pytest

from conftest import dlbench, native_framework
from dlbench_runner import migration as exporting
from dlbench_runner.contract import formats
from orchestrator import store
from orchestrator import checks
from orchestrator.checks import migration
from orchestrator.collect import collect
from orchestrator.errors import StoreError
from orchestrator.runtimes.base import Outcome
from orchestrator.records import RunnerResult

FIXTURE = Path(__file__).parent / "fixtures" / "numpy_softmax"


def run_job(data_root, job_dir: Path, *settings: str):
    """The runner on the test adapter's quick MNIST model, its out/ in ``job_dir`` as a
    job's; the result."""
    out = job_dir / "out"
    out.mkdir(parents=True)
    args = [arg for setting in ("robust_images=0",) + settings for arg in ("--set", setting)]
    proc = subprocess.run([sys.executable, "-m", "dlbench_runner", "--framework-dir", str(FIXTURE),
                           "--data", str(data_root), "--out", str(out), "--dataset", "mnist",
                           "--profile", "quick", *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    RunnerResult.model_validate(result)
    assert result["status"] == "ok"
    return result


@pytest.mark.parametrize("dtype, tolerance", [("float64", 1e-9), ("float32", 1e-4)])
def test_the_onnx_model_gives_the_frameworks_own_logits_and_classes(data_root, tmp_path, dtype, tolerance):
    """The graph in the framework's precision agrees to rounding; its weights rounded to
    float32 agree within 1e-4 relative, and the check sees that rounding."""
    job = tmp_path / "job"
    result = run_job(data_root, job, f'onnx_export="{dtype}"')
    assert result["migration_reason"] is None and result["migration_time_s"] > 0
    assert result["migration_model_bytes"] == (job / "out" / "model.onnx").stat().st_size
    with np.load(job / "out" / "migration.npz") as arrays:
        assert arrays["predictions"].shape == (10000,) and arrays["logits"].shape == (16, 10)
        assert arrays["logits"].dtype == np.float64
    found = migration.evaluate(job, "mnist", data_root)
    assert found.migration_reason is None and found.images == result["test_samples"] == 10000
    assert found.migration_mismatches == 0
    assert abs(found.migrated_accuracy - result["accuracy"]) <= 0.001     # 0.1 points
    assert found.migration_max_logit_error <= tolerance
    if dtype == "float32":
        assert found.migration_max_logit_error > 1e-9
    assert found.model == (job / "out" / "model.onnx").read_bytes()


def test_a_layer_list_becomes_the_hosts_onnx_model(data_root, tmp_path):
    """An adapter without an ONNX exporter hands over its layers (float64, as it
    computes): the runner writes the list, the host builds the graph in float32 and
    checks it as an exported one."""
    job = tmp_path / "job"
    result = run_job(data_root, job, 'onnx_export="layers"')
    assert result["migration_reason"] is None and result["migration_model_bytes"] is None
    assert sorted(p.name for p in (job / "out").iterdir()) == ["layers.json", "layers.npz", "migration.npz",
                                                               "result.json"]
    listing = json.loads((job / "out" / "layers.json").read_text())
    assert listing == {"format": "dlbench-layers", "version": 1, "dtype": "float64", "input": [28, 28],
                       "layers": [{"op": "flatten"}, {"op": "dense", "weight": "1.weight"}]}
    found = migration.evaluate(job, "mnist", data_root)
    assert found.migration_reason is None and found.images == 10000
    assert found.migration_mismatches == 0 and abs(found.migrated_accuracy - result["accuracy"]) <= 0.001
    assert 1e-9 < found.migration_max_logit_error <= 1e-4       # float32 weights of a float64 model
    session = onnxruntime.InferenceSession(found.model, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["pixels"]


@pytest.mark.parametrize("damage, reason", [
    ("no arrays", "the runner wrote no layers.npz"),
    ("no list", "the runner wrote no model.onnx and no layers.json"),
    ("linked list", "layers.json is not a regular file (a symbolic link)"),
    ("cifar", "layers.json takes images of 28x28, not cifar10's 3x32x32"),
    ("renamed array", "layer 1 (dense): layers.npz has no array 1.w"),
])
def test_a_layer_list_the_host_cannot_build_is_a_reason(exported_layers, data_root, tmp_path, damage, reason):
    job = tmp_path / "job"
    shutil.copytree(exported_layers, job)
    out = job / "out"
    if damage == "no arrays":
        (out / "layers.npz").unlink()
    elif damage == "no list":
        (out / "layers.json").unlink()
    elif damage == "linked list":
        (out / "layers.json").unlink()
        (out / "layers.json").symlink_to(exported_layers / "out" / "layers.json")
    elif damage == "renamed array":
        listing = json.loads((out / "layers.json").read_text())
        listing["layers"][1]["weight"] = "1.w"
        (out / "layers.json").write_text(json.dumps(listing))
    found = migration.evaluate(job, "cifar10" if damage == "cifar" else "mnist", data_root)
    assert found.migration_reason == reason, found.migration_reason
    assert found.model is None and found.migrated_accuracy is None


def test_a_graph_that_is_not_the_trained_model_is_caught(data_root, tmp_path):
    """A graph whose weights are the trained ones negated: every class differs."""
    job = tmp_path / "job"
    result = run_job(data_root, job, 'onnx_export="wrong"')
    found = migration.evaluate(job, "mnist", data_root)
    assert found.migration_reason is None
    assert found.migration_mismatches > 9900 and found.migrated_accuracy < 0.05 < result["accuracy"] - 0.8
    assert found.migration_max_logit_error >= 1.0


@pytest.mark.parametrize("given, mismatches", [("given", 0), ("none", 0), ("shifted", 10_000)])
def test_the_frameworks_side_is_its_own_test_pass(data_root, tmp_path, given, mismatches):
    """The classes the job's test pass predicted are the framework's side of the check: a
    test pass whose classes are each off by one disagrees with the ONNX model on every
    tested image; one that gives none has the runner predict the images itself."""
    job = tmp_path / "job"
    run_job(data_root, job, f'test_predictions="{given}"')
    found = migration.evaluate(job, "mnist", data_root)
    assert found.migration_reason is None and found.images == 10_000
    assert found.migration_mismatches == mismatches


@pytest.mark.parametrize("setting, reason", [
    ('onnx_export="none"', "numpy has no ONNX exporter"),
    ('onnx_export="crash"', "RuntimeError: the exporter met an operator it does not know"),
    ("export_onnx=0", "not asked for (export_onnx=0)"),
    ('onnx_export="external"', "the exporter wrote the model's weights to other files (model.onnx.data): "
                               "dlbench keeps one self-contained ONNX file"),
])
def test_a_model_that_is_not_exported_has_a_reason_and_an_ok_job(data_root, tmp_path, setting, reason):
    job = tmp_path / "job"
    result = run_job(data_root, job, setting)
    assert result["migration_reason"] == reason and result.get("migration_model_bytes") is None
    assert [p.name for p in (job / "out").iterdir()] == ["result.json"]
    assert migration.evaluate(job, "mnist", data_root) is None
    assert ("migration_time_s" in result) == (setting != "export_onnx=0")


def test_an_adapter_without_an_exporter_gets_the_reason():
    class Plain:
        def predict(self, pixels):
            return np.zeros(len(pixels), int)

    found = exporting.export(Plain(), np.zeros((3, 28, 28), np.uint8), "/nonexistent")
    assert found == {"migration_reason": "this framework's adapter exports no ONNX model yet",
                     "migration_model_bytes": None}


def arrays_file(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


GOOD = dict(predictions=np.zeros(100, np.int64), logits=np.zeros((16, 10)))


@pytest.fixture(scope="module")
def exported(data_root, tmp_path_factory) -> Path:
    """A job directory whose out/ holds the test adapter's exported model (read only)."""
    job = tmp_path_factory.mktemp("exported") / "job"
    run_job(data_root, job)
    return job


@pytest.fixture(scope="module")
def exported_layers(data_root, tmp_path_factory) -> Path:
    """A job directory whose out/ holds the test adapter's layer list (read only)."""
    job = tmp_path_factory.mktemp("listed") / "job"
    run_job(data_root, job, 'onnx_export="layers"')
    return job


@pytest.mark.parametrize("model, compared, reason", [
    (b"\x08garbage", arrays_file(**GOOD), "the ONNX model cannot be read: Error parsing message"),
    ("link", arrays_file(**GOOD), "model.onnx is not a regular file"),
    (None, arrays_file(**GOOD), "the runner wrote no model.onnx"),
    ("good", b"PK\x03\x04 not a zip", "migration.npz is invalid: "),
    ("good", arrays_file(predictions=np.array([object()] * 3), logits=GOOD["logits"]), "migration.npz is invalid: "),
    ("good", arrays_file(predictions=np.full(100, 10), logits=GOOD["logits"]),
     "migration.npz is invalid: predictions must be 1 to 10000 classes of 0 to 9"),
    ("good", arrays_file(predictions=GOOD["predictions"], logits=np.full((16, 10), np.nan)),
     "migration.npz is invalid: logits must be N x 10 finite numbers"),
    ("cifar", arrays_file(**GOOD), "onnxruntime: "),      # an MNIST graph fed CIFAR-10 images
])
def test_the_hosts_check_of_hostile_files_is_a_reason(exported, data_root, tmp_path, model, compared,
                                                      reason):
    """What a job leaves in out/ is untrusted: a file that is not what it should be gives the
    reason in the row, never an exception, and no link is followed."""
    good = exported
    job = tmp_path / "job"
    (job / "out").mkdir(parents=True)
    (job / "out" / "migration.npz").write_bytes(compared)
    if model == "link":
        (job / "out" / "model.onnx").symlink_to(good / "out" / "model.onnx")
    elif model in ("good", "cifar"):
        shutil.copy(good / "out" / "model.onnx", job / "out" / "model.onnx")
    elif model is not None:
        (job / "out" / "model.onnx").write_bytes(model)
    found = migration.evaluate(job, "cifar10" if model == "cifar" else "mnist", data_root)
    assert found.migration_reason.startswith(reason), found.migration_reason
    assert found.migrated_accuracy is None and found.migration_mismatches is None


def test_logit_error_is_relative_to_each_images_largest_output():
    expected = np.array([[10.0, -20.0, 5.0], [0.0, 0.0, 0.0]])
    assert migration.logit_error(expected + [[0.0, 0.25, 0.0], [0.0, 0.0, 0.0]], expected) == 0.0125
    assert migration.logit_error(expected + [[0.0, 0.0, 0.0], [0.0, 0.5, 0.0]], expected) == 0.5


# -- through the job loop: a framework directory of the test adapter, run natively ----------
@pytest.fixture(scope="module")
def framework_path(tmp_path_factory) -> Path:
    """The test adapter as a framework dlbench finds (DLBENCH_FRAMEWORKS_PATH), run natively."""
    return native_framework(tmp_path_factory.mktemp("frameworks") / "softmax", "softmax").parent


def native_run(framework_path, data_root, results, *options):
    return dlbench("run", "--runtime", "native", "--python", sys.executable, "--frameworks", "softmax",
                   "--datasets", "mnist", "--profile", "quick", "--cpus", "1", "--set", "robust_images=0",
                   "--results", results, "--data-dir", data_root, *options, check=True,
                   env={"DLBENCH_FRAMEWORKS_PATH": str(framework_path),
                        "DOCKER_HOST": f"unix://{results.parent}/no-docker.sock"})


def test_dlbench_run_stores_the_model_beside_the_row(framework_path, data_root, tmp_path):
    results = tmp_path / "results"
    native_run(framework_path, data_root, results)
    row = store.load(results).iloc[0]
    assert row.status == "ok" and pd.isna(row.migration_reason), row.error
    assert row.migration_mismatches == 0 and abs(row.migrated_accuracy - row.accuracy) <= 0.001
    assert row.migration_max_logit_error <= 1e-9 and row.migration_time_s > 0
    path = store.model_path(results, row.run_id)
    assert path == results / "models" / f"{row.run_id}.onnx" and path.stat().st_size == row.migration_model_bytes
    assert not (results / "_jobs" / row.run_id / "out").exists()
    assert [p.name for p in (results / "models").iterdir()] == [path.name]      # no temporary file
    # anyone with onnxruntime re-checks what the row claims
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    images, labels = formats.test_split("mnist", str(data_root))
    classes = session.run(None, {"pixels": images.astype(np.float32) / np.float32(255.0)})[0].argmax(1)
    assert float(np.mean(classes == labels)) == row.migrated_accuracy


def test_dlbench_run_stores_the_model_the_host_built_from_a_layer_list(framework_path, data_root, tmp_path):
    results = tmp_path / "results"
    native_run(framework_path, data_root, results, "--set", 'onnx_export="layers"')
    row = store.load(results).iloc[0]
    assert row.status == "ok" and pd.isna(row.migration_reason), row.error
    assert row.migration_mismatches == 0 and row.migration_max_logit_error <= 1e-4
    path = store.model_path(results, row.run_id)
    assert path.stat().st_size == row.migration_model_bytes      # the host's model, not the runner's files
    onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_dlbench_run_stores_the_reason_and_no_model(framework_path, data_root, tmp_path):
    results = tmp_path / "results"
    native_run(framework_path, data_root, results, "--set", 'onnx_export="none"')
    row = store.load(results).iloc[0]
    assert row.status == "ok" and row.migration_reason == "numpy has no ONNX exporter"
    assert pd.isna(row.migrated_accuracy) and pd.isna(row.migration_mismatches)
    assert not (results / "models").exists()


def migration_taken(found) -> list:
    """What the checks took of a job whose migration check found ``found`` (the others: nothing)."""
    return [found if check.name == "migration" else None for check in checks.CHECKS]


def test_a_model_the_directory_cannot_take_is_rescued_and_recovered(exported, data_root, tmp_path,
                                                                    monkeypatch):
    """The results directory full when the model is written: the row and the model are kept
    in the rescue file, and `recover` stores both once there is room."""
    from conftest import make_plan

    job = tmp_path / "job"
    shutil.copytree(exported, job)          # collecting removes its out/

    plan_job, = make_plan(["pytorch"], ["mnist"], "quick", host_cpus=2).jobs
    found = migration.evaluate(job, "mnist", data_root)
    collected = collect(plan_job, "run1", "job1", job, Outcome(exit_code=0, wall_time_s=1.0, log_tail=[]),
                        {"image": "x"}, taken=migration_taken(found))
    results = tmp_path / "results"
    results.mkdir()
    real = store.write_model

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(store.rescue, "write_model", full)
    with pytest.raises(StoreError, match="its ONNX model: No space left on device"):
        store.store_row(results, collected.record, [], store.Rescue(results, "run1"), {}, collected.files)
    monkeypatch.setattr(store.rescue, "write_model", real)
    assert store.recover(results) == (1, [])
    assert store.model_path(results, "run1").read_bytes() == found.model
    assert len(store.load(results)) == 1


def test_a_row_takes_the_hosts_figures_only_on_the_images_the_job_tested(exported, data_root, tmp_path):
    from conftest import make_plan

    plan_job, = make_plan(["pytorch"], ["mnist"], "quick", host_cpus=2).jobs
    found = migration.evaluate(exported, "mnist", data_root)
    outcome = Outcome(exit_code=0, wall_time_s=1.0, log_tail=[])
    for name, given, reason in (("right", found, None),
                                ("short", dataclasses.replace(found, images=5),
                                 "the framework predicted 5 test images, not the 10000 it tested"),
                                ("none", None, "the job left no ONNX model to check")):
        job = tmp_path / name
        shutil.copytree(exported, job)
        collected = collect(plan_job, name, name, job, outcome, {"image": "x"}, taken=migration_taken(given))
        record, model = collected.record, collected.files.get("model")
        assert record.status == "ok" and record.migration_reason == reason
        assert (record.migration_mismatches == 0) == (reason is None)
        assert model == (None if given is None else found.model)
