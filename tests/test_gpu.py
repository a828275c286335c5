"""GPU jobs side by side: `--gpu 0,1,...` plans every job on each GPU, each GPU's jobs on a
CPU set of their own, and the job loop runs the GPUs' lanes at once, one job on each GPU
at a time, with rows, clean-up and interrupts as for one job.

This host may have no GPU.  The planning and the errors need none.  The side-by-side
tests run real quick Caffe containers in the lanes with the GPU left out (a stand-in
runtime: the CPU image, no device request, the CPU device in the job's spec), which is
the one thing a GPU-less host cannot give them; everything else is the real loop: the
threads, the CPU sets, the rows, the interrupt.  ``test_side_by_side_on_real_gpus`` runs
the same on real GPUs where Docker sees two or more.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import docker
import pandas as pd
import pytest

from conftest import dlbench
from orchestrator import build, catalog, hostinfo, interrupts, plan, run, runtimes, store
from orchestrator.report import paper
from orchestrator.display import NullDisplay
from orchestrator.options import Axes, RunOptions, merge
from orchestrator.runtimes import docker as docker_runtime

NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def axes_of(options: dict) -> Axes:
    """The axes of ``dlbench run`` given these options, as the command line fills them."""
    return merge(Axes(), RunOptions.from_command_line(**options))


def test_a_gpu_list_runs_every_job_on_each_gpu_on_cpus_of_its_own():
    jobs = plan.expand(axes_of(dict(frameworks="caffe,pytorch", datasets="mnist", gpu="0,1,2,3")), 8).jobs
    assert len(jobs) == 8
    by_gpu = {}
    for job in jobs:
        by_gpu.setdefault(job.gpu, set()).add((job.cpuset, job.threads, job.cpus))
    assert by_gpu == {0: {("0-1", 2, 2)}, 1: {("2-3", 2, 2)}, 2: {("4-5", 2, 2)}, 3: {("6-7", 2, 2)}}
    # --cpus gives each GPU's jobs that many, still disjoint; CPU jobs keep theirs
    jobs = plan.expand(axes_of(dict(frameworks="caffe", datasets="mnist", cpus=3,
                                    devices="cpu,gpu:0,gpu:1")), 8).jobs
    assert [(j.gpu, j.cpuset, j.threads) for j in jobs] == [(None, "0-2", 3), (0, "0-2", 3), (1, "3-5", 3)]
    # where a job's CPUs are is not what it is: the same job id on another share
    one, = plan.expand(axes_of(dict(frameworks="caffe", datasets="mnist", gpu="1", cpus=2)), 8).jobs
    assert one.first_cpu == 0 and one.job_id("i", "d") == jobs[2].model_copy(
        update={"cpus": 2, "threads": 2}).job_id("i", "d")
    # one GPU: as before, no limit unless asked
    single, = plan.expand(axes_of(dict(frameworks="caffe", datasets="mnist", gpu="0")), 8).jobs
    assert (single.cpus, single.cpuset, single.threads) == (None, None, 8)


def test_a_device_is_gpu_n_on_the_command_line_an_index_in_the_plan_and_cuda_in_the_spec():
    from dlbench_runner import contract
    from orchestrator import options

    cpu, gpu = plan.expand(axes_of(dict(frameworks="caffe", datasets="mnist", devices="cpu,gpu:1")), 4).jobs
    assert [options.device(d) for d in ("cpu", "gpu:1")] == [None, 1] == [cpu.gpu, gpu.gpu]
    assert [j.spec("r", "j")["device"] for j in (cpu, gpu)] == ["cpu", "cuda"] == list(contract.DEVICES)
    # the runner: the spec's device, or one given by hand with its index
    assert [contract.gpu_index(d) for d in ("cpu", "cuda", "cuda:1")] == [None, 0, 1]
    for wrong in ("gpu:1", "cuda:x"):
        with pytest.raises(contract.SpecError, match="use cpu, cuda or cuda:N"):
            contract.gpu_index(wrong)
    with pytest.raises(ValueError, match='a device is "cpu" or "gpu:N"'):
        options.device("cuda:1")


def test_gpu_lists_that_cannot_be_planned_are_one_line_errors():
    def error(*args, host=None):
        proc = dlbench("run", "--frameworks", "caffe", "--datasets", "mnist", *args, "--dry-run", env=NO_DOCKER)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        return proc.stderr.removeprefix("dlbench: error: ").strip()

    cpus = os.cpu_count()
    assert error("--gpu", ",".join(map(str, range(cpus + 1)))) == \
        f"{cpus + 1} GPUs side by side need 1 CPUs each, {cpus + 1} in all; this host has {cpus}"
    assert error("--gpu", "0,x") == "--gpu takes comma-separated numbers, not '0,x'"
    assert error("--gpu", ",") == "--gpu takes GPU indices, e.g. 0 or 0,1"
    assert error("--gpu", "0", "--devices", "cpu") == "give --gpu or --devices, not both"
    assert error("--gpu", "0,-1").startswith("--gpu -1: a GPU index is 0 or more")


def test_the_dry_run_shows_the_lanes_and_a_gpu_less_host_refuses_to_run(tmp_path, data_root):
    proc = dlbench("run", "--frameworks", "caffe,torch", "--gpu", "0,1", "--dry-run", "--format", "json", env=NO_DOCKER, check=True)
    jobs = [json.loads(line) for line in proc.stdout.splitlines()]
    share = max(os.cpu_count() // 2, 1)
    assert [(j["framework"], j["dataset"], j["gpu"], j["first_cpu"], j["cpus"]) for j in jobs] == [
        (fw, ds, gpu, gpu * share, share) for fw in ("caffe", "torch") for ds in ("mnist", "cifar10")
        for gpu in (0, 1)]
    if hostinfo.gpu_count():
        pytest.skip("this host has a GPU")
    # as a new user would: no local source mirror, nothing cached; the missing GPU is said
    # before Lua Torch7's sources are fetched (here, with no GitHub, that would be the error)
    cache = tmp_path / "cache"
    for gpus in ("0", "0,1"):
        proc = dlbench("run", "--frameworks", "caffe,torch", "--gpu", gpus, "--results", tmp_path / "r",
                       "--data-dir", data_root, env={**NO_DOCKER, "XDG_CACHE_HOME": str(cache)})
        assert proc.returncode == 1 and proc.stderr == \
            "dlbench: error: --gpu 0: this host has no NVIDIA GPU (no NVIDIA driver)\n"
        assert not (tmp_path / "r" / store.JOBS).exists() or not any((tmp_path / "r" / store.JOBS).iterdir())
        assert not (cache / "dlbench" / "sources").exists()


# -- a model without a GPU version ---------------------------------------------------------
class GivenAGpu:
    """A runtime stand-in for a host whose scheduler gave it a GPU (this one has none) and
    whose framework images exist: any job it is asked to start fails the test."""
    name, default_memory, gpus = "docker", None, ["0"]

    def host_facts(self):
        return hostinfo.host_facts(None)

    def planned_image(self, job):
        return build.image_tag(job.framework, job.variant)

    def target(self, framework, variant):
        return runtimes.Target(build.image_tag(framework, variant), "sha256:" + "0" * 64)

    def unsupported(self, target, job):
        return target.reason

    def run(self, job, *args):
        raise AssertionError(f"started {job.framework}/{job.dataset} on a GPU")

    def cancel(self):
        pass

    def close(self):
        pass


class NoImages(GivenAGpu):
    """... and that must not be asked for any image."""

    def target(self, framework, variant):
        raise AssertionError(f"resolved the image of {framework}:{variant}")


def test_a_model_without_a_gpu_version_is_stored_unsupported_without_any_image(
        tmp_path, data_root, monkeypatch):
    """A model that declares no GPU version (``gpu_unsupported`` in models.json) has its GPU
    jobs planned unsupported: each is a row, stored without resolving or building an image."""
    monkeypatch.setitem(catalog.models("torch")["models"]["cifar10"], "gpu_unsupported",
                        "a layer the GPU library lacks")
    axes = axes_of(dict(frameworks="torch", datasets="cifar10", profile="quick", gpu="0"))
    the_plan = plan.expand(axes, 2)
    assert the_plan.images == []
    records = run.run_plan(the_plan, tmp_path / "r", NoImages(), data_root)
    assert [(r.status, r.device) for r in records] == [("unsupported", "cuda")]
    assert records[0].error == "torch's cifar10 model has no GPU version: a layer the GPU library lacks"
    assert (records[0].image, records[0].image_id) == ("dlbench/torch:gpu", None)
    assert store.load(tmp_path / "r")["status"].tolist() == ["unsupported"]


def test_torch7s_cifar10_script_runs_on_a_gpu_as_a_reconstruction():
    """cunn has no SpatialConvolutionMap: the harness computes the script's Maps as masked
    full convolutions on a GPU (tested in test_torch7.py), so its GPU job is planned to run
    and the paper's cell says its program is a reconstruction."""
    job, = plan.expand(axes_of(dict(frameworks="torch", datasets="cifar10", gpu="0")), 2).jobs
    assert job.unsupported is None and job.variant == "gpu"
    note = paper.reference().cell("torch", "cifar10", "cuda")["note"]
    assert "reconstruction" in note and "masked" in note


