"""The native runtime: the same runner and adapter as a process of a host Python.

The host Python is a virtual environment holding tensorflow-cpu at the version the
tensorflow image pins (``scripts/native-env tensorflow``, which .ci/run calls); the
quick MNIST job trains for real on the real data set.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from conftest import REPO, dlbench
from orchestrator import catalog, store

training = pytest.mark.training
NATIVE_ENV = REPO / ".venv-native" / "tensorflow"


@pytest.fixture(scope="module")
def native_python() -> Path:
    python = NATIVE_ENV / "bin" / "python"
    if not python.exists():        # .ci/run made it already; make it for a plain pytest too
        subprocess.run([str(REPO / "scripts" / "native-env"), "tensorflow"], check=True)
    return python


@pytest.fixture(scope="module")
def native_run(native_python, data_root, tmp_path_factory):
    results = tmp_path_factory.mktemp("native") / "results"
    proc = dlbench("run", "--runtime", "native", "--python", native_python,
                   "--frameworks", "tensorflow,caffe", "--datasets", "mnist", "--profile", "quick",
                   "--cpus", "1", "--results", results, "--data-dir", data_root,
                   env={"DOCKER_HOST": f"unix://{results.parent}/no-docker.sock"})
    return proc, results


@training
def test_a_native_job_trains_for_real_and_stores_the_same_row(native_run, native_python):
    proc, results = native_run
    assert proc.returncode == 3, proc.stderr          # caffe cannot run natively here (below)
    frame = store.load(results).set_index("framework")
    tf = frame.loc["tensorflow"]
    assert tf["status"] == "ok", tf["error"]
    assert tf["runtime"] == "native" and pd.isna(tf["docker_version"])
    assert tf["image"] == f"native:{native_python.absolute()}" and tf["image_id"].startswith("native:")
    assert tf["accuracy"] > 0.9 and tf["train_samples"] == 55_000 and tf["test_samples"] == 10_000
    assert tf["framework_version"] == json.load(open(REPO / "images/tensorflow/models.json"))["version"]
    assert json.loads(tf["threads_env"])["OMP_NUM_THREADS"] == "1"
    assert tf["cpus"] == 1 and tf["cpuset"] == "0"
    # the resource trace: the process and its children, sampled each second
    assert tf["trace_samples"] > 3 and store.trace_path(results, tf["run_id"]).is_file()
    assert 0 < tf["cpu_percent_mean"] <= 110                  # pinned to one CPU
    assert tf["memory_peak_bytes"] >= tf["memory_peak_cgroup_bytes"] * 0.9 > 100 * 2**20


@training
def test_a_framework_the_host_python_lacks_is_an_unsupported_row(native_run, native_python):
    _, results = native_run
    caffe = store.load(results).set_index("framework").loc["caffe"]
    assert caffe["status"] == "unsupported"
    assert caffe["error"].startswith(f"caffe is not importable by {native_python.absolute()} "
                                     "(ModuleNotFoundError: No module named 'caffe')")


@training
def test_native_and_docker_rows_never_share_a_job_id(native_run):
    _, results = native_run
    ids = store.load(results)["image_id"]
    assert all(i.startswith("native:") for i in ids)


@training
def test_limits_natively(native_python, data_root, tmp_path):
    """A memory limit cannot be applied to a process: unsupported.  A timeout kills the
    whole process group: a timeout row and no process left."""
    results = tmp_path / "results"
    common = ["run", "--runtime", "native", "--python", native_python, "--frameworks", "tensorflow",
              "--datasets", "mnist", "--profile", "quick", "--results", results, "--data-dir", data_root]
    proc = dlbench(*common, "--memory", "2g")
    assert proc.returncode == 3
    row = store.load(results).iloc[0]
    assert row["status"] == "unsupported" and "cannot limit memory" in row["error"]
    proc = dlbench(*common, "--timeout", "8")
    assert proc.returncode == 3
    row = store.load(results).sort_values("recorded_at").iloc[-1]
    assert row["status"] == "timeout" and row["timeout_s"] == 8
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if "dlbench_runner" in " ".join(p.info["cmdline"] or []) and
                 str(results) in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []


def test_bad_native_options_are_one_line_errors(tmp_path):
    proc = dlbench("run", "--runtime", "native", "--python", tmp_path / "no-python", "--frameworks",
                   "tensorflow", "--results", tmp_path / "r")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"dlbench: error: --python {tmp_path / 'no-python'}: cannot run it")
    proc = dlbench("run", "--python", "python3", "--dry-run")
    assert proc.stderr.strip() == "dlbench: error: --python goes with --runtime native"
    proc = dlbench("run", "--runtime", "podman", "--dry-run")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr == "dlbench: error: --runtime 'podman': choose from docker, native\n"


def test_gpu_variants_are_declared_and_refused_where_there_is_no_cuda_build(monkeypatch):
    for framework in ("pytorch", "tensorflow", "caffe", "mxnet", "theano", "torch"):
        assert catalog.variant_unsupported(framework, "gpu") is None
    # every framework has a CUDA build today; one that declares none is refused by name
    monkeypatch.setitem(catalog.models("torch")["variants"], "gpu", {"unsupported": "no CUDA build"})
    assert catalog.variant_unsupported("torch", "gpu") == "torch has no GPU image: no CUDA build"
    proc = dlbench("build-images", "--variant", "tpu")
    assert proc.stderr.strip() == "dlbench: error: --variant 'tpu': choose from cpu, gpu"


@training
def test_native_workers_train_on_this_host_and_a_killed_one_fails_the_job(native_python, data_root, tmp_path):
    """Two workers as two processes of this host, on the loopback: TensorFlow's strategy over
    gRPC, the row says 2 workers on 1 node.  A worker killed while the job runs ends it: a
    failed row naming that worker, and no process of the job left."""
    common = ["run", "--runtime", "native", "--python", native_python, "--frameworks", "tensorflow",
              "--datasets", "mnist", "--profile", "quick", "--workers", "2", "--cpus", "2",
              "--set", "max_steps=60", "--set", "robust_images=0", "--data-dir", data_root]
    dlbench(*common, "--results", tmp_path / "ok", check=True)
    row = store.load(tmp_path / "ok").iloc[0]
    assert row["status"] == "ok", row["error"]
    assert (row["workers"], row["nodes"], row["dist_engine"]) == (2, 1, "MultiWorkerMirroredStrategy")
    assert len(row["worker_train_time_s"]) == 2 and row["accuracy"] > 0.5
    assert json.loads(row["threads_env"])["OMP_NUM_THREADS"] == "1"      # a CPU each

    results = tmp_path / "killed"
    proc = subprocess.Popen([*map(str, [REPO / ".venv" / "bin" / "dlbench", *common]), "--results", str(results)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def workers(rank: str):
        found = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if "dlbench_runner" in " ".join(p.info["cmdline"] or []) and \
                        str(results.resolve()) in " ".join(p.info["cmdline"] or []) and \
                        p.environ().get("DLBENCH_WORKER_RANK") == rank:
                    found.append(p)
            except psutil.Error:
                pass
        return found

    deadline, killed = time.monotonic() + 300, False
    while not killed and time.monotonic() < deadline and proc.poll() is None:
        other = workers("1")
        if other and other[0].cpu_times().user > 5:     # past its imports, into the job
            other[0].kill()
            killed = True
        time.sleep(0.5)
    _, err = proc.communicate(timeout=300)
    assert killed, err
    row = store.load(results).iloc[0]
    assert row["status"] == "failed" and row["nodes"] == 1
    assert row["error"].startswith("worker 1 of 2: the process exited with code 137 (SIGKILL); "
                                   "the others were stopped"), row["error"]
    assert workers("0") == workers("1") == []
