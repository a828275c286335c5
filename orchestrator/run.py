"""The job loop: carry out a plan, one job after another, each job's row stored at once.

Every job leaves exactly one row, whatever happens to it (``collect.py`` lists
the statuses); a job that cannot run is stored as ``unsupported`` without starting
it: one the plan marked so (no image of its variant, no GPU version of its model),
before any image is resolved, or one its runtime refuses.  Jobs run one after another, but for GPU jobs on several GPUs: each
GPU's jobs are a lane, and the lanes run side by side, one job on each GPU at a
time (the plan gave each GPU's jobs CPUs of their own).  A bad job never stops the campaign unless ``fail_fast``.  Where a
job runs is the runtime's business (``runtimes/``: Docker containers or host
processes); the Slurm scheduler (``schedulers/slurm.py``) runs this same loop on
each node, one job at a time.  Ctrl-C, SIGTERM or SIGHUP stops and removes the
running job and its job directory; the rows stored so far stay, and ``--resume``
runs only the jobs not yet stored as ok.  A job directory is kept only with its row:
a signal that comes while a job's directory and room for its row are being made, or
while its row is being stored, waits until that is done.
"""

from __future__ import annotations

import concurrent.futures
import threading
import uuid
from pathlib import Path

from . import build, hostinfo, jobdir, runtimes, store
from .collect import collect, unsupported
from .display import NullDisplay
from .errors import DlbenchError, DockerUnavailable, StoreError
from .interrupts import signals_deferred
from .plan import Plan
from .prepare import Targets, prepare
from .runtimes import Outcome, gpu_device


def run_plan(plan: Plan, results: Path, runtime: runtimes.Runtime, data_dir=None, display=None,
             resume: bool = False, fail_fast: bool = False, row_fields: dict | None = None,
             targets: Targets | None = None) -> list:
    """Run every job of the plan with the runtime the caller made; returns the stored rows.

    Each job leaves exactly one row, whatever happened to it; a bad job never stops the
    campaign unless ``fail_fast``.  The setup (``prepare``) resolves each image's target,
    unless ``targets`` are given (a Slurm task: its submitter's).  A Slurm task passes
    ``row_fields`` (node, Slurm ids).  The GPUs the plan names were checked before
    (``execute``: before any download)."""
    display = display or NullDisplay()
    store.check_results(results)
    ready = prepare(plan, results, runtime, data_dir, display, resume, targets)
    provenance_host = dict(runtime.host_facts(), runtime=runtime.name, **(row_fields or {}))
    display.start(len(ready.todo))
    loop = _Loop(results, runtime, ready.targets, ready.data, provenance_host, display, fail_fast,
                 len(ready.todo))
    try:
        alone, lanes = _lanes(ready.todo)
        loop.lane(alone)
        if lanes:
            loop.side_by_side(lanes)
    finally:
        display.stop()
    if store.row_file_count(results) > store.COMPACT_AFTER:
        rows, traces = store.compact(results)
        display.say(f"compacted {rows} row files and {traces} trace files of {results}")
    return loop.records


def _lanes(todo: list) -> tuple[list, list[list]]:
    """The (index, job, job id) triples to run one after another, then the lanes to run
    side by side: with GPU jobs on two GPUs or more, each GPU's jobs are a lane and the
    CPU jobs run first, alone (they would share the CPUs); else every job runs alone, in
    the plan's order, and there are no lanes."""
    numbered = [(index, job, job_id) for index, (job, job_id) in enumerate(todo, 1)]
    gpus = sorted({job.gpu for _, job, _ in numbered if job.gpu is not None})
    if len(gpus) < 2:
        return numbered, []
    return ([t for t in numbered if t[1].gpu is None],
            [[t for t in numbered if t[1].gpu == gpu] for gpu in gpus])