# -- side by side, for real -----------------------------------------------------------------
QUICK = {"max_iter": 200, "test_batch_size": 500}


class WithoutTheGpu(docker_runtime.DockerRuntime):
    """The real Docker runtime, but a GPU job runs in the CPU image on the CPU (its CPU set
    and everything else as planned): the stand-in for a GPU this host does not have."""

    def targets(self, images):
        for (framework, _), target in super().targets(sorted({(fw, "cpu") for fw, _ in images})):
            for key in images:
                if key[0] == framework:
                    yield key, target

    def run(self, job, target, run_id, job_id, job_dir, dataset_path, display, inputs=None):
        on_cpu = job.model_copy(update={"gpu": None})
        return super().run(on_cpu, target, run_id, job_id, job_dir, dataset_path, display)


def two_gpu_plan(repeats=1) -> plan.Plan:
    axes = axes_of(dict(frameworks="caffe", datasets="mnist", profile="quick", gpu="0,1",
                        set_=[f"{k}={v}" for k, v in QUICK.items()], repeats=repeats))
    return plan.expand(axes, 2)


class Watch:
    """The job containers of one owner seen running, and their CPU sets, polled from Docker
    (another dlbench's jobs on the same daemon are not counted)."""

    def __init__(self, client, owner: str):
        self.client, self.owner, self.seen, self.most = client, owner, {}, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.2):
            running = self.client.containers.list(
                filters={"label": [f"{build.LABEL}.role=job", f"{build.LABEL}.owner={self.owner}"]},
                ignore_removed=True)
            self.most = max(self.most, len(running))
            for c in running:
                self.seen[c.name] = c.attrs["HostConfig"]["CpusetCpus"]

    def stop(self):
        self._stop.set()
        self._thread.join()


