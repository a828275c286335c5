"""A job of several workers in Docker: one hardened container a worker, on a network of the
job's own, ended together.

Each worker is a container of the job's image with the job's spec, started as a job's
container is (``docker.container_options``), but for what makes it one of N
(``dlbench_runner/world.py``):

- a network: an internal bridge network of the job's own (no route out, no other
  container on it; labelled as every container, and removed with them), instead of none;
  worker 0 listens on it at ``PORT`` under its container's name;
- its rank, worker 0's address and every worker's in its environment;
- its share of the job's CPUs: the job's CPU set split evenly where it has a CPU for each
  worker (shared where not), ``--cpus`` divided, the threads divided
  (``contract.worker_threads``), and its share of the memory limit.

Worker 0 is the job's container as the host sees it: its output is the job's log and
display, its resource trace and out/ the job's, its exit the job's.  The other workers'
output goes to ``worker-R.log`` beside the job's log.  The first worker that ends with a
non-zero code ends the job: every other worker is killed at once and the job fails naming
that worker, its exit and the last line it wrote; a job past its time limit is ended so
too, all workers at once.  Whatever happens, every container and the network are removed.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

from dlbench_runner import contract

from .. import hostinfo
from ..errors import docker_errors
from ..interrupts import signals_deferred
from .base import Outcome, Running, exited, follow_output, split_lines
from .containers import OutWatch, kill
from .traces import Sampler

PORT = 29500         # (the workers of a container job share this host: the row's nodes is 1)
LEADER_WAIT_S = 60.0        # how long the others may run on once worker 0 has ended


class _Worker:
    """One started worker: its container, and how it ended."""

    def __init__(self, rank: int, container):
        self.rank, self.container = rank, container
        self.exit_code: int | None = None
        self.last_line: str | None = None


def worker_name(run_id: str, job_id: str, rank: int) -> str:
    return f"dlbench-{run_id[:12]}-{job_id[:12]}-w{rank}"


def worker_options(base: dict, job, rank: int, network: str, leader: str) -> dict:
    """Worker ``rank``'s ``containers.run`` arguments: the job container's (``base``) on the
    job's network, with its rank, worker 0's address and its share of CPUs and memory."""
    size = job.workers
    options = dict(base, name=worker_name(*_ids(base), rank), hostname=worker_name(*_ids(base), rank),
                   network=network, labels=dict(base["labels"], **{_label(base, "worker"): str(rank)}))
    options.pop("network_mode")
    environment = dict(base["environment"])
    environment.update(contract.thread_environment(contract.worker_threads(job.threads, size),
                                                   job.hyperparameters))
    environment.update({contract.WORKER_RANK: str(rank), contract.WORKER_ADDRESS: f"{leader}:{PORT}",
                        contract.WORKER_HOSTS: ",".join(f"{worker_name(*_ids(base), r)}:{PORT}"
                                                        for r in range(size))})
    options["environment"] = environment
    if job.cpus:
        cpus = job.cpu_list
        each = len(cpus) // size
        if each:
            mine = cpus[rank * each:(rank + 1) * each]
            options["cpuset_cpus"] = ",".join(map(str, mine))
        options["nano_cpus"] = job.cpus * 10**9 // size
    if job.memory_bytes:
        options["mem_limit"] = job.memory_bytes // size
    return options


def _label(base: dict, name: str) -> str:
    prefix = next(k for k in base["labels"] if k.endswith(".run-id")).rsplit(".", 1)[0]
    return f"{prefix}.{name}"


def _ids(base: dict) -> tuple[str, str]:
    labels = base["labels"]
    return labels[_label(base, "run-id")], labels[_label(base, "job-id")]


def run_workers(client, job, base: dict, job_dir: Path, display, running: Running | None,
                device_index: int | None, log) -> Outcome:
    """Run the job's workers to their end (``base``: the job container's options, ``log``:
    the job's log, open); see the module's docstring."""
    run_id, job_id = _ids(base)
    timeout = job.timeout
    begun = hostinfo.mark(job.cpu_list)
    started = begun.clock
    workers: list[_Worker] = []
    network, watchdog, sampler, out_watch = None, None, None, None
    companions: list[Sampler] = []
    timed_out, ended = threading.Event(), threading.Event()
    failed: list[_Worker] = []
    lock = threading.Lock()
    followers: list[threading.Thread] = []

    def stop_all(flag: threading.Event) -> None:
        for worker in list(workers):
            kill(worker.container, flag)

    def ended_with(worker: _Worker, code: int | None) -> None:
        worker.exit_code = code
        with lock:
            first = code not in (0, None) and not failed and not ended.is_set()
            if first:
                failed.append(worker)
        if first:
            stop_all(threading.Event())

    def follow_other(worker: _Worker) -> None:
        path = job_dir / f"worker-{worker.rank}.log"
        with contextlib.suppress(Exception):       # a worker killed meanwhile
            with open(path, "w", encoding="utf-8", errors="replace") as other:
                tail = follow_output(split_lines(worker.container.logs(stream=True, follow=True)),
                                     other, _Quiet(), keep=1)
                worker.last_line = tail[-1] if tail else None
        code = None
        with contextlib.suppress(Exception):
            code = worker.container.wait(timeout=LEADER_WAIT_S + (timeout or 24 * 3600)).get("StatusCode")
        ended_with(worker, code)

    try:
        with docker_errors(f"running {job.label}"):
            with signals_deferred():
                network = client.networks.create(
                    worker_name(run_id, job_id, 0)[:-3] + "-net", driver="bridge", internal=True,
                    labels={k: v for k, v in base["labels"].items()} | {_label(base, "role"): "job-network"})
            leader = worker_name(run_id, job_id, 0)
            for rank in range(job.workers):
                with signals_deferred():
                    container = client.containers.run(**worker_options(base, job, rank, network.name, leader))
                    workers.append(_Worker(rank, container))
                if running is not None:
                    running.add(container)
            first = workers[0]
            sampler = Sampler(first.container, started, device_index).start()
            # the others' CPU time is the job's too, not other work beside it (``hostinfo.beside``)
            companions = [Sampler(w.container, started, stream=False).start() for w in workers[1:]]
            out_watch = OutWatch(job_dir, first.container).start()
            if timeout:
                watchdog = threading.Timer(timeout, stop_all, (timed_out,))
                watchdog.start()
            for worker in workers[1:]:
                thread = threading.Thread(target=follow_other, args=(worker,), daemon=True,
                                          name=f"worker-{worker.rank}")
                thread.start()
                followers.append(thread)
            tail = follow_output(split_lines(first.container.logs(stream=True, follow=True)), log, display)
            state = first.container.wait()
            ended_at = hostinfo.mark(job.cpu_list)
            wall = ended_at.clock - started
            first.container.reload()
            oom = bool(first.container.attrs["State"].get("OOMKilled"))
            ended_with(first, state.get("StatusCode"))
            for thread in followers:        # the others end with worker 0, or are stopped
                thread.join(LEADER_WAIT_S)
            with lock:
                ended.set()
            if any(thread.is_alive() for thread in followers):
                stop_all(threading.Event())
        sampler.stop()
        for companion in companions:
            companion.stop()
        out_watch.stop()
        error = None
        if timed_out.is_set():
            error = f"the job ran past its time limit of {timeout:g} s (all {job.workers} workers stopped)"
        elif failed and failed[0].rank != 0:
            error = _worker_failed(failed[0], job.workers)
        elif out_watch.verdict():
            error = out_watch.verdict()
        return Outcome(exit_code=state.get("StatusCode"), wall_time_s=wall, log_tail=tail,
                       oom_killed=oom, timed_out=timed_out.is_set(), error=error,
                       samples=sampler.samples, trace=sampler.summary(), host_marks=(begun, ended_at),
                       cpu_time_s=_cpu_seconds([sampler, *companions]), nodes=1)
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if out_watch is not None:
            out_watch.stop()
        for worker in workers:
            if running is not None:
                running.discard(worker.container)
            with contextlib.suppress(Exception):     # best effort: stale ones are found by label
                worker.container.remove(force=True)
        if network is not None:
            with contextlib.suppress(Exception):
                network.remove()
        if sampler is not None:
            sampler.stop(timeout=2.0)
        for companion in companions:
            companion.stop(timeout=2.0)


def _cpu_seconds(samplers: list[Sampler]) -> float | None:
    """Every worker's CPU seconds together: the job's own; None where one did not tell."""
    each = [s.cpu_seconds() for s in samplers]
    return None if None in each else sum(each)


def _worker_failed(worker: _Worker, size: int) -> str:
    text = f"worker {worker.rank} of {size}: {exited(worker.exit_code)}; the others were stopped"
    if worker.last_line:
        text += f" (its last line: {worker.last_line[:300]})"
    return text


class _Quiet:
    """A display for the other workers' output: their events are not the job's."""

    def event(self, event: dict) -> None:
        pass
