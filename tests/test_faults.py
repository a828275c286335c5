"""Failures are rows: each fault, caused for real, leaves exactly one row with the right
status, the campaign goes on, and the rows stored before stay as they were.

Every test runs a small campaign into one shared results directory: a pytorch job that
meets the fault, then a short caffe job that must still run and be ok.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import dlbench
from orchestrator import campaign, catalog, hostinfo, run, runtimes, store
from orchestrator.build import BuildOptions
from orchestrator.display import NullDisplay
from orchestrator.options import RunOptions
from orchestrator.runtimes import docker as docker_runtime

pytestmark = pytest.mark.docker

FAULTS = """\
name = "{name}"
frameworks = ["pytorch", "caffe"]
datasets = ["mnist"]
profiles = ["quick"]
threads = [1]
{extra}
[hyperparameters.caffe]
max_iter = 30
test_batch_size = 500

[limits.pytorch]
{limits}
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("faults") / "results"


def campaign_file(tmp_path, name, limits="", extra="") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(FAULTS.format(name=name, limits=limits, extra=extra))
    return path


def row_files(results: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in store.row_files(results)}


class Stored:
    """The rows a test adds to the shared directory; the ones before must not change."""

    def __init__(self, results: Path):
        self.results = results
        self.before = row_files(results) if results.is_dir() else {}

    def new_rows(self, name):
        after = row_files(self.results)
        assert {k: after.get(k) for k in self.before} == self.before, "a stored row changed"
        frame = store.load(self.results)
        frame = frame[frame["campaign"] == name]
        assert len(after) == len(self.before) + len(frame)
        return {row.framework: row for row in frame.itertuples()}


def check_the_caffe_job_went_on(rows, results):
    caffe = rows["caffe"]
    assert caffe.status == "ok", caffe.error
    assert caffe.accuracy > 0.5 and caffe.trace_samples > 0
    assert store.trace_path(results, caffe.run_id).is_file()


def test_a_job_over_its_memory_limit_is_an_oom_row(results, data_root, tmp_path):
    stored = Stored(results)
    proc = dlbench("run", "--campaign", campaign_file(tmp_path, "oom", 'memory = "200m"'),
                   "--results", results, "--data-dir", data_root)
    assert proc.returncode == 3, proc.stderr
    rows = stored.new_rows("oom")
    torch = rows["pytorch"]
    assert torch.status == "oom", (torch.status, torch.error)
    assert "out of memory" in torch.error and torch.exit_code == 137
    assert torch.memory_limit_bytes == 200 * 2**20
    # the kernel charged it up to its limit
    assert torch.memory_peak_cgroup_bytes >= 0.9 * torch.memory_limit_bytes
    assert torch.memory_peak_bytes <= 1.01 * torch.memory_limit_bytes
    check_the_caffe_job_went_on(rows, results)


def test_a_job_over_its_timeout_is_a_timeout_row(results, data_root, tmp_path):
    stored = Stored(results)
    proc = dlbench("run", "--campaign", campaign_file(tmp_path, "timeout", "timeout = 6"),
                   "--results", results, "--data-dir", data_root)
    assert proc.returncode == 3, proc.stderr
    rows = stored.new_rows("timeout")
    torch = rows["pytorch"]
    assert torch.status == "timeout" and "time limit of 6 s" in torch.error
    assert torch.timeout_s == 6 and 6 <= torch.wall_time_s < 60
    assert store.trace_path(results, torch.run_id).is_file()
    check_the_caffe_job_went_on(rows, results)


def test_a_job_killed_from_outside_is_a_failed_row(results, data_root, tmp_path):
    import docker

    stored = Stored(results)
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "--campaign", campaign_file(tmp_path, "killed"),
         "--results", results, "--data-dir", data_root],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        client, victim = docker.from_env(), None
        deadline = time.monotonic() + 600
        while victim is None and time.monotonic() < deadline and proc.poll() is None:
            found = client.containers.list(filters={"label": [
                "org.dlbench.framework=pytorch", f"org.dlbench.results={results.resolve()}"]})
            victim = found[0] if found else None
            time.sleep(0.5)
        assert victim is not None, "the pytorch job was never seen running"
        time.sleep(3)                        # well into its setup or training
        victim.kill()                        # docker kill
        _, stderr = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, stderr
    rows = stored.new_rows("killed")
    torch = rows["pytorch"]
    assert torch.status == "failed" and torch.exit_code == 137
    assert torch.error == "the container exited with code 137 (SIGKILL)"
    assert (results / store.JOBS / torch.run_id / "log.txt").is_file()
    check_the_caffe_job_went_on(rows, results)