class _Loop:
    """Carries out lanes of jobs, storing each job's row as it ends."""

    def __init__(self, results, runtime, targets, data, provenance_host, display, fail_fast, total):
        self.results, self.runtime, self.targets, self.data = results, runtime, targets, data
        self.provenance_host, self.display, self.fail_fast = provenance_host, display, fail_fast
        self.total = total
        self.records = []
        self.stopping = threading.Event()     # fail-fast: start no more jobs
        self.cancelled = threading.Event()    # interrupted: the running jobs are being stopped
        self.lock = threading.Lock()

    def side_by_side(self, lanes: list[list]) -> None:
        """Every lane at once, each in a thread of its own.  An interrupt, or a lane's
        error, stops every running job (no row for them, as for one job) and is raised
        here once every lane has ended."""
        with concurrent.futures.ThreadPoolExecutor(len(lanes), thread_name_prefix="lane") as pool:
            futures = [pool.submit(self.lane, lane) for lane in lanes]
            try:
                for future in concurrent.futures.as_completed(futures):
                    future.result()
            except BaseException:
                self.cancelled.set()
                self.runtime.cancel()
                concurrent.futures.wait(futures)
                raise

    def lane(self, lane: list) -> None:
        for index, job, job_id in lane:
            if self.stopping.is_set() or self.cancelled.is_set():
                return
            record = self.one(index, job, job_id)
            if record is None:                # stopped by the interrupt: no row
                return
            with self.lock:
                self.records.append(record)
                done = len(self.records)
            self.display.job_finished(record)
            if self.fail_fast and record.status != "ok" and not self.stopping.is_set():
                self.stopping.set()
                if done < self.total:
                    self.display.say(f"fail-fast: stopping after a job that is {record.status}; "
                                     f"{self.total - done} job(s) not run")

    def one(self, index: int, job, job_id: str):
        """One job, to its stored row; None when the run was interrupted meanwhile."""
        runtime = self.runtime
        if job.memory_bytes is None and runtime.default_memory:
            job = job.model_copy(update={"memory_bytes": runtime.default_memory})
        target = self.targets.get((job.framework, job.variant))   # none: planned unsupported
        dataset = self.data[job.dataset]
        run_id = uuid.uuid4().hex[:16]
        self.display.job_started(index, job)
        provenance = dict(self.provenance_host, image=target.name if target else planned_image(job, runtime),
                          image_id=target and target.id, dataset_sha256=dataset.sha256,
                          **hostinfo.gpu_facts(gpu_device(job, runtime.gpus)))
        reason = job.unsupported or runtime.unsupported(target, job)
        rescue = job_dir = None
        handed = False                  # the row went to store_row: stored, or kept to recover
        try:
            with signals_deferred():    # the room for the row and the job directory, or neither
                rescue, job_dir = _prepare(self.results, run_id, index, job_dir=reason is None)
            if reason is None:
                try:
                    outcome = runtime.run(job, target, run_id, job_id, job_dir, dataset.path, self.display)
                except DockerUnavailable:
                    raise
                except DlbenchError as exc:     # Docker refused this job's container
                    outcome = Outcome(exit_code=None, wall_time_s=0.0, log_tail=[], error=str(exc))
                except OSError as exc:          # the host could not write the job's files
                    if exc.errno not in store.DISK_ERRORS:
                        raise
                    outcome = Outcome(exit_code=None, wall_time_s=0.0, log_tail=[],
                                      error=f"dlbench could not write the job's files in {job_dir}: "
                                            f"{exc.strerror}")
                if self.cancelled.is_set():     # another lane's interrupt stopped it
                    jobdir.remove(job_dir)
                    rescue.release()
                    return None
            # A stop signal waits for the row to be stored (milliseconds): one that came
            # while it was written left a job directory without its row.
            with signals_deferred():
                if reason is None:
                    record, samples = collect(job, run_id, job_id, job_dir, outcome, provenance), outcome.samples
                else:
                    record, samples = unsupported(job, run_id, job_id, reason, provenance), []
                handed = True
                store.store_row(self.results, record, samples, rescue)   # or keeps it and says how to recover
        except BaseException:           # interrupted (Ctrl-C, SIGTERM, SIGHUP): no row, no directory
            if rescue is not None:
                rescue.release()        # unless it holds a row kept by store_row
            if job_dir is not None and not handed:
                jobdir.remove(job_dir)
            raise
        return record


def planned_image(job, runtime) -> str | None:
    """The image a job planned unsupported would have run in: a container image's tag;
    None for a runtime without images."""
    return build.image_tag(job.framework, job.variant) if runtime.name == "docker" else None


def _prepare(results: Path, run_id: str, index: int, job_dir: bool) -> tuple[store.Rescue, Path | None]:
    """Before a job: room for its row (``store.Rescue``) and, for a job that will run, its
    directory; a results directory that cannot take them stops the run here, with the
    rows stored so far kept."""
    rescue = None
    try:
        rescue = store.Rescue(results, run_id)
        return rescue, store.job_dir(results, run_id) if job_dir else None
    except OSError as exc:
        if rescue is not None:
            rescue.release()
        raise StoreError(f"{results}: cannot set up job {index}: {exc.strerror}; the rows stored "
                         "so far are kept") from None


