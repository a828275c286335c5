"""The native runtime: the same runner and adapters in a Python of the host, no Docker.

For hosts where Docker is not allowed (many HPC clusters) and to measure what the
container itself costs.  ``--runtime native --python PATH`` runs each job as
``PATH -m dlbench_runner`` with the framework directory of this dlbench, the data
set read in place and the job directory's out/ as its output: the same job spec, the
same result.json, the same row (``runtime`` says ``native``).

What a container gives and a process does not:
    --cpus      pins the process to CPUs 0..N-1 (sched_setaffinity) and sets the
                same thread variables; there is no CPU quota.
    --memory    not applied: a job with a memory limit is stored as ``unsupported``.
    isolation   none: the job runs as the invoking user, with its network and files.
The framework must be importable by that Python; a framework that is not gives
``unsupported`` rows that say so.  The resource trace samples the process and
its children (psutil); the kernel's peak for the job is the process's maximum
resident set (``wait4``'s ru_maxrss).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from .. import catalog, hostinfo, jobdir
from ..errors import UsageError
from ..interrupts import signals_deferred
from ..plan import Job
from . import native_workers
from .traces import summarise
from .base import Outcome, Running, Target, follow_output, gpu_device, split_lines

SAMPLE_INTERVAL_S = 1.0
IMPORT_TIMEOUT_S = 300
CHUNK_BYTES = 1 << 16             # read from the job's output at a time


def runner_dir() -> Path:
    """The folder holding the dlbench_runner package (what PYTHONPATH needs)."""
    from dlbench_runner import contract
    return Path(contract.__file__).resolve().parent.parent


def check_python(python: str) -> str:
    """The interpreter as an absolute path; a one-line error if it cannot be run."""
    found = python if os.sep in python else (shutil.which(python) or python)
    try:
        out = subprocess.run([found, "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--python {python}: cannot run it ({exc})") from None
    if out.returncode != 0:
        raise UsageError(f"--python {python}: it exited with {out.returncode}")
    return str(Path(found).absolute())


class Interpreter:
    """What a framework's jobs run on natively: the interpreter, and whether it can."""

    def __init__(self, python: str, framework: str):
        self.python, self.framework = python, framework
        self.name = f"native:{python}"
        self.version, self.reason = _import_check(python, framework)
        # Identity: the interpreter, the framework's version there, and this dlbench's
        # runner and adapter code, as an image id stands for all three in a container.
        digest = hashlib.sha256(f"{python}\0{self.version}\0".encode())
        for path in sorted(catalog.framework_dir(framework).glob("*")) + \
                sorted((runner_dir() / "dlbench_runner").glob("*.py")):
            if path.is_file():
                digest.update(path.name.encode() + b"\0" + path.read_bytes())
        self.id = "native:" + digest.hexdigest()[:32]


def _import_check(python: str, framework: str) -> tuple[str | None, str | None]:
    """(the framework's version in that Python, None) or (None, why it cannot run)."""
    module, reason = catalog.native_module(framework)
    if reason:
        return None, reason
    code = (f"import {module} as m, sys; "
            "sys.stdout.write(str(getattr(m, '__version__', 'unknown')))")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True,
                             timeout=IMPORT_TIMEOUT_S, env=_quiet_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{python} could not import {framework}: {exc}"
    if out.returncode != 0:
        last = [line for line in out.stderr.strip().splitlines() if line.strip()][-1:] or ["?"]
        return None, f"{framework} is not importable by {python} ({last[0].strip()[:200]})"
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "unknown", None


def _quiet_env() -> dict:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONDONTWRITEBYTECODE": "1"}


def unsupported(target: Target, job: Job) -> str | None:
    """Why the job cannot run natively (stored as an ``unsupported`` row), or None."""
    if target.reason:
        return target.reason
    if job.memory_bytes is not None:
        return "the native runtime cannot limit memory: run it with --runtime docker or without --memory"
    if job.blas is not None:
        return "the native runtime runs on this host's BLAS: run it with --runtime docker or without --blas"
    return None


