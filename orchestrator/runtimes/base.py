"""What every runtime shares: the target a framework's jobs run on, what the host saw of a
job (``Outcome``), following a job's output, and the ``Runtime`` protocol a runtime
implements.  The job loop (``run.py``), ``execute`` and the schedulers see runtimes only
through this protocol.

    class Runtime(Protocol):
        name: str                        # docker or native, stored in every row (``runtime``)
        default_memory: int | None       # the memory limit a job gets without --memory
        def host_facts(self) -> dict     # the host's provenance, on every row
        def planned_image(job) -> str | None               # the image a job would run in,
                                         # stored for one planned unsupported (None: no images)
        def prepare(images)              # before any build: what building the (framework,
                                         # variant) images needs (Docker: the source archives)
        def target(framework, variant) -> Target          # build or find what jobs run on
        # optional: targets(images) -> iterator of ((framework, variant), Target), each
        # yielded as soon as it is ready (the Docker runtime builds images side by side)
        def export(target, folder, say) -> Path | None     # the target as a file under folder,
                                         # for other nodes (docker save); None: nothing to ship
        def load(framework, variant, target, archive, say) -> Target   # on another node: the
                                         # target a submitter resolved (and exported to
                                         # archive), as this node's
        def unsupported(target, job) -> str | None         # why a job cannot run, if it cannot
        def run(job, target, run_id, job_id, job_dir, dataset_path, display, inputs) -> Outcome
                                         # inputs: the files the job finds beside its spec
        def cancel(self)                 # stop every job it is running and every build in
                                         # flight (from another thread)
        def close(self)                  # give back what it holds (a lock, a client)
        gpus: list[str] | None           # GPUs a scheduler assigned, that job indices select
        spans_nodes: bool                # a job's workers can run on several nodes (a Slurm
                                         # scheduler then gives it one a worker)
        allocation                       # those nodes (``native_workers.Allocation``), set by
                                         # the Slurm task that runs the job; None: this host

Docker containers (``docker.py``) and host processes (``native.py``) are the two
runtimes, found by name in ``RUNTIMES`` (``__init__.py``); the Slurm scheduler
(``schedulers/slurm.py``) runs the same loop on each node with either, shipping each
target with ``export`` and ``load`` (the Docker runtime saves and loads its images; a
host Python has nothing to ship and is checked again on the node that runs it).
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from dlbench_runner.contract import EVENT_TAG

if TYPE_CHECKING:       # the CLI lists RUNTIMES before anything imports pydantic (plan.py)
    from ..plan import Job
    from .traces import Summary

LOG_TAIL_LINES = 50
MAX_LOG_BYTES = 64 << 20     # log.txt keeps this much of a job's output
MAX_LINE_CHARS = 10_000      # a log-tail line is cut here
MAX_LINE_BYTES = 1 << 20     # a longer line of a job's output without a newline is split


@dataclasses.dataclass(frozen=True)
class Target:
    """What a framework's jobs run on, as plain values: an image (or a host Python), its
    identity, and why it cannot run them, if it cannot."""

    name: str                     # the image tag, or native:PYTHON
    id: str | None                # the image id: part of every job's identity
    reason: str | None = None     # set: the jobs are stored as unsupported
    error: str | None = None      # set: it could not be made (its build failed, in these
                                  # words); the jobs are stored as failed, never started


@dataclasses.dataclass
class Outcome:
    """What the host saw of a job's container."""

    exit_code: int | None
    wall_time_s: float
    log_tail: list[str]
    oom_killed: bool = False
    timed_out: bool = False
    error: str | None = None        # the host's own reason, when it has one
    samples: list[dict] = dataclasses.field(default_factory=list)   # the resource trace
    trace: Summary | None = None
    ran_as: str = "container"       # or "process" (the native runtime), for messages
    builds_alongside: int = 0       # image builds of this dlbench that ran at any point beside it
    # the host as the job started and ended (``hostinfo.mark``: load, busy CPU seconds), and
    # the job's own CPU seconds (its container's cgroup, its process tree's): the row's
    # noise facts (``hostinfo.beside``)
    host_marks: tuple | None = None
    cpu_time_s: float | None = None
    nodes: int | None = None        # a job of workers: the hosts they ran on

