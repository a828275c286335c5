"""Resource traces: what a job's container used, sampled about once a second while it runs.

A ``Sampler`` thread follows Docker's stats stream for the container (the daemon
sends one sample a second) and, for GPU jobs, asks the NVIDIA driver (NVML,
``hostinfo.gpu_sample``) for the GPU's utilisation and memory at each sample.  Each sample holds:

    t_s               seconds since the container was started (host clock)
    cpu_percent       CPU time used since the previous sample, 100 = one CPU busy
    memory_bytes      the container's memory as the kernel charges it (page cache
                      included: the number its --memory limit applies to)
    gpu_util          the GPU's utilisation, percent (the whole GPU, not only this job)
    gpu_memory_bytes  memory used on the GPU (the whole GPU)
    load_avg          the host's 1-minute load average (summarised on the row as the
                      highest, ``host_load_max``; not kept in the trace table)

A second thread reads the kernel's own peak for the container from the host's
cgroup files (v2 ``memory.peak``, v1 ``memory.max_usage_in_bytes``) every 50 ms:
the cgroup is gone as soon as the container exits, so the last value read while
it lived is kept, and a job killed at its memory limit within its first second
(before Docker's first stats sample) still has its peak.  The row's
``memory_peak_bytes`` is the highest of the samples, of the peak Docker reports (v1) and
of the kernel's; ``memory_peak_cgroup_bytes`` is the kernel's alone (samples a second
apart miss a short peak, the more so on a busy host: the kernel's does not).  The same thread
reads the container's CPU time from its cgroup (v2 ``cpu.stat``'s ``usage_usec``, v1
``cpuacct.usage``): the job's own CPU seconds, which the row's ``other_cpu_s`` leaves out of
the host's (``hostinfo.beside``); where the host has no such file, the last stats sample's
cumulative CPU time stands for it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

from ..hostinfo import gpu_sample, load_average

CGROUP_ROOT = Path("/sys/fs/cgroup")
PEAK_FILES = ("memory.peak", "memory.max_usage_in_bytes")   # cgroup v2, v1
CPU_FILES = ("cpu.stat", "cpuacct.usage")                   # cgroup v2 (usage_usec), v1 (ns)
PEAK_INTERVAL_S = 0.05


@dataclasses.dataclass
class Summary:
    """The trace as the row stores it."""

    cpu_percent_mean: float | None = None
    memory_peak_bytes: int | None = None
    memory_peak_cgroup_bytes: int | None = None
    gpu_util_mean: float | None = None
    gpu_memory_peak_bytes: int | None = None
    trace_samples: int = 0
    host_load_max: float | None = None      # the highest load average of the samples


def cpu_percent(stats: dict) -> float | None:
    """CPU use between this stats sample and the previous one, as ``docker stats`` shows it."""
    cpu, pre = stats.get("cpu_stats") or {}, stats.get("precpu_stats") or {}
    total = (cpu.get("cpu_usage") or {}).get("total_usage")
    pre_total = (pre.get("cpu_usage") or {}).get("total_usage")
    system, pre_system = cpu.get("system_cpu_usage"), pre.get("system_cpu_usage")
    if None in (total, pre_total, system) or not pre_system:
        return None             # the stream's first sample has no previous one
    system_delta, cpu_delta = system - pre_system, total - pre_total
    if system_delta <= 0 or cpu_delta < 0:
        return None
    online = cpu.get("online_cpus") or len((cpu.get("cpu_usage") or {}).get("percpu_usage") or []) or 1
    return cpu_delta / system_delta * online * 100.0


def memory_usage(stats: dict) -> tuple[int | None, int | None]:
    """(current usage, the peak Docker reports -- cgroup v1 only) of one stats sample."""
    memory = stats.get("memory_stats") or {}
    return memory.get("usage"), memory.get("max_usage")


def cgroup_peak_file(container_id: str, root: Path = CGROUP_ROOT) -> Path | None:
    """The kernel's peak-memory file of a running container's cgroup, where the host has one.

    Known layouts first (v2 and v1, systemd and cgroupfs drivers), then any folder
    named after the container up to three levels down."""
    return _cgroup_file(container_id, root, ("memory",), PEAK_FILES)


def cgroup_cpu_file(container_id: str, root: Path = CGROUP_ROOT) -> Path | None:
    """The file of a running container's cgroup that counts its CPU time, where the host
    has one: v2's ``cpu.stat``, v1's ``cpuacct.usage`` (its controller mounted alone or
    with cpu); found as ``cgroup_peak_file`` finds the peak."""
    return _cgroup_file(container_id, root, ("cpuacct", "cpu,cpuacct", "cpuacct,cpu"), CPU_FILES)


def _cgroup_file(container_id: str, root: Path, controllers: tuple[str, ...],
                 names: tuple[str, ...]) -> Path | None:
    v1 = [root / c for c in controllers]

    def folders():
        yield from (root / "system.slice" / f"docker-{container_id}.scope", root / "docker" / container_id)
        for base in v1:
            yield from (base / "docker" / container_id, base / "system.slice" / f"docker-{container_id}.scope")
        for pattern in ("*", "*/*", "*/*/*"):
            for base in (root, *v1):
                yield from base.glob(f"{pattern}/*{container_id}*")

    for folder in folders():
        for name in names:
            if (folder / name).is_file():
                return folder / name
    return None


def read_cpu_seconds(path: Path | None) -> float | None:
    """The CPU seconds a cgroup's file counts: ``cpu.stat``'s ``usage_usec`` line (v2),
    ``cpuacct.usage``'s nanoseconds (v1); None where it cannot be read (the cgroup is gone)."""
    if path is None:
        return None
    try:
        text = path.read_text()
        if path.name == "cpu.stat":
            usec = next(int(line.split()[1]) for line in text.splitlines()
                        if line.startswith("usage_usec "))
            return usec / 1e6
        return int(text.split()[0]) / 1e9
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def stats_cpu_seconds(stats: dict) -> float | None:
    """The container's CPU seconds so far, as a stats sample counts them (nanoseconds)."""
    total = ((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
    return total / 1e9 if total else None


def read_int(path: Path | None) -> int | None:
    if path is None:
        return None
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class Sampler:
    """Samples a running container in a thread; ``stop()`` then ``samples`` and ``summary()``."""

    def __init__(self, container, started: float, gpu: int | None = None,
                 clock=time.perf_counter, cgroup_root: Path = CGROUP_ROOT, stream: bool = True):
        """``stream``: follow Docker's stats stream too (False: the cgroup's files alone, for
        a container whose CPU time is counted but whose trace is not kept: a job's other
        workers)."""
        self.container, self.started, self.gpu, self.clock = container, started, gpu, clock
        self.stream = stream
        self.cgroup_root = cgroup_root
        self.samples: list[dict] = []
        self.docker_peak: int | None = None
        self.cgroup_peak: int | None = None
        self.cgroup_cpu_s: float | None = None      # the last value read while the cgroup lived
        self.stats_cpu_s: float | None = None       # the last stats sample's
        self.error: str | None = None
        self._peak_file: Path | None = None
        self._cpu_file: Path | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()       # samples are taken by stop() and not added after
        self._thread = threading.Thread(target=self._run, name=f"sampler-{container.short_id}",
                                        daemon=True)
        self._peak_thread = threading.Thread(target=self._watch_peak, daemon=True,
                                             name=f"peak-{container.short_id}")

    def start(self) -> "Sampler":
        self._peak_file = cgroup_peak_file(self.container.id, self.cgroup_root)
        self._cpu_file = cgroup_cpu_file(self.container.id, self.cgroup_root)
        self._read_cgroup()
        if self.stream:
            self._thread.start()
        if self._peak_file is not None or self._cpu_file is not None:
            self._peak_thread.start()
        return self

    def cpu_seconds(self) -> float | None:
        """The container's own CPU seconds, once it has exited: its cgroup's count as last
        read (every 50 ms), else the last stats sample's; None where neither told."""
        return self.cgroup_cpu_s if self.cgroup_cpu_s is not None else self.stats_cpu_s

    def stop(self, timeout: float = 10.0) -> None:
        """After the container has exited: the samples so far are the trace.

        Docker ends a stopped container's stats stream only at its next tick, up to a
        second later, with an empty sample that is not kept anyway; rather than wait for
        it, the stream's thread is left to end on its own (the container's removal ends
        it) and adds nothing more: it is not waited for at all."""
        with self._lock:
            self._stop.set()
        if self._peak_thread.is_alive():
            self._peak_thread.join(timeout)

    def _read_cgroup(self) -> bool:
        """Whether the cgroup is still there: one of its files could be read."""
        peak, cpu = read_int(self._peak_file), read_cpu_seconds(self._cpu_file)
        if peak is not None:
            self.cgroup_peak = max(peak, self.cgroup_peak or 0)
        if cpu is not None:
            self.cgroup_cpu_s = max(cpu, self.cgroup_cpu_s or 0.0)
        return peak is not None or cpu is not None

    def _watch_peak(self) -> None:
        """Until the cgroup is gone (or the job is over)."""
        while self._read_cgroup() and not self._stop.wait(PEAK_INTERVAL_S):
            pass

    def _run(self) -> None:
        try:
            for stats in self.container.stats(stream=True, decode=True):
                if self._stop.is_set():
                    break
                self._add(stats)
        except Exception as exc:  # noqa: BLE001 - a trace is never worth a job
            self.error = f"{type(exc).__name__}: {exc}"

    def _add(self, stats: dict) -> None:
        usage, peak = memory_usage(stats)
        if not usage or str(stats.get("read", "")).startswith("0001"):
            return              # a stopped container's empty sample
        gpu_util, gpu_memory = gpu_sample(self.gpu) if self.gpu is not None else (None, None)
        sample = {"t_s": round(self.clock() - self.started, 3), "cpu_percent": cpu_percent(stats),
                  "memory_bytes": int(usage), "gpu_util": gpu_util, "gpu_memory_bytes": gpu_memory,
                  "load_avg": load_average()}
        with self._lock:
            if self._stop.is_set():
                return
            if peak:
                self.docker_peak = max(peak, self.docker_peak or 0)
            self.stats_cpu_s = stats_cpu_seconds(stats) or self.stats_cpu_s
            self.samples.append(sample)

    def summary(self) -> Summary:
        return summarise(self.samples, self.docker_peak, self.cgroup_peak)


def summarise(samples: list[dict], docker_peak: int | None = None,
              cgroup_peak: int | None = None) -> Summary:
    def values(key):
        return [s[key] for s in samples if s.get(key) is not None]

    cpu, memory, util, gpu_memory, load = (values(k) for k in ("cpu_percent", "memory_bytes", "gpu_util",
                                                               "gpu_memory_bytes", "load_avg"))
    peaks = memory + [peak for peak in (docker_peak, cgroup_peak) if peak]
    return Summary(cpu_percent_mean=sum(cpu) / len(cpu) if cpu else None,
                   memory_peak_bytes=max(peaks) if peaks else None,
                   memory_peak_cgroup_bytes=cgroup_peak,
                   gpu_util_mean=sum(util) / len(util) if util else None,
                   gpu_memory_peak_bytes=max(gpu_memory) if gpu_memory else None,
                   trace_samples=len(samples), host_load_max=max(load) if load else None)