def run_process(job: Job, python: str, run_id: str, job_id: str, job_dir: Path,
                dataset_path: Path, display, device: str | None = None,
                running: Running | None = None, inputs: dict[str, bytes] | None = None,
                allocation: native_workers.Allocation | None = None) -> Outcome:
    """Run one job as a child process; what it left behind becomes the row as for a
    container.  ``running``: where the runtime keeps its running processes, for ``cancel``;
    ``allocation``: the Slurm nodes a job of workers spans (None: its workers run here;
    ``native_workers`` says how).

    Every path the runner is handed is absolute: it starts in out/, so a relative one (the
    default results folder, ``dlbench-results``; a relative ``DLBENCH_FRAMEWORKS_PATH``)
    would name something inside out/ instead."""
    job_dir = job_dir.absolute()
    log = jobdir.prepare(job_dir, job.spec(run_id, job_id), inputs=inputs)
    env = {**_quiet_env(), **job.thread_environment, "PYTHONUNBUFFERED": "1",
           **({"CUDA_VISIBLE_DEVICES": device} if device is not None else {}),
           "PYTHONPATH": os.pathsep.join([str(runner_dir())] + _absolute_paths(os.environ.get("PYTHONPATH")))}
    cpus = job.cpu_list
    srun = allocation is not None and bool(job.workers)
    with log, _data_folder(job_dir, srun) as data_root:
        # the runner reads DATA/<data set>, as the container's /data/<data set> mount
        os.symlink(dataset_path.resolve(), Path(data_root) / job.dataset)
        argv = [python, "-m", "dlbench_runner", "--framework-dir",
                str(catalog.framework_dir(job.framework).absolute()), "--data", str(data_root),
                "--spec", str(job_dir / "job.json"), "--out", str(job_dir / jobdir.OUT)]
        cwd = job_dir / jobdir.OUT
        begun = hostinfo.mark(cpus)     # the host as the job starts: its noise facts
        started = begun.clock
        process, group, sampler, watchdog, timed_out = None, None, None, None, threading.Event()
        try:
            with signals_deferred():    # never a started process we do not know of
                if not job.workers:
                    process = _start(argv, stdout=subprocess.PIPE, env=env, cwd=cwd, cpus=cpus)
                elif srun:
                    group = native_workers.start_srun(job, argv, env, cwd, job_dir, _start, allocation)
                else:
                    group = native_workers.start_local(job, argv, env, cwd, job_dir, _start)
                if group is not None:
                    process = group.leader
            members = group.processes if group is not None else [process]
            if running is not None:
                for member in members:
                    running.add(member)
            if not srun:                # srun's tasks run on other nodes: nothing to sample here
                sampler = ProcessSampler(process.pid, started, job.gpu).start()
            if job.timeout:
                stop = group.kill if group is not None else functools.partial(_kill_group, process)
                watchdog = threading.Timer(job.timeout, _time_up, (stop, timed_out))
                watchdog.start()
            # read in chunks, not lines: a line is as long as the job makes it
            chunks = iter(functools.partial(process.stdout.read1, CHUNK_BYTES), b"")
            tail = follow_output(split_lines(chunks), log, display)
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            if group is not None:       # the other workers end with worker 0, or are stopped
                group.finish(process.returncode)
            ended = hostinfo.mark(cpus)
            wall = ended.clock - started
        except BaseException:
            if group is not None:
                group.kill()
            elif process is not None:
                _kill_group(process, threading.Event())
            if process is not None:
                process.wait()
            raise
        finally:
            if running is not None and process is not None:
                for member in (group.processes if group is not None else [process]):
                    running.discard(member)
            if watchdog:
                watchdog.cancel()
            if sampler is not None:
                sampler.stop()
    code = process.returncode
    if code < 0:                      # killed by a signal: report it as a shell (and Docker) does
        code = 128 - code
    peak = None if srun else usage.ru_maxrss * 1024     # KiB on Linux
    # out/'s bounds, checked as the Docker runtime checks them when a job ends (a process
    # is not watched while it runs: it can write anywhere the user can, out/ or not)
    if timed_out.is_set():
        error = f"the job ran past its time limit of {job.timeout:g} s" + \
            (f" (all {job.workers} workers stopped)" if job.workers else "")
    else:
        error = (group.error(tail) if group is not None else None) or jobdir.over_limit(job_dir)
    return Outcome(exit_code=code, wall_time_s=wall, log_tail=tail,
                   timed_out=timed_out.is_set(), error=error,
                   samples=sampler.samples if sampler else [],
                   trace=sampler.summary(peak) if sampler else None, ran_as="process",
                   # the process and the descendants it waited for (srun: none of this node's)
                   host_marks=(begun, ended),
                   cpu_time_s=None if srun else _job_cpu_s(usage, group),
                   nodes=(len(allocation.nodes) if srun else 1) if job.workers else None)


def _job_cpu_s(usage, group) -> float | None:
    """The job's CPU seconds: worker 0's process and what it waited for, and the other
    workers' (they are this process's children, not worker 0's)."""
    own = usage.ru_utime + usage.ru_stime
    if group is None:
        return own
    others = group.others_cpu_s()
    return None if others is None else own + others


def _start(argv: list[str], stdout, env: dict, cwd: Path, cpus: list[int] | None) -> subprocess.Popen:
    """One process of the job, in a session of its own (killed as a group), on ``cpus``."""
    return subprocess.Popen(argv, stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, cwd=cwd, start_new_session=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)


