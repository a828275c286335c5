"""The job loop: carry out a plan, one job after another, each job's row stored at once.

Every job leaves exactly one row, whatever happens to it (``collect.py`` lists
the statuses); a job that cannot run is stored as ``unsupported`` without starting
it: one the plan marked so (no image of its variant, no GPU version of its model),
before any image is resolved, or one its runtime refuses.  The targets (images) are
resolved in a thread of their own while jobs run (``_Queue``): a job starts as soon as
its own image is ready, the first in the plan's order among those ready, so the first
rows come while other images still build; a job whose image could not be built is
stored as ``failed`` with the build's error, never started, and the others go on.  Jobs
run one after another, but for GPU jobs on several GPUs: each
GPU's jobs are a lane, and the lanes run side by side, one job on each GPU at a
time (the plan gave each GPU's jobs CPUs of their own).  A bad job never stops the campaign unless ``fail_fast``.  Where a
job runs is the runtime's business (``runtimes/``: Docker containers or host
processes); the Slurm scheduler (``schedulers/slurm.py``) runs this same loop on
each node, one job at a time.  Ctrl-C, SIGTERM or SIGHUP stops and removes the
running job and its job directory, and stops the builds in flight; the rows stored so far stay, and ``--resume``
runs only the jobs not yet stored as ok.  A job directory is kept only with its row:
a signal that comes while a job's directory and room for its row are being made, or
while its row is being stored, waits until that is done.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import functools
import threading
import uuid
from pathlib import Path

from . import checks, hostinfo, jobdir, runtimes, store
from .collect import Collected, collect, failed, unsupported
from .display import NullDisplay
from .errors import DlbenchError, DockerUnavailable, StoreError
from .interrupts import signals_deferred
from .plan import Plan
from .prepare import Prepared, Targets, prepare, resumed, stream
from .runtimes import Outcome, gpu_device


def run_plan(plan: Plan, results: Path, runtime: runtimes.Runtime, data_dir=None, display=None,
             resume: bool = False, fail_fast: bool = False, row_fields: dict | None = None,
             targets: Targets | None = None) -> list:
    """Run every job of the plan with the runtime the caller made; returns the stored rows.

    Each job leaves exactly one row, whatever happened to it; a bad job never stops the
    campaign unless ``fail_fast``.  The setup (``prepare``) verifies the data; each image's
    target is resolved while the jobs run (``prepare.stream``), unless ``targets`` are given
    (a Slurm task: its submitter's).  A Slurm task passes ``row_fields`` (node, Slurm ids).
    The GPUs the plan names were checked before (``execute``: before any download)."""
    display = display or NullDisplay()
    store.check_results(results, make=False)      # nothing made before the data are checked
    ready = prepare(plan, results, data_dir, display, resume)
    store.check_results(results)
    provenance_host = dict(runtime.host_facts(), runtime=runtime.name, **(row_fields or {}))
    display.start(len(plan.jobs))
    queue = _Queue(plan, ready, display)
    loop = _Loop(results, runtime, queue, ready.data, provenance_host, display, fail_fast)
    try:
        queue.start(iter(targets.items()) if targets is not None else stream(plan, runtime))
        gpus = sorted({job.gpu for job in plan.jobs if job.gpu is not None})
        if len(gpus) < 2:
            loop.lane(_any)
        else:       # the CPU jobs first, alone (they would share the CPUs); then a lane a GPU
            loop.lane(_on_gpu)
            loop.side_by_side([functools.partial(_on_gpu, gpu=gpu) for gpu in gpus])
    finally:
        queue.close(runtime)
        display.stop()
    if store.row_file_count(results) > store.COMPACT_AFTER:
        display.say(f"compacted {store.counted(store.compact(results))} of {results}")
    return loop.records


def _any(job) -> bool:
    return True


def _on_gpu(job, gpu=None) -> bool:
    """A lane's jobs: those of one GPU (``gpu`` None: the CPU jobs)."""
    return job.gpu == gpu


class _Queue:
    """The plan's jobs, each ready to run once its targets are: the targets come from a thread
    of their own (``start``: the Docker runtime builds missing images meanwhile), and
    ``take`` gives a lane the first job, in the plan's order, whose targets are ready: its
    framework's, and the tool images its platforms are deployed in (``Job.images``; a tool's
    target that could not be made is the platforms' reason in the row, not the job's).  A
    job planned unsupported needs none.  With ``--resume`` a job is left out once its id
    shows it stored, and the count is said when every target is in."""

    def __init__(self, plan: Plan, ready: Prepared, display):
        self.ready, self.display = ready, display
        self.cond = threading.Condition()
        self.waiting: list = []         # (position, job): their targets still coming
        self.targets: dict = {}         # (framework or tool, variant) -> Target, as they came
        self.runnable: list = []        # (position, job, job id, target, tools), in the plan's order
        self.total, self.left_out, self.taken = len(plan.jobs), 0, 0
        self.error: BaseException | None = None     # the targets' thread failed: raised in the lanes
        self.resolved = self.halted = False
        self.thread: threading.Thread | None = None
        for position, job in enumerate(plan.jobs):
            if job.unsupported:
                self._admit(position, job, None, {})
            else:
                self.waiting.append((position, job))

    def start(self, targets) -> None:
        """Resolve ``targets``, an iterator of ((framework, variant), Target), in a thread."""
        self.thread = threading.Thread(target=self._resolve, args=(targets,), name="targets",
                                       daemon=True)
        self.thread.start()

    def _resolve(self, targets) -> None:
        try:
            for key, target in targets:
                with self.cond:
                    self.targets[key] = target
                    still = []
                    for position, job in self.waiting:
                        if all(image in self.targets for image in job.images):
                            own, *tools = (self.targets[image] for image in job.images)
                            self._admit(position, job, own,
                                        {name: found for (name, _), found in zip(job.images[1:], tools)})
                        else:
                            still.append((position, job))
                    self.waiting = still
                    self.cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - raised again in the job loop
            with self.cond:
                self.error = exc
        finally:
            with self.cond:
                self.resolved = True
                if self.error is None and self.waiting:
                    missing = dict.fromkeys(image for _, job in self.waiting for image in job.images
                                            if image not in self.targets)
                    self.error = RuntimeError(f"no target came for {', '.join(map(':'.join, missing))}")
                self.cond.notify_all()
            if self.error is None and self.ready.done is not None:
                resumed(self.display, self.left_out, self.total - self.left_out)

    def _admit(self, position: int, job, target, tools: dict) -> None:
        job_id = self.ready.job_id(job, target)
        if self.ready.stored(job_id):
            self.left_out += 1
            self.display.jobs_left_out(1)
        else:
            bisect.insort(self.runnable, (position, job, job_id, target, tools), key=lambda item: item[0])

    def take(self, lane):
        """The next job of the lane (``lane(job)`` says which are its) whose target is ready,
        as (index, job, job id, target, tools), waiting for one; None when the lane has none left
        or the queue was halted.  The targets' thread's error is raised here."""
        with self.cond:
            while True:
                if self.error is not None:
                    raise self.error
                if self.halted:
                    return None
                for n, (_, job, job_id, target, tools) in enumerate(self.runnable):
                    if lane(job):
                        del self.runnable[n]
                        self.taken += 1
                        return self.taken, job, job_id, target, tools
                if not any(lane(job) for _, job in self.waiting):
                    return None
                self.cond.wait()

    def not_run(self) -> int:
        """The jobs neither taken nor left out (so far)."""
        with self.cond:
            return self.total - self.taken - self.left_out

    def halt(self) -> None:
        """No more jobs: every ``take`` returns None."""
        with self.cond:
            self.halted = True
            self.cond.notify_all()

    def close(self, runtime) -> None:
        """After the loop: a target still coming (a stop, fail-fast, an error) stops the
        runtime's builds in flight, at their next line of output; waits for the thread."""
        if self.thread is None:
            return
        with self.cond:
            early = not self.resolved
        if early:
            runtime.cancel()
        self.thread.join()


class _Loop:
    """Carries out lanes of jobs, storing each job's row as it ends."""

    def __init__(self, results, runtime, queue: _Queue, data, provenance_host, display, fail_fast):
        self.results, self.runtime, self.queue, self.data = results, runtime, queue, data
        self.provenance_host, self.display, self.fail_fast = provenance_host, display, fail_fast
        self.records = []
        self.stopping = threading.Event()     # fail-fast: start no more jobs
        self.cancelled = threading.Event()    # interrupted: the running jobs are being stopped
        self.lock = threading.Lock()

    def side_by_side(self, lanes: list) -> None:
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
                self.queue.halt()
                self.runtime.cancel()
                concurrent.futures.wait(futures)
                raise

    def lane(self, lane) -> None:
        """The jobs ``lane(job)`` names, one after another, each as soon as its target is
        ready."""
        while not (self.stopping.is_set() or self.cancelled.is_set()):
            taken = self.queue.take(lane)
            if taken is None:
                return
            record = self.one(*taken)
            if record is None:                # stopped by the interrupt: no row
                return
            with self.lock:
                self.records.append(record)
            self.display.job_finished(record)
            if self.fail_fast and record.status != "ok" and not self.stopping.is_set():
                self.stopping.set()
                self.queue.halt()
                left = self.queue.not_run()
                if left:
                    self.display.say(f"fail-fast: stopping after a job that is {record.status}; "
                                     f"{left} job(s) not run")

    def one(self, index: int, job, job_id: str, target, tools: dict):
        """One job, to its stored row; None when the run was interrupted meanwhile.
        ``target``: None for a job planned unsupported; ``tools``: the targets of the tool
        images its checks run in, by name."""
        runtime = self.runtime
        if job.memory_bytes is None and runtime.default_memory:
            job = job.model_copy(update={"memory_bytes": runtime.default_memory})
        dataset = self.data[job.dataset]
        run_id = uuid.uuid4().hex[:16]
        self.display.job_started(index, job)
        # the load average is the job's, not the run's (a job that runs has its runtime's
        # marks of its start and end, ``collect``)
        provenance = dict(self.provenance_host, image=target.name if target else runtime.planned_image(job),
                          image_id=target and target.id, dataset_sha256=dataset.sha256,
                          host_load_avg=hostinfo.load_average(),
                          **hostinfo.gpu_facts(gpu_device(job, runtime.gpus)))
        reason = job.unsupported or runtime.unsupported(target, job)
        broken = target.error if target is not None and reason is None else None   # never started
        rescue = job_dir = None
        handed = False                  # the row went to store_row: stored, or kept to recover
        try:
            with signals_deferred():    # the room for the row and the job directory, or neither
                rescue, job_dir = _prepare(self.results, run_id, index,
                                           job_dir=reason is None and broken is None)
            if reason is None and broken is None:
                staged = {}
                try:
                    staged = checks.stage(job)  # the checks' files beside its spec, made once
                    outcome = runtime.run(job, target, run_id, job_id, job_dir, dataset.path, self.display,
                                          inputs=staged)
                except DockerUnavailable:
                    raise
                except DlbenchError as exc:     # Docker refused its container, its files changed
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
                # the checks' look at what the job left (the exported model run with
                # onnxruntime: seconds): before the row, which a stop signal waits for; in a
                # child process that the interrupt kills; before collect removes out/
                after = checks.After(job, run_id, job_dir, dataset.root, staged, tools)
                taken = checks.take(after, stop=self.cancelled)
                if self.cancelled.is_set():     # stopped during the check: as during the job
                    jobdir.remove(job_dir)
                    rescue.release()
                    return None
            # A stop signal waits for the row to be stored (milliseconds): one that came
            # while it was written left a job directory without its row.
            with signals_deferred():
                if broken is not None:
                    collected, samples = Collected(failed(job, run_id, job_id, broken, provenance)), []
                elif reason is None:
                    collected = collect(job, run_id, job_id, job_dir, outcome, provenance, after, taken)
                    jobdir.remove_inputs(job_dir, staged)
                    samples = outcome.samples
                else:
                    collected, samples = Collected(unsupported(job, run_id, job_id, reason, provenance)), []
                record = collected.record
                handed = True
                # or keeps them and says how to recover
                store.store_row(self.results, record, samples, rescue, collected.sides, collected.files)
        except BaseException:           # interrupted (Ctrl-C, SIGTERM, SIGHUP): no row, no directory
            if rescue is not None:
                rescue.release()        # unless it holds a row kept by store_row
            if job_dir is not None and not handed:
                jobdir.remove(job_dir)
            raise
        return record


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


