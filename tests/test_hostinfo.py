"""Host facts that make timings unstable: read from /sys as the kernel lays it out, stored in
every row, and turned into doctor's warnings; what else ran beside each job (its load
average, other processes' CPU time from /proc/stat less its own) and the noise rule that
reads them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pyarrow as pa
import pytest

from conftest import REPO, dlbench, quiet_host
from orchestrator import doctor, hostinfo
from orchestrator.runtimes import traces
from orchestrator.report import noise
from orchestrator.records import RunRecord
from orchestrator.schema import ADDED_IN, ARROW_SCHEMA

FIXTURES = Path(__file__).parent / "fixtures"
HOG_INTERVAL_S = 0.2


def sysfs(root: Path, files: dict[str, str]) -> Path:
    """A /sys/devices/system/cpu tree holding these files."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    return root


@pytest.mark.parametrize("files, expected", [
    ({"cpu0/cpufreq/scaling_governor": "performance", "cpu1/cpufreq/scaling_governor": "performance",
      "intel_pstate/no_turbo": "1", "isolated": "2-3"},
     {"host_cpu_governor": "performance", "host_turbo": False, "host_isolated_cpus": "2-3"}),
    ({"cpu0/cpufreq/scaling_governor": "powersave", "cpu1/cpufreq/scaling_governor": "performance",
      "intel_pstate/no_turbo": "0", "isolated": ""},
     {"host_cpu_governor": "performance,powersave", "host_turbo": True, "host_isolated_cpus": ""}),
    ({"cpu0/cpufreq/scaling_governor": "schedutil", "cpufreq/boost": "1"},       # AMD: cpufreq/boost
     {"host_cpu_governor": "schedutil", "host_turbo": True, "host_isolated_cpus": None}),
    ({"cpufreq/boost": "0"}, {"host_cpu_governor": None, "host_turbo": False, "host_isolated_cpus": None}),
    ({}, {"host_cpu_governor": None, "host_turbo": None, "host_isolated_cpus": None}),  # a VM, a container
])
def test_timing_facts_as_the_kernel_shows_them(tmp_path, files, expected):
    facts = hostinfo.timing_facts(sysfs(tmp_path / "cpu", files))
    assert {k: facts[k] for k in expected} == expected
    assert isinstance(facts["host_load_avg"], float) and facts["host_load_avg"] >= 0


def test_every_row_has_the_timing_facts_and_older_rows_have_them_empty():
    assert set(hostinfo.timing_facts()) <= set(ADDED_IN[4])
    for name in hostinfo.timing_facts():
        assert name in RunRecord.model_fields and ARROW_SCHEMA.field(name).nullable
    assert ARROW_SCHEMA.field("host_turbo").type == pa.bool_()
    assert set(hostinfo.timing_facts()) <= set(hostinfo.host_facts(None))


def statuses(facts: dict, cpus: int) -> dict:
    return {name: (status, detail) for name, status, detail in doctor.timing(facts, cpus)}


def test_doctor_warns_of_what_makes_timings_unstable():
    steady = statuses({"host_cpu_governor": "performance", "host_turbo": False, "host_load_avg": 0.4,
                       "host_isolated_cpus": "2-3"}, 2)
    assert {name: s for name, (s, _) in steady.items()} == {
        "CPU governor": "ok", "turbo boost": "ok", "load average": "ok", "isolated CPUs": "note"}
    assert steady["isolated CPUs"][1] == "2-3"
    shaky = statuses({"host_cpu_governor": "powersave", "host_turbo": True, "host_load_avg": 1.01,
                      "host_isolated_cpus": ""}, 2)
    assert {name: s for name, (s, _) in shaky.items()} == {
        "CPU governor": "warn", "turbo boost": "warn", "load average": "warn", "isolated CPUs": "note"}
    assert shaky["load average"][1].startswith("1.01 with 2 CPUs: other work is running")
    assert shaky["CPU governor"][1].startswith("powersave: the clock follows the load")
    unknown = statuses({"host_cpu_governor": None, "host_turbo": None, "host_load_avg": None,
                        "host_isolated_cpus": None}, 2)
    assert {s for s, _ in unknown.values()} == {"note"}      # unknown is never an error


