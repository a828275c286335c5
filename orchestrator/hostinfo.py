"""Facts about the host, recorded beside every result (pyperf-style metadata)."""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import socket
import threading
import time
from pathlib import Path

from dlbench_runner import contract

from .errors import GpuError

cpu_model = functools.lru_cache(maxsize=None)(contract.cpu_model)


def memory_gb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 2)
    except OSError:
        pass
    return None


def host_facts(docker_version: str | None) -> dict:
    return {"host_name": socket.gethostname(), "host_cpu_model": cpu_model(),
            "host_cpus": os.cpu_count(), "host_memory_gb": memory_gb(),
            "host_os": f"{platform.system()} {platform.release()}",
            "docker_version": docker_version, **timing_facts()}


# -- what makes timings unstable (pyperf records the same) -------------------------------------
SYS_CPU = Path("/sys/devices/system/cpu")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_governor(cpu_dir: Path = SYS_CPU) -> str | None:
    """The CPU frequency governor (``performance``, ``powersave``, ...), the CPUs' different
    ones comma-separated; None where the kernel shows no cpufreq (most VMs and containers)."""
    governors = {_read(path) for path in cpu_dir.glob("cpu[0-9]*/cpufreq/scaling_governor")}
    return ",".join(sorted(g for g in governors if g)) or None


def turbo(cpu_dir: Path = SYS_CPU) -> bool | None:
    """Whether turbo boost is on: intel_pstate's ``no_turbo``, else cpufreq's ``boost``;
    None where neither is there."""
    no_turbo = _read(cpu_dir / "intel_pstate" / "no_turbo")
    if no_turbo in ("0", "1"):
        return no_turbo == "0"
    boost = _read(cpu_dir / "cpufreq" / "boost")
    if boost in ("0", "1"):
        return boost == "1"
    return None


def isolated_cpus(cpu_dir: Path = SYS_CPU) -> str | None:
    """The CPUs kept from the scheduler (``isolcpus=``) as the kernel lists them, e.g. "2-3";
    "" for none; None where the file is missing."""
    return _read(cpu_dir / "isolated")