def split_lines(chunks, limit: int = MAX_LINE_BYTES):
    """A job's output, as chunks of bytes in (a container's log stream, a process's pipe),
    as lines of text out; a line longer than ``limit`` bytes is split, so a job printing
    gigabytes without a newline never makes the host hold them at once."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        while len(buffer) > limit:
            lines.append(buffer[:limit])
            buffer = buffer[limit:]
        for line in lines:
            yield line.decode("utf-8", "replace").rstrip("\r")
    if buffer:
        yield buffer.decode("utf-8", "replace")


def follow_output(lines, log, display, keep: int = LOG_TAIL_LINES,
                  limit: int = MAX_LOG_BYTES) -> list[str]:
    """The job's output as it comes: every line to its log file (``log``, open for
    writing, closed here; at most ``limit`` bytes of it), the runner's event
    lines to the display; returns the last ``keep`` other lines (the row's log tail)."""
    tail = deque(maxlen=keep)
    written, cut = 0, False
    with log:
        for line in lines:
            if not cut:
                size = len(line.encode("utf-8", "replace")) + 1
                cut = written + size > limit
                log.write(f"[dlbench: the log stops here: over {limit} bytes]\n" if cut else line + "\n")
                written += size
            if line.startswith(EVENT_TAG):
                display.event(_event(line))
            elif line.strip():
                tail.append(line[:MAX_LINE_CHARS])
    return list(tail)


def _event(line: str) -> dict:
    try:
        event = json.loads(line[len(EVENT_TAG):])
        return event if isinstance(event, dict) else {}
    except ValueError:
        return {}


def exited(code: int | None, ran_as: str = "container") -> str:
    """How a container or process ended, in words: its exit code, and the signal that killed it."""
    text = f"the {ran_as} exited with code {code}"
    if code is not None and code > 128:
        try:
            text += f" ({signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return text


def gpu_device(job: Job, gpus: list[str] | None) -> str | None:
    """The device a GPU job runs on: the GPU its index names, or, where a scheduler gave
    the job a GPU of its own (Slurm's ``SLURM_JOB_GPUS``, one per task), that one."""
    if job.gpu is None:
        return None
    return gpus[0] if gpus else str(job.gpu)


class Running:
    """What a runtime has started and not yet seen end (containers, processes), so that
    ``cancel`` can stop them from another thread; one that starts after the cancel is
    stopped as it is added."""

    def __init__(self, stop):
        self._stop = stop
        self._lock = threading.Lock()
        self._items: set = set()
        self.cancelled = False

    def add(self, item) -> None:
        with self._lock:
            self._items.add(item)
            cancelled = self.cancelled
        if cancelled:
            self._stop(item)

    def discard(self, item) -> None:
        with self._lock:
            self._items.discard(item)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            items = list(self._items)
        for item in items:
            self._stop(item)


class Runtime(Protocol):
    name: str
    default_memory: int | None
    gpus: list[str] | None          # the GPUs a scheduler assigned; None: the host's own
    spans_nodes: bool               # a job's workers can run one a node of an allocation
    allocation: object | None       # that allocation (``native_workers.Allocation``), or None

    def host_facts(self) -> dict: ...

    def planned_image(self, job: Job) -> str | None: ...

    def prepare(self, images: list[tuple[str, str]]) -> None: ...

    def target(self, framework: str, variant: str) -> Target: ...

    def export(self, target: Target, folder: Path, say) -> Path | None: ...

    def load(self, framework: str, variant: str, target: Target, archive: Path | None,
             say) -> Target: ...

    def unsupported(self, target: Target, job: Job) -> str | None: ...

    def run(self, job: Job, target: Target, run_id: str, job_id: str, job_dir, dataset_path,
            display, inputs: dict[str, bytes] | None = None) -> Outcome: ...

    def cancel(self) -> None: ...

    def close(self) -> None: ...