# -- what else ran beside a job: each job's own load and other processes' CPU time -------------
def proc_stat(path: Path, *cpus: tuple[int, ...]) -> Path:
    """A /proc/stat as the kernel writes it (clock ticks): each CPU's user, nice, system,
    idle, iowait, irq, softirq and steal (guest times 0), and their sums first."""
    total = [sum(column) for column in zip(*cpus)]
    lines = [f"cpu  {' '.join(map(str, total))} 0 0"] + [f"cpu{n} {' '.join(map(str, c))} 0 0"
                                                        for n, c in enumerate(cpus)]
    path.write_text("\n".join(lines) + "\nintr 123 0 0\nctxt 4567\nbtime 1764290000\nprocesses 890\n")
    return path


def test_busy_cpu_seconds_count_processes_and_interrupts_not_idle_iowait_or_steal(tmp_path):
    tick = os.sysconf("SC_CLK_TCK")
    #                                user nice system idle   iowait irq softirq steal
    stat = proc_stat(tmp_path / "stat", (1000, 50, 300, 90_000, 700, 20, 30, 400),
                     (200, 0, 100, 95_000, 10, 5, 5, 400))
    assert hostinfo.busy_cpu_seconds(stat) == pytest.approx((1400 + 310) / tick)
    assert hostinfo.busy_cpu_seconds(stat, [1]) == pytest.approx(310 / tick)      # a job pinned to CPU 1
    assert hostinfo.busy_cpu_seconds(stat, [0, 1]) == hostinfo.busy_cpu_seconds(stat)
    assert hostinfo.busy_cpu_seconds(stat, [2]) is None                           # no such CPU
    (tmp_path / "odd").write_text("intr 1 2 3\n")
    assert hostinfo.busy_cpu_seconds(tmp_path / "odd") is None
    assert hostinfo.busy_cpu_seconds(tmp_path / "missing") is None


def test_the_hosts_busy_time_counts_this_process_spinning():
    """The real /proc/stat: the busy seconds of every CPU, and of the one CPU this process is
    pinned to, grow at least by the CPU time it spends (less a tick either end), whatever
    else runs."""
    allowed = os.sched_getaffinity(0)
    cpu = min(allowed)
    os.sched_setaffinity(0, {cpu})
    try:
        before, on_it, own = hostinfo.busy_cpu_seconds(), hostinfo.busy_cpu_seconds(cpus=[cpu]), time.process_time()
        while time.process_time() - own < 0.5:
            pass
        spent = time.process_time() - own
        tick = 1 / os.sysconf("SC_CLK_TCK")
        assert hostinfo.busy_cpu_seconds(cpus=[cpu]) - on_it >= spent - 2 * tick
        assert hostinfo.busy_cpu_seconds() - before >= spent - 2 * tick
    finally:
        os.sched_setaffinity(0, allowed)


def mark(clock, load, busy, own=0.0, cpus=None) -> hostinfo.Mark:
    return hostinfo.Mark(clock=clock, load=load, busy_s=busy, own_s=own, cpus=cpus)