@pytest.mark.docker
def test_gpu_lanes_run_side_by_side_on_disjoint_cpus(tmp_path, data_root, build_image):
    build_image("caffe")
    runtime = WithoutTheGpu(NullDisplay())
    watch = Watch(runtime.client, runtime.owner.token)
    started = time.perf_counter()
    try:
        records = run.run_plan(two_gpu_plan(repeats=2), tmp_path / "r", runtime, data_root)
    finally:
        watch.stop()
    wall = time.perf_counter() - started
    assert [r.status for r in records] == ["ok"] * 4, [r.error for r in records]
    assert watch.most == 2                                     # two at once, never more
    assert sorted(set(watch.seen.values())) == ["0", "1"]      # each lane on its own CPU
    assert sorted((r.gpu, r.cpuset, r.threads, r.repeat) for r in records) == [
        ("0", "0", 1, 0), ("0", "0", 1, 1), ("1", "1", 1, 0), ("1", "1", 1, 1)]
    assert wall < sum(r.wall_time_s for r in records)          # they overlapped
    frame = store.load(tmp_path / "r")
    assert len(frame) == 4 and set(frame["status"]) == {"ok"}
    assert {p.name for p in (tmp_path / "r" / store.JOBS).iterdir()} == {r.run_id for r in records}