class GarbageFirst:
    """The real Docker client, except that the first job container it starts runs a
    'runner' that prints garbage, writes an invalid result.json and exits with 0."""

    SCRIPT = ("printf ':::DLBENCH {\"event\": \"epoch\", \"epo\\n'; head -c 2000 /dev/urandom; echo; "
              "printf '{\"schema_version\": 1, \"status\": \"ok\", \"accuracy\": 7' > /out/result.json")

    def __init__(self, client):
        self.client, self.used = client, False

    def __getattr__(self, name):
        return getattr(self.client, name)

    @property
    def containers(self):
        outer = self

        class Containers:
            def __getattr__(self, name):
                return getattr(outer.client.containers, name)

            def run(self, **kwargs):
                if not outer.used:
                    outer.used = True
                    kwargs["entrypoint"] = ["sh", "-c", outer.SCRIPT]
                return outer.client.containers.run(**kwargs)

        return Containers()


def test_a_runner_that_prints_garbage_is_a_no_result_row(results, data_root, tmp_path, monkeypatch):
    stored = Stored(results)
    monkeypatch.setattr(docker_runtime, "docker_client", lambda real=docker_runtime.docker_client(): GarbageFirst(real))
    the_plan = campaign.read(campaign_file(tmp_path, "garbage"), RunOptions()).plan
    records = run.run_plan(the_plan, results, runtimes.make("docker", display=NullDisplay()), data_root)
    assert [r.status for r in records] == ["no_result", "ok"]
    rows = stored.new_rows("garbage")
    torch = rows["pytorch"]
    assert torch.status == "no_result" and torch.error.startswith("result.json is invalid")
    assert torch.exit_code == 0 and pd.isna(torch.accuracy)
    check_the_caffe_job_went_on(rows, results)


def test_a_gpu_job_of_a_framework_without_a_cuda_build_is_an_unsupported_row(
        results, data_root, sources_root, tmp_path, monkeypatch):
    # This host may have no GPU at all: the host check (``execute``, before the job loop)
    # is not reached from run_plan; the plan marks the GPU job unsupported, so no image of
    # it is resolved or built.
    # Every framework has a CUDA build today: Lua Torch7's catalog declares none for this
    # test (its GPU image would take hours to build here); its CPU job trains on 1,000 images.
    monkeypatch.setitem(catalog.models("torch")["variants"], "gpu",
                        {"unsupported": "the Lua Torch7 image is a CPU build"})
    stored = Stored(results)
    path = campaign_file(tmp_path, "gpu", extra='devices = ["gpu:0", "cpu"]\n'
                                              '[hyperparameters.torch]\ntrain_subset = 1000')
    the_plan = campaign.read(path, RunOptions(frameworks=["torch"])).plan
    # Lua Torch7 builds from the pinned source archives: the local mirror, never GitHub
    runtime = runtimes.make("docker", display=NullDisplay(), build=BuildOptions(sources_dir=sources_root))
    records = run.run_plan(the_plan, results, runtime, data_root)
    assert [(r.device, r.status) for r in records] == [("cuda", "unsupported"), ("cpu", "ok")]
    assert records[0].error.startswith("torch has no GPU image: the Lua Torch7 image is a CPU build")
    assert records[0].image == "dlbench/torch:gpu" and records[0].image_id is None
    assert not (results / store.JOBS / records[0].run_id).exists()      # nothing was started
    frame = store.load(results)
    assert sorted(frame.loc[frame["campaign"] == "gpu", "status"]) == ["ok", "unsupported"]
    assert len(row_files(results)) == len(stored.before) + 2


def test_fail_fast_stops_after_the_first_bad_job(results, data_root, tmp_path):
    stored = Stored(results)
    proc = dlbench("run", "--campaign", campaign_file(tmp_path, "fail-fast", "timeout = 3"),
                   "--fail-fast", "--results", results, "--data-dir", data_root)
    assert proc.returncode == 3
    assert "fail-fast: stopping after a job that is timeout; 1 job(s) not run" in proc.stderr
    rows = stored.new_rows("fail-fast")
    assert list(rows) == ["pytorch"] and rows["pytorch"].status == "timeout"


def test_a_host_without_the_gpu_is_still_an_error_before_anything_runs(results, data_root, tmp_path):
    if hostinfo.gpu_count():
        pytest.skip("this host has a GPU")
    before = row_files(results)
    path = campaign_file(tmp_path, "no-gpu", extra='devices = ["gpu:0"]')
    proc = dlbench("run", "--campaign", path, "--results", results, "--data-dir", data_root)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "dlbench: error: --gpu 0: this host has no NVIDIA GPU (no NVIDIA driver)"
    assert row_files(results) == before
