"""Resource traces: samples from Docker's stats stream (and NVML), stored as a second
Parquet table and summarised on the row; the row's peak memory checked against the
kernel's own accounting for the container."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from conftest import dlbench
from orchestrator import store
from orchestrator.runtimes import traces
from orchestrator.schema import TRACE_SCHEMA

FIXTURES = Path(__file__).parent / "fixtures"


# -- without Docker ----------------------------------------------------------------------------
def test_cpu_and_memory_of_real_stats_samples():
    """Three samples the daemon sent (cgroup v1) for a busy loop pinned to one shared CPU."""
    first, second, third = json.loads((FIXTURES / "docker-stats-cgroup-v1.json").read_text())
    assert traces.cpu_percent(first) is None            # no previous sample yet
    assert traces.cpu_percent(second) == pytest.approx(25.1472, abs=1e-3)
    assert traces.cpu_percent(third) == pytest.approx(22.0200, abs=1e-3)
    assert traces.memory_usage(second) == (62439424, 62439424)
    cgroup_v2 = {"memory_stats": {"usage": 1000, "stats": {}}, "cpu_stats": {}, "precpu_stats": {}}
    assert traces.memory_usage(cgroup_v2) == (1000, None)
    assert traces.cpu_percent(cgroup_v2) is None


@pytest.mark.parametrize("layout, name", [
    ("system.slice/docker-{id}.scope", "memory.peak"),            # cgroup v2, systemd driver
    ("docker/{id}", "memory.peak"),                               # cgroup v2, cgroupfs driver
    ("memory/docker/{id}", "memory.max_usage_in_bytes"),          # cgroup v1, cgroupfs driver
    ("memory/system.slice/docker-{id}.scope", "memory.max_usage_in_bytes"),   # v1, systemd
    ("kubepods.slice/pod1/cri-containerd-{id}.scope", "memory.peak"),          # elsewhere
])
def test_the_kernels_peak_file_is_found_for_each_cgroup_layout(tmp_path, layout, name):
    cid = "ab12" * 16
    folder = tmp_path / layout.format(id=cid)
    folder.mkdir(parents=True)
    (folder / name).write_text("123456\n")
    (tmp_path / "unified" / "docker" / cid).mkdir(parents=True)    # hybrid: no memory files there
    found = traces.cgroup_peak_file(cid, tmp_path)
    assert found == folder / name and traces.read_int(found) == 123456
    assert traces.cgroup_peak_file("cd34" * 16, tmp_path) is None


def test_summary_of_a_trace():
    samples = [{"t_s": 0.3, "cpu_percent": None, "memory_bytes": 100, "gpu_util": None, "gpu_memory_bytes": None},
               {"t_s": 1.3, "cpu_percent": 80.0, "memory_bytes": 300, "gpu_util": 50.0, "gpu_memory_bytes": 7},
               {"t_s": 2.3, "cpu_percent": 100.0, "memory_bytes": 200, "gpu_util": 70.0, "gpu_memory_bytes": 9}]
    summary = traces.summarise(samples, docker_peak=None, cgroup_peak=310)
    assert (summary.cpu_percent_mean, summary.memory_peak_bytes, summary.memory_peak_cgroup_bytes,
            summary.gpu_util_mean, summary.gpu_memory_peak_bytes, summary.trace_samples) == \
        (90.0, 310, 310, 60.0, 9, 3)        # the kernel's peak, above every sample
    assert traces.summarise(samples, docker_peak=305).memory_peak_bytes == 305
    empty = traces.summarise([])
    assert empty.memory_peak_bytes is None and empty.trace_samples == 0


def test_traces_are_one_parquet_file_per_job_that_pandas_reads(tmp_path):
    rows = [{"t_s": 1.0, "cpu_percent": 50.0, "memory_bytes": 10, "gpu_util": None, "gpu_memory_bytes": None}]
    store.write_trace(tmp_path, "run-a", rows * 3)
    store.write_trace(tmp_path, "run-b", [])                 # a job that died at once
    assert sorted(p.name for p in (tmp_path / store.TRACES).iterdir()) == ["run-a.parquet", "run-b.parquet"]
    frame = store.load_traces(tmp_path)
    assert list(frame.columns) == ["run_id", "t_s", "cpu_percent", "memory_bytes", "gpu_util",
                                   "gpu_memory_bytes"]
    assert list(frame.run_id) == ["run-a"] * 3
    assert len(pd.read_parquet(tmp_path / store.TRACES)) == 3
    assert pq.read_schema(store.trace_path(tmp_path, "run-a")).metadata == TRACE_SCHEMA.metadata
    assert len(store.load_traces(tmp_path, ["run-b", "missing"])) == 0


# -- a real job --------------------------------------------------------------------------------
@pytest.mark.docker
def test_a_job_leaves_a_trace_and_the_kernel_agrees_with_its_peak_memory(tmp_path, data_root):
    results = tmp_path / "results"
    dlbench("run", "--frameworks", "caffe", "--datasets", "mnist", "--profile", "quick",
            "--set", "max_iter=200", "--cpus", "1", "--name", "traced",
            "--results", results, "--data-dir", data_root, check=True)
    row = store.load(results).iloc[0]
    assert row.status == "ok" and row.campaign == "traced"
    trace = pd.read_parquet(store.trace_path(results, row.run_id))
    assert list(trace.columns) == list(TRACE_SCHEMA.names)
    assert set(trace.run_id) == {row.run_id} and len(trace) == row.trace_samples
    # about one sample a second while the container ran
    assert trace.t_s.is_monotonic_increasing and trace.t_s.iloc[-1] <= row.wall_time_s
    assert len(trace) >= row.wall_time_s / 4 and trace.t_s.diff().median() < 4
    # CPU: pinned to one CPU with a quota of one, so at most about 100 %
    assert 0 < row.cpu_percent_mean <= 110 and trace.cpu_percent.max() <= 130
    assert trace.gpu_util.isna().all() and pd.isna(row.gpu_util_mean)   # a CPU job
    # memory: the row's peak against the kernel's, read from the host's cgroup files
    kernel, peak, sampled = row.memory_peak_cgroup_bytes, row.memory_peak_bytes, trace.memory_bytes.max()
    print(f"peak memory: row {peak} B, kernel {kernel} B, highest sample {sampled} B")
    assert kernel > 50 * 2**20
    # the row's peak: the kernel's, which no sample a second apart exceeds by more than the
    # kernel's own rounding; the samples miss short peaks (more so on a busy host)
    assert peak == max(kernel, sampled) and sampled <= 1.01 * kernel
    assert 0.5 * kernel <= sampled


@pytest.mark.docker
def test_a_sampler_without_the_stats_stream_still_counts_the_containers_cpu_time(build_image):
    """A job's other workers are sampled for their CPU time alone (their cgroup's files, no
    stats stream): a container that burns one CPU second is counted as about one, after it
    has exited and its cgroup is gone."""
    import time

    import docker

    build_image("pytorch")              # any framework's build leaves the base image
    client = docker.from_env()
    burn = "import time\nwhile time.process_time() < 1.0: pass"
    container = client.containers.run("dlbench/base:bullseye", ["python3", "-c", burn], detach=True,
                                      labels={"dlbench.test": "traces"})
    try:
        sampler = traces.Sampler(container, time.perf_counter(), stream=False).start()
        assert container.wait(timeout=60)["StatusCode"] == 0
        sampler.stop()
    finally:
        container.remove(force=True)
    assert sampler.samples == []
    assert 0.9 <= sampler.cpu_seconds() < 3.0, sampler.cpu_seconds()