@pytest.mark.docker
def test_an_interrupt_stops_every_lane_and_keeps_what_was_stored(tmp_path, data_root, build_image):
    build_image("caffe")
    runtime = WithoutTheGpu(NullDisplay())
    client = docker.from_env()
    owner = runtime.owner.token

    def interrupt_when_both_run():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            mine = client.containers.list(filters={"label": f"{build.LABEL}.owner={owner}"})
            if len(mine) == 2:
                time.sleep(2)
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.2)

    previous = {s: signal.getsignal(s) for s in interrupts.STOP_SIGNALS}
    interrupts.install()
    interrupts.received.clear()
    threading.Thread(target=interrupt_when_both_run, daemon=True).start()
    try:
        with pytest.raises(interrupts.Interrupted):
            run.run_plan(two_gpu_plan(), tmp_path / "r", runtime, data_root)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        interrupts.received.clear()
    assert client.containers.list(all=True, filters={"label": f"{build.LABEL}.owner={owner}"}) == []
    assert not (tmp_path / "r" / store.JOBS).exists() or not any((tmp_path / "r" / store.JOBS).iterdir())
    assert store.row_files(tmp_path / "r") == []                # no row for a stopped job


@pytest.mark.docker
@pytest.mark.gpu
def test_side_by_side_on_real_gpus(tmp_path, data_root):
    count = hostinfo.gpu_count() or 0
    if count < 2:
        pytest.skip("needs two NVIDIA GPUs that Docker can use")
    proc = dlbench("run", "--frameworks", "pytorch", "--datasets", "mnist", "--profile", "quick",
                   "--gpu", "0,1", "--results", tmp_path / "r", "--data-dir", data_root, check=True)
    frame = pd.read_parquet(tmp_path / "r" / "runs")
    assert sorted(frame["gpu"]) == ["0", "1"] and set(frame["status"]) == {"ok"}, proc.stderr
    assert frame["cpuset"].nunique() == 2


def test_the_gpu_facts_of_a_row_come_from_the_driver():
    assert hostinfo.gpu_facts(None) == {}                      # a CPU job has none
    facts = hostinfo.gpu_facts("0")
    if not hostinfo.gpu_count():
        assert facts == {"gpu_name": None, "gpu_driver": None, "gpu_memory_total_bytes": None}
        assert hostinfo.gpu_sample("0") == (None, None)
        return
    assert facts["gpu_name"] and facts["gpu_driver"] and facts["gpu_memory_total_bytes"] > 2**30
    util, used = hostinfo.gpu_sample("0")
    assert 0 <= util <= 100 and 0 < used <= facts["gpu_memory_total_bytes"]


def test_variant_gpu_runs_cpu_jobs_in_the_gpu_images(tmp_path):
    proc = dlbench("run", "--frameworks", "caffe,pytorch", "--datasets", "mnist", "--variant", "gpu",
                   "--dry-run", "--format", "json", env=NO_DOCKER, check=True)
    jobs = [plan.Job.model_validate_json(line) for line in proc.stdout.splitlines()]
    assert [(j.device, j.variant) for j in jobs] == [("cpu", "gpu"), ("cpu", "gpu")]
    default, = plan.expand(axes_of(dict(frameworks="caffe", datasets="mnist")), 2).jobs
    gpu, = plan.expand(axes_of(dict(frameworks="caffe", datasets="mnist", gpu="0")), 2).jobs
    assert (default.variant, gpu.variant) == ("cpu", "gpu")
    assert jobs[0].job_id("i", "d") != default.job_id("i", "d")
    path = tmp_path / "c.toml"
    path.write_text('name = "in-gpu-images"\nframeworks = ["caffe"]\ndatasets = ["mnist"]\n'
                    'devices = ["cpu", "gpu:0"]\nvariant = "gpu"\n')
    proc = dlbench("run", "--campaign", path, "--dry-run", "--format", "json", env=NO_DOCKER, check=True)
    assert [json.loads(line)["image_variant"] for line in proc.stdout.splitlines()] == ["gpu", "gpu"]
    proc = dlbench("run", "--campaign", path, "--variant", "cpu", "--dry-run", env=NO_DOCKER)
    assert proc.returncode == 2 and proc.stderr == (
        "dlbench: error: --variant cpu: the CPU images cannot run GPU jobs (the gpu images run both)\n")
    path.write_text('name = "x"\nvariant = "tpu"\n')
    proc = dlbench("run", "--campaign", path, "--dry-run", env=NO_DOCKER)
    assert proc.returncode == 2 and proc.stderr == \
        f"dlbench: error: {path}:2: variant: --variant 'tpu': choose from cpu, gpu\n"