def test_a_jobs_noise_facts_are_differences_of_its_two_marks():
    start, end = mark(100.0, 0.6, 5000.0, own=2.0), mark(110.0, 3.1, 5016.0, own=2.5)
    # 10 s on 4 CPUs: 16 busy seconds, the job's 9.5 and dlbench's 0.5: 6 s of other work
    facts = hostinfo.beside(start, end, job_cpu_s=9.5, load_max=3.4, cpus=4)
    assert facts == {"host_load_avg": 0.6, "host_load_end": 3.1, "host_load_max": 3.4,
                     "other_cpu_s": 6.0, "other_cpu_share": 0.15}
    assert set(facts) <= set(RunRecord.model_fields) and set(facts) - {"host_load_avg"} <= set(ADDED_IN[13])
    # measured apart, a quiet host's difference can fall below 0: stored as 0
    assert hostinfo.beside(start, end, 15.8, cpus=4)["other_cpu_s"] == 0.0
    # and a busy host's share can pass 1 (all of 2 CPUs for 1 s, read a tick late): stored as 1
    assert hostinfo.beside(mark(0.0, 2.0, 10.0), mark(1.0, 2.0, 12.01), 0.0, cpus=2)["other_cpu_share"] == 1.0
    # the load's highest is the marks' where the trace saw less, or nothing
    assert hostinfo.beside(start, end, 9.5, load_max=None, cpus=4)["host_load_max"] == 3.1
    # a job pinned to 2 of the 4 CPUs: their busy time, over their seconds; dlbench's own is
    # not taken from it (it runs on any CPU)
    pinned = hostinfo.beside(mark(100.0, 0.6, 700.0, own=2.0, cpus=2), mark(110.0, 3.1, 712.0, own=2.5),
                             job_cpu_s=9.5, cpus=4)
    assert (pinned["other_cpu_s"], pinned["other_cpu_share"]) == (2.5, 0.125)
    # unknown where the job's own CPU time or the host's busy time is
    for unknown in (hostinfo.beside(start, end, None, cpus=4),
                    hostinfo.beside(mark(100.0, 0.6, None), mark(110.0, 3.1, None), 9.5, cpus=4)):
        assert unknown["other_cpu_s"] is None and unknown["other_cpu_share"] is None
        assert unknown["host_load_end"] == 3.1


@pytest.mark.parametrize("layout, name, text, seconds", [
    ("system.slice/docker-{id}.scope", "cpu.stat", "usage_usec 2500000\nuser_usec 2000000\n", 2.5),  # v2
    ("docker/{id}", "cpu.stat", "usage_usec 750\n", 0.00075),                       # v2, cgroupfs driver
    ("cpuacct/docker/{id}", "cpuacct.usage", "3250000000\n", 3.25),                 # v1, cgroupfs driver
    ("cpu,cpuacct/system.slice/docker-{id}.scope", "cpuacct.usage", "1000000000\n", 1.0),  # v1, systemd
])
def test_a_containers_own_cpu_time_is_read_from_its_cgroup(tmp_path, layout, name, text, seconds):
    cid = "ef56" * 16
    folder = tmp_path / layout.format(id=cid)
    folder.mkdir(parents=True)
    (folder / name).write_text(text)
    (tmp_path / "memory" / "docker" / cid).mkdir(parents=True)      # v1: no CPU files there
    found = traces.cgroup_cpu_file(cid, tmp_path)
    assert found == folder / name and traces.read_cpu_seconds(found) == pytest.approx(seconds)
    assert traces.cgroup_cpu_file("0a0b" * 16, tmp_path) is None
    folder.joinpath(name).unlink()                                  # the container has exited
    assert traces.read_cpu_seconds(found) is None