@contextlib.contextmanager
def _data_folder(job_dir: Path, shared: bool):
    """Where the data set's link goes: a temporary folder of this host, or, for workers on
    other nodes, one in the job's folder (on the file system the nodes share)."""
    if not shared:
        with tempfile.TemporaryDirectory(prefix="dlbench-data-") as folder:
            yield Path(folder)
        return
    folder = job_dir / "data"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _time_up(stop, flag: threading.Event) -> None:
    flag.set()
    stop()


def _absolute_paths(search_path: str | None) -> list[str]:
    """The entries of a search path (``PYTHONPATH``) as absolute paths: the job starts in
    out/, where a relative entry would name something else (an empty one means the
    current directory: it would be out/ itself)."""
    return [os.path.abspath(p) for p in (search_path or "").split(os.pathsep) if p]


def _kill_group(process: subprocess.Popen, flag: threading.Event) -> None:
    flag.set()
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class ProcessSampler:
    """Samples a process and its children once a second: CPU % (100 = one CPU) and RSS."""

    def __init__(self, pid: int, started: float, gpu: int | None = None, clock=time.perf_counter):
        self.pid, self.started, self.gpu, self.clock = pid, started, gpu, clock
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sampler-{pid}", daemon=True)
        self._cpu: dict[int, float] = {}        # pid -> CPU seconds at the previous sample
        self._last = None

    def start(self) -> "ProcessSampler":
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            try:
                processes = [root] + root.children(recursive=True)
            except psutil.Error:
                return
            now, cpu_seconds, rss = self.clock(), {}, 0
            for proc in processes:
                try:
                    times = proc.cpu_times()
                    cpu_seconds[proc.pid] = times.user + times.system
                    rss += proc.memory_info().rss
                except psutil.Error:
                    continue
            if not rss:
                return
            percent = None
            if self._last is not None:
                used = sum(v - self._cpu.get(pid, 0.0) for pid, v in cpu_seconds.items())
                percent = max(used, 0.0) / (now - self._last) * 100.0
            self._cpu, self._last = cpu_seconds, now
            gpu_util, gpu_memory = hostinfo.gpu_sample(self.gpu) if self.gpu is not None else (None, None)
            self.samples.append({"t_s": round(now - self.started, 3), "cpu_percent": percent,
                                 "memory_bytes": rss, "gpu_util": gpu_util,
                                 "gpu_memory_bytes": gpu_memory, "load_avg": hostinfo.load_average()})

    def summary(self, kernel_peak: int | None = None):
        return summarise(self.samples, kernel_peak, kernel_peak)


__all__ = ["Target", "check_python", "run_process", "unsupported"]


class NativeRuntime:
    """Jobs as processes of a Python on the host."""

    name = "native"
    default_memory = None

    def __init__(self, python: str | None):
        self.python = check_python(python or sys.executable)
        self.running = Running(lambda process: _kill_group(process, threading.Event()))

    def host_facts(self) -> dict:
        return hostinfo.host_facts(None)

    def planned_image(self, job: Job) -> str | None:
        return None                     # a host Python: no image

    def prepare(self, images: list[tuple[str, str]]) -> None:
        pass                            # nothing is built

    def target(self, framework: str, variant: str) -> Target:
        if framework in catalog.TOOLS:      # the platforms' images: no host Python runs them
            return Target(f"native:{framework}", None,
                          error=f"the platforms are deployed in the {framework} image, which needs "
                                "--runtime docker")
        _, release = catalog.unversioned(variant)
        if release is not None:
            return Target(f"native:{framework}-{release}", None,
                          f"{framework} {release} is an image of its own (--versions): run it with "
                          "--runtime docker; the native runtime runs the host Python's")
        found = Interpreter(self.python, framework)
        return Target(found.name, found.id, found.reason)

    def export(self, target: Target, folder: Path, say) -> Path | None:
        return None                     # nothing to ship: each node has its own Python

    def load(self, framework: str, variant: str, target: Target, archive: Path | None,
             say) -> Target:
        """A host Python is checked again here, on the node that runs it: the submitter's
        says nothing of this node's."""
        return self.target(framework, variant)

    def unsupported(self, target: Target, job: Job) -> str | None:
        return unsupported(target, job)

    gpus: list[str] | None = None
    # A job's workers may span the nodes of a Slurm allocation (``allocation``, set by the
    # Slurm task that runs it); a container's stay on one host (runtimes/docker.py).
    spans_nodes = True
    allocation: native_workers.Allocation | None = None

    def run(self, job, target, run_id, job_id, job_dir, dataset_path, display, inputs=None) -> Outcome:
        return run_process(job, self.python, run_id, job_id, job_dir, dataset_path, display,
                           gpu_device(job, self.gpus), self.running, inputs, self.allocation)

    def cancel(self) -> None:
        self.running.cancel()

    def close(self) -> None:
        pass