def load_average() -> float | None:
    """The 1-minute load average."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


# -- what else ran beside a job ---------------------------------------------------------------
# The load average of the run's start says little of a job that starts half an hour later, or
# beside image builds that began after it: each job's row has its own facts, from two marks
# (``mark``) its runtime takes as the job starts and ends, and the trace's samples between.
PROC_STAT = Path("/proc/stat")
# /proc/stat's "cpu" line (every CPU) and "cpuN" lines (one each): user nice system idle
# iowait irq softirq steal guest guest_nice.  Busy is what the kernel spent on processes and
# interrupts; not idle, iowait (idle while waiting for a disk), steal (time the hypervisor
# gave another machine), nor guest and guest_nice (already counted in user and nice).
BUSY_FIELDS = (0, 1, 2, 5, 6)


def busy_cpu_seconds(stat: Path = PROC_STAT, cpus: list[int] | None = None) -> float | None:
    """CPU seconds the host's CPUs (or only ``cpus``, by number) have been busy since boot,
    all processes together (from ``/proc/stat``, in clock ticks); None where there is no
    such file (not Linux) or it lacks one of them."""
    names = ["cpu"] if cpus is None else [f"cpu{n}" for n in cpus]
    try:
        with open(stat) as f:
            lines = {fields[0]: fields[1:] for fields in map(str.split, f) if fields}
        ticks = [int(lines[name][i]) for name in names for i in BUSY_FIELDS]
    except (OSError, ValueError, IndexError, KeyError):
        return None
    return sum(ticks) / os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class Mark:
    """The host at one moment of a job: what its noise facts are differences of."""

    clock: float                # time.perf_counter()
    load: float | None          # the 1-minute load average
    busy_s: float | None        # busy_cpu_seconds() of the CPUs the job may run on
    own_s: float                # this dlbench's own CPU seconds: it follows the job, and is
                                # not work beside it
    cpus: int | None = None     # how many CPUs busy_s counts: the job's pinned ones; None: all


def mark(cpus: list[int] | None = None, stat: Path = PROC_STAT) -> Mark:
    """The host now, its busy time counted on ``cpus`` (a job pinned to them: work on the
    others does not take its CPUs) or on every CPU."""
    return Mark(time.perf_counter(), load_average(), busy_cpu_seconds(stat, cpus), time.process_time(),
                len(cpus) if cpus else None)


def beside(start: Mark, end: Mark, job_cpu_s: float | None, load_max: float | None = None,
           cpus: int | None = None) -> dict:
    """A job's noise facts as row columns, between the marks its runtime took as it started
    and ended: the load average at each (``host_load_avg`` is the start's), the highest the
    trace saw between them (``load_max``), and the CPU seconds other processes used
    meanwhile: the busy seconds of the CPUs the job may run on less the job's own
    (``job_cpu_s``: its container's cgroup, its process tree's) and, where those are every
    CPU, dlbench's (it runs anywhere), as a share of those CPUs' seconds (wall time times
    their number: the pinned ones', else ``cpus``, the host's).  The two are measured apart (a cgroup file read up to 50 ms
    before the end, /proc/stat's ticks of 10 ms), so a quiet host's difference can fall a
    little below 0, and a busy host's share a little above 1: they are stored as 0 and 1.
    Unknown where the host or the job's own CPU time does not tell."""
    loads = [v for v in (start.load, end.load, load_max) if v is not None]
    facts = {"host_load_avg": start.load, "host_load_end": end.load,
             "host_load_max": max(loads) if loads else None,
             "other_cpu_s": None, "other_cpu_share": None}
    cpus = start.cpus or cpus or os.cpu_count()
    wall = end.clock - start.clock
    if start.busy_s is None or end.busy_s is None or job_cpu_s is None or wall <= 0 or not cpus:
        return facts
    own = end.own_s - start.own_s if start.cpus is None else 0.0
    other = max(end.busy_s - start.busy_s - job_cpu_s - own, 0.0)
    facts.update(other_cpu_s=round(other, 3), other_cpu_share=round(min(other / (wall * cpus), 1.0), 4))
    return facts


def timing_facts(cpu_dir: Path = SYS_CPU) -> dict:
    """The host facts that make timings unstable, as row columns; unknown ones are None.
    The load average here is the moment's: each job's row has its own (``beside``)."""
    return {"host_cpu_governor": cpu_governor(cpu_dir), "host_turbo": turbo(cpu_dir),
            "host_load_avg": load_average(), "host_isolated_cpus": isolated_cpus(cpu_dir)}


# -- GPUs -------------------------------------------------------------------------------------
# -- NVIDIA GPUs, through NVML (the driver's library, by nvidia-ml-py) --------------------------
_nvml_lock = threading.Lock()
_nvml_state: list = []          # [pynvml] once initialised, [None] where there is no driver


def nvml():
    """pynvml, initialised once; None where the NVIDIA driver's NVML cannot be loaded."""
    with _nvml_lock:
        if not _nvml_state:
            try:
                import pynvml
                pynvml.nvmlInit()
                _nvml_state.append(pynvml)
            except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
                _nvml_state.append(None)
        return _nvml_state[0]


def _handle(lib, device: str):
    """The NVML handle of a GPU named by its index (as Docker and Slurm name it) or UUID."""
    if str(device).isdigit():
        return lib.nvmlDeviceGetHandleByIndex(int(device))
    return lib.nvmlDeviceGetHandleByUUID(str(device))


def gpu_count() -> int | None:
    """GPUs the NVIDIA driver sees on this host; None without a driver."""
    lib = nvml()
    if lib is None:
        return None
    try:
        return lib.nvmlDeviceGetCount()
    except lib.NVMLError:
        return None


def gpu_facts(device: str | None) -> dict:
    """The row's facts of the GPU a job ran on: its model, the driver, its memory; empty
    for a CPU job, Nones where NVML does not tell."""
    if device is None:
        return {}
    facts = {"gpu_name": None, "gpu_driver": None, "gpu_memory_total_bytes": None}
    lib = nvml()
    if lib is None:
        return facts
    try:
        handle = _handle(lib, device)
        facts["gpu_driver"] = _text(lib.nvmlSystemGetDriverVersion())
        facts["gpu_name"] = _text(lib.nvmlDeviceGetName(handle))
        facts["gpu_memory_total_bytes"] = int(lib.nvmlDeviceGetMemoryInfo(handle).total)
    except lib.NVMLError:
        pass
    return facts


def gpu_sample(device) -> tuple[float | None, int | None]:
    """(utilisation %, memory used in bytes) of the whole GPU, now; Nones where NVML does
    not tell."""
    lib = nvml()
    if lib is None:
        return None, None
    try:
        handle = _handle(lib, device)
        util = lib.nvmlDeviceGetUtilizationRates(handle).gpu
        used = lib.nvmlDeviceGetMemoryInfo(handle).used
    except lib.NVMLError:
        return None, None
    return float(util), int(used)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def check_gpu(gpu: int | None) -> None:
    if gpu is None:
        return
    count = gpu_count()
    if not count:
        raise GpuError(f"--gpu {gpu}: this host has no NVIDIA GPU (no NVIDIA driver)")
    if gpu >= count:
        raise GpuError(f"--gpu {gpu}: no such GPU; this host has {count} (0-{count - 1})")