def test_without_a_cgroup_file_dockers_stats_count_the_containers_cpu_time():
    first, second, _ = json.loads((FIXTURES / "docker-stats-cgroup-v1.json").read_text())
    assert traces.stats_cpu_seconds(second) == second["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9 > 0
    assert traces.stats_cpu_seconds({"cpu_stats": {}}) is None


def test_the_trace_keeps_the_highest_load_it_saw():
    samples = [{"t_s": 1.0, "memory_bytes": 10, "load_avg": 0.7}, {"t_s": 2.0, "memory_bytes": 10, "load_avg": 2.9},
               {"t_s": 3.0, "memory_bytes": 10, "load_avg": None}]
    assert traces.summarise(samples).host_load_max == 2.9
    assert traces.summarise([]).host_load_max is None


def noise_rows(**columns) -> pd.DataFrame:
    """Ok rows of distinct jobs (no group of two), with these columns."""
    n = len(next(iter(columns.values())))
    return pd.DataFrame({"status": ["ok"] * n, "framework": [f"fw{i}" for i in range(n)],
                         "train_time_s": [10.0] * n, "host_cpus": [2] * n, **columns})


def test_other_processes_cpu_time_marks_a_run_disturbed_with_its_loads():
    rows = noise_rows(other_cpu_share=[0.41, 0.05, None, None], host_load_avg=[0.61, 6.3, 6.3, 0.4],
                      host_load_end=[2.3, 6.0, None, None], host_load_max=[2.45, 6.5, None, None])
    why = noise.reasons(rows, ["framework"]).tolist()
    assert why[0] == ("other processes used 41% of the 2 CPUs while it ran "
                      "(load 0.61 at start, at end 2.30, at most 2.45)")
    # where the share was measured, a start's load (a job before it lingers in it) is no judge
    assert why[1] == ""
    # rows before schema version 13 measured no share: their load at the run's start decides
    assert why[2] == "load 6.30 at start on 2 CPUs" and why[3] == ""
    assert f"more than {noise.OTHER_SHARE:.0%} of the CPUs it could run on" in noise.RULE
    pinned = noise.reasons(noise_rows(other_cpu_share=[0.3], cpus=[1.0]), ["framework"]).tolist()
    assert pinned == ["other processes used 30% of the 1 CPU it was pinned to while it ran"]


@pytest.mark.training
def test_a_job_beside_busy_processes_has_its_own_load_and_other_cpu_time(data_root, tmp_path):
    """The same real job (the example framework's quick MNIST, natively in this Python) twice
    into one results folder: first as it is, then with busy processes started between the
    two.  Each row has its own load average (not the run's); the second's other processes'
    CPU time holds at least what the busy processes used while it ran (psutil counts theirs
    apart), its share of the CPUs at least theirs, and the report says why it is
    disturbed.  How far the share rises depends on what else ran (``quiet_host`` waits for a
    quiet host first, which a shared machine's tests never give): what is held is the busy
    processes' own time inside it."""
    results, cpus = tmp_path / "results", os.cpu_count() or 1

    def run():
        dlbench("run", "--frameworks", "sklearn", "--datasets", "mnist", "--profile", "quick",
                "--results", results, "--data-dir", data_root, "--runtime", "native", "--python",
                sys.executable, env={"DLBENCH_FRAMEWORKS_PATH": str(REPO / "examples" / "frameworks")},
                check=True)
        return pd.read_parquet(results / "runs").sort_values("recorded_at").iloc[-1]

    quiet_host()
    quiet = run()
    hogs = [psutil.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4 * cpus)]
    used, stop = [], threading.Event()      # (time, the busy processes' CPU seconds so far)

    def follow():
        while not stop.wait(HOG_INTERVAL_S):
            used.append((time.time(), sum(sum(hog.cpu_times()[:2]) for hog in hogs)))
    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        deadline = time.monotonic() + 120       # until the load average shows them
        while os.getloadavg()[0] < quiet["host_load_max"] + 1 and time.monotonic() < deadline:
            time.sleep(1)
        hogged = run()
    finally:
        stop.set()
        follower.join()
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert quiet["status"] == hogged["status"] == "ok"
    assert hogged["host_load_avg"] > quiet["host_load_max"]
    assert hogged["host_load_max"] >= max(hogged["host_load_avg"], hogged["host_load_end"])
    # the runner's span lies inside the job's: what they used in it is a floor, less what
    # they may have used within a sample of either end
    first, last = hogged["started_at"].timestamp(), hogged["finished_at"].timestamp()
    inside = [seconds for at, seconds in used if first <= at <= last]
    assert len(inside) > 2 and inside[-1] > inside[0]
    assert hogged["other_cpu_s"] >= inside[-1] - inside[0] - 2 * HOG_INTERVAL_S * cpus
    assert hogged["other_cpu_s"] == pytest.approx(hogged["other_cpu_share"] * hogged["wall_time_s"] * cpus,
                                                  rel=0.05)
    assert hogged["other_cpu_share"] > noise.OTHER_SHARE
    # the busy processes' own share of the CPUs over the job's span (psutil's count, apart
    # from the sampler's) is in the job's other share, whatever else ran: on a quiet host
    # they take what was free, on a busy one (CI's other lane) from that work as much as from
    # the job, so the share need not rise against the first job's by any fixed amount
    hog_share = (inside[-1] - inside[0]) / (hogged["wall_time_s"] * cpus)
    assert hogged["other_cpu_share"] >= hog_share - 2 * HOG_INTERVAL_S / hogged["wall_time_s"]
    frame = pd.read_parquet(results / "runs")
    why = dict(zip(frame["run_id"], noise.reasons(frame, ["framework"])))
    assert f"other processes used {hogged['other_cpu_share']:.0%} of the {cpus} CPUs" in why[hogged["run_id"]]
