"""Carry out a plan: one container per job, one after another, each job's row stored at once.

Every container is labelled, runs without network as an unprivileged user
under an init process, with a memory limit (``--memory``, or 90% of the Docker
host's memory), a pids limit, ulimits and a bounded, noexec ``/tmp``; it reads
its data set and spec read-only and writes only its own ``out/`` directory, which
the host treats as hostile input (``jobdir.py``).  While it runs, a sampler
thread records its resource trace (``traces.py``).

Every job leaves exactly one row, whatever happens to it (``collect.py`` lists
the statuses); a job the image cannot run is stored as ``unsupported`` without
starting a container.  A bad job never stops the campaign unless ``fail_fast``.
Ctrl-C, SIGTERM or SIGHUP stops and removes the running container and its job
directory; the rows stored so far stay, and ``--resume`` runs only the jobs not
yet stored as ok.  A container left by a dlbench that died is found by its
owner's lock file (``owners.py``) and removed at the next start, with its job
directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from . import build, catalog, datasets, hostinfo, jobdir, native, owners, store
from .collect import Outcome, collect, follow_output, unsupported
from .interrupts import signals_deferred
from .errors import DlbenchError, DockerUnavailable, GpuError, StoreError, docker_errors
from .plan import Job, Plan
from .traces import Sampler

LABEL = build.LABEL
NOBODY = 65534
SPEC = "/job.json"                  # where a job container finds its spec (read-only)
TMP_SIZE = "2g"                     # the /tmp tmpfs (noexec); charged to the container's memory
COMPILE_DIR = "/compile"            # an exec tmpfs, for frameworks that compile code at run time
COMPILE_SIZE = "1g"
PIDS_LIMIT = 4096
NOFILE = 4096                       # open files, soft and hard
DEFAULT_MEMORY_SHARE = 0.9          # of the Docker host's memory, when no --memory is given


def docker_client():
    import docker
    with docker_errors("connecting to Docker"):
        client = docker.from_env(timeout=600)
        client.ping()
    return client


def gpu_count() -> int | None:
    """GPUs the NVIDIA driver sees on this host; None without a driver."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def check_gpu(gpu: int | None) -> None:
    if gpu is None:
        return
    count = gpu_count()
    if not count:
        raise GpuError(f"--gpu {gpu}: this host has no NVIDIA GPU (no working nvidia-smi)")
    if gpu >= count:
        raise GpuError(f"--gpu {gpu}: no such GPU; this host has {count} (0-{count - 1})")


def image_unsupported(image, tag: str) -> str | None:
    """Why a GPU variant image cannot run GPU jobs (stored as ``unsupported`` rows), or None."""
    if tag.endswith(":gpu") and image.labels.get(f"{LABEL}.cuda", "none") == "none":
        return f"image {tag} is a build without CUDA: it cannot run GPU jobs"
    return None


@dataclasses.dataclass
class Target:
    """What a framework's jobs run on: an image (or a host Python), its identity, and
    why it cannot run them, if it cannot."""

    name: str                     # the image tag, or native:PYTHON
    id: str | None                # the image id: part of every job's identity
    reason: str | None = None     # set: the jobs are stored as unsupported
    image: object = None


class DockerBackend:
    """Jobs in hardened containers of the framework images, built when missing."""

    runtime = "docker"

    def __init__(self, builder_options: dict | None, display):
        self.client = docker_client()
        for short_id in remove_stale(self.client):
            display.say(f"removed container {short_id} left by an interrupted run")
        self.owner = owners.current()
        self.builder = build.Builder(self.client, say=display.say, **(builder_options or {}))
        with docker_errors("asking Docker for the host's memory"):
            total = self.client.info().get("MemTotal")
        self.default_memory = int(total * DEFAULT_MEMORY_SHARE) if total else None

    def host_facts(self) -> dict:
        return hostinfo.host_facts(self.client.version().get("Version"))

    def target(self, framework: str, variant: str) -> Target:
        reason = build.variant_unsupported(framework, variant)
        if reason is not None:
            return Target(build.image_tag(framework, variant), None, reason)
        image = self.builder.framework(framework, variant=variant)   # reused when nothing changed
        tag = build.image_tag(framework, variant)
        return Target(tag, image.id, image_unsupported(image, tag), image)

    def unsupported(self, target: Target, job: Job) -> str | None:
        return target.reason

    def run(self, job, target, run_id, job_id, job_dir, dataset_path, display) -> Outcome:
        return run_container(self.client, job, target.name, run_id, job_id, job_dir,
                             dataset_path, display, self.owner.token)


class NativeBackend:
    """Jobs as processes of a Python on the host (``native.py``)."""

    runtime = "native"
    default_memory = None

    def __init__(self, python: str | None):
        self.python = native.check_python(python or sys.executable)

    def host_facts(self) -> dict:
        return hostinfo.host_facts(None)

    def target(self, framework: str, variant: str) -> Target:
        found = native.Target(self.python, framework)
        return Target(found.name, found.id, found.reason, found)

    def unsupported(self, target: Target, job: Job) -> str | None:
        return native.unsupported(target.image, job)

    def run(self, job, target, run_id, job_id, job_dir, dataset_path, display) -> Outcome:
        return native.run_process(job, target.image, run_id, job_id, job_dir, dataset_path, display)


RUNTIMES = ("docker", "native")


def run_plan(plan: Plan, results: Path, data_dir=None, builder_options: dict | None = None,
             display=None, memory: str | None = None, timeout: float | None = None,
             resume: bool = False, fail_fast: bool = False, runtime: str = "docker",
             python: str | None = None, backend=None, row_fields: dict | None = None) -> list:
    """Run every job of the plan; returns the stored rows.

    Each job leaves exactly one row, whatever happened to it; a bad job never stops
    the campaign unless ``fail_fast``.  ``memory`` and ``timeout``, when given,
    replace the jobs' own limits.  ``runtime`` is docker (containers) or native
    (processes of the ``python`` interpreter).  A Slurm task passes its own
    ``backend`` (the image it was given) and ``row_fields`` (node, Slurm ids)."""
    display = display or NullDisplay()
    store.check_results(results)
    for gpu in plan.gpus:
        check_gpu(gpu)
    if backend is None:
        backend = DockerBackend(builder_options, display) if runtime == "docker" else NativeBackend(python)
    data = datasets.prepare(plan.datasets, data_dir, progress=display.download_progress())
    targets = {}
    for job in plan.jobs:
        key = (job.framework, job.variant)
        if key not in targets:
            targets[key] = backend.target(*key)
    provenance_host = dict(backend.host_facts(), runtime=backend.runtime, **(row_fields or {}))
    todo = [(job, job.job_id(targets[job.framework, job.variant].id, data[job.dataset].sha256))
            for job in plan.jobs]
    if resume:
        done = store.ok_job_ids(results, plan.campaign)
        skipped = sum(job_id in done for _, job_id in todo)
        todo = [(job, job_id) for job, job_id in todo if job_id not in done]
        display.say(f"resume: {skipped} job(s) already stored as ok, {len(todo)} to run")
    records = []
    display.start(len(todo))
    try:
        for index, (job, job_id) in enumerate(todo, 1):
            if memory is not None or timeout is not None:
                job = job.model_copy(update={k: v for k, v in (("memory", memory), ("timeout", timeout))
                                             if v is not None})
            if job.memory is None and backend.default_memory:
                job = job.model_copy(update={"memory": str(backend.default_memory)})
            target = targets[job.framework, job.variant]
            dataset = data[job.dataset]
            run_id = uuid.uuid4().hex[:16]
            display.job_started(index, job)
            provenance = dict(provenance_host, image=target.name, image_id=target.id,
                              dataset_sha256=dataset.sha256)
            reason = backend.unsupported(target, job)
            rescue, job_dir = _prepare(results, run_id, index, job_dir=reason is None)
            try:
                if reason is not None:
                    record, samples = unsupported(job, run_id, job_id, reason, provenance), []
                else:
                    try:
                        outcome = backend.run(job, target, run_id, job_id, job_dir, dataset.path, display)
                    except DockerUnavailable:
                        jobdir.remove(job_dir)
                        raise
                    except DlbenchError as exc:     # Docker refused this job's container
                        outcome = Outcome(exit_code=None, wall_time_s=0.0, log_tail=[], error=str(exc))
                    except OSError as exc:          # the host could not write the job's files
                        if exc.errno not in store.DISK_ERRORS:
                            raise
                        outcome = Outcome(exit_code=None, wall_time_s=0.0, log_tail=[],
                                          error=f"dlbench could not write the job's files in {job_dir}: "
                                                f"{exc.strerror}")
                    except BaseException:           # interrupted (Ctrl-C, SIGTERM, SIGHUP): no row, no directory
                        jobdir.remove(job_dir)
                        raise
                    samples = outcome.samples
                    record = collect(job, run_id, job_id, job_dir, outcome, provenance)
                store.store_row(results, record, samples, rescue)   # or keeps it and says how to recover
            except BaseException:
                rescue.release()         # unless it holds a row kept by store_row
                raise
            records.append(record)
            display.job_finished(record)
            if fail_fast and record.status != "ok" and index < len(todo):
                display.say(f"fail-fast: stopping after a job that is {record.status}; "
                            f"{len(todo) - index} job(s) not run")
                break
    finally:
        display.stop()
    if store.row_file_count(results) > store.COMPACT_AFTER:
        rows, traces = store.compact(results)
        display.say(f"compacted {rows} row files and {traces} trace files of {results}")
    return records


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


def remove_stale(client) -> list[str]:
    """Remove the job containers whose owner is dead on this machine (``owners.py``),
    with their job directories; returns their short ids."""
    import docker.errors

    removed, by_owner = [], {}
    for container in client.containers.list(all=True, filters={"label": f"{LABEL}.role=job"}):
        by_owner.setdefault(container.labels.get(f"{LABEL}.owner", ""), []).append(container)
    for token, containers in by_owner.items():
        lapsed = owners.Lapsed.claim(token)
        if lapsed is None:
            continue                    # alive, or not this machine's
        with lapsed:
            for container in containers:
                with contextlib.suppress(docker.errors.NotFound):   # removed meanwhile
                    container.remove(force=True)
                removed.append(container.short_id)
                _remove_job_dir(container.labels)
    owners.sweep_lock_files(keep=by_owner)
    return removed


def _remove_job_dir(labels: dict) -> None:
    run_id, results = labels.get(f"{LABEL}.run-id", ""), labels.get(f"{LABEL}.results")
    if results and jobdir.RUN_ID.fullmatch(run_id):
        jobdir.remove(Path(results) / store.JOBS / run_id)


def run_container(client, job: Job, tag: str, run_id: str, job_id: str, job_dir: Path,
                  dataset_path: Path, display, owner: str) -> Outcome:
    root = os.getuid() == 0
    environment = {**job.thread_environment, "HOME": "/tmp", "PYTHONUNBUFFERED": "1"}
    tmpfs = {"/tmp": f"rw,noexec,nosuid,nodev,size={TMP_SIZE}"}
    if catalog.compiles_code(job.framework):
        tmpfs[COMPILE_DIR] = f"rw,exec,nosuid,nodev,size={COMPILE_SIZE}"
        environment["DLBENCH_COMPILE_DIR"] = COMPILE_DIR
    kwargs = dict(
        image=tag, command=["--spec", SPEC], detach=True,
        user=f"{NOBODY}:{NOBODY}" if root else f"{os.getuid()}:{os.getgid()}",
        network_mode="none", environment=environment,
        volumes={str(dataset_path.resolve()): {"bind": f"/data/{job.dataset}", "mode": "ro"},
                 str((job_dir / "job.json").resolve()): {"bind": SPEC, "mode": "ro"},
                 str((job_dir / jobdir.OUT).resolve()): {"bind": "/out", "mode": "rw"}},
        labels={f"{LABEL}.run-id": run_id, f"{LABEL}.job-id": job_id,
                f"{LABEL}.framework": job.framework, f"{LABEL}.role": "job",
                f"{LABEL}.owner": owner, f"{LABEL}.results": str(job_dir.parent.parent.resolve()),
                **({f"{LABEL}.campaign": job.campaign} if job.campaign else {})},
        read_only=True, tmpfs=tmpfs, init=True, pids_limit=PIDS_LIMIT,
        ulimits=[docker_ulimit("nofile", NOFILE), docker_ulimit("core", 0)],
        cap_drop=["ALL"], security_opt=["no-new-privileges"],
    )
    if job.cpus:
        kwargs.update(cpuset_cpus=job.cpuset, nano_cpus=job.cpus * 10**9)
    if job.memory:
        kwargs["mem_limit"] = job.memory_bytes
    if job.gpu is not None:
        import docker.types
        kwargs["device_requests"] = [docker.types.DeviceRequest(
            device_ids=[str(job.gpu)], capabilities=[["gpu"]])]
    timeout = job.timeout
    started = time.perf_counter()
    container, watchdog, sampler, timed_out = None, None, None, threading.Event()
    out_watch = None
    log = jobdir.prepare(job_dir, job.spec(run_id, job_id), owner=NOBODY if root else None)
    try:
        with docker_errors(f"running {job.label}"):
            with signals_deferred():        # never a started container we do not know of
                container = client.containers.run(**kwargs)
            sampler = Sampler(container, started, job.gpu).start()
            out_watch = OutWatch(job_dir, container).start()
            if timeout:
                watchdog = threading.Timer(timeout, _kill, (container, timed_out))
                watchdog.start()
            tail = follow_output(_lines(container.logs(stream=True, follow=True)), log, display)
            state = container.wait()
            wall = time.perf_counter() - started
            container.reload()
            oom = bool(container.attrs["State"].get("OOMKilled"))
        sampler.stop()
        out_watch.stop()
        error = f"the job ran past its time limit of {timeout:g} s" if timed_out.is_set() else out_watch.reason
        return Outcome(exit_code=state.get("StatusCode"), wall_time_s=wall,
                       log_tail=tail, oom_killed=oom, timed_out=timed_out.is_set(), error=error,
                       samples=sampler.samples, trace=sampler.summary())
    finally:
        log.close()
        if watchdog is not None:
            watchdog.cancel()
        if out_watch is not None:
            out_watch.stop()
        if container is not None:
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001 - best effort; stale containers are found by label
                pass
        if sampler is not None:
            sampler.stop(timeout=2.0)


def _kill(container, flag: threading.Event) -> None:
    flag.set()
    try:
        container.kill()
    except Exception:  # noqa: BLE001 - it may have just finished
        pass


def docker_ulimit(name: str, limit: int):
    import docker.types
    return docker.types.Ulimit(name=name, soft=limit, hard=limit)


class OutWatch:
    """Stops a job (kills its container) once its out/ holds more than jobdir's bound;
    checked once a second: a bind mount has no size limit of its own."""

    def __init__(self, job_dir: Path, container, interval: float = 1.0):
        self.job_dir, self.container, self.interval = job_dir, container, interval
        self.reason: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="out-watch", daemon=True)

    def start(self) -> "OutWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            reason = jobdir.over_limit(self.job_dir)
            if reason is not None:
                self.reason = reason + " (stopped)"
                _kill(self.container, threading.Event())
                return


MAX_LINE_BYTES = 1 << 20        # a longer line without a newline is split


def _lines(chunks):
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        while len(buffer) > MAX_LINE_BYTES:
            lines.append(buffer[:MAX_LINE_BYTES])
            buffer = buffer[MAX_LINE_BYTES:]
        for line in lines:
            yield line.decode("utf-8", "replace").rstrip("\r")
    if buffer:
        yield buffer.decode("utf-8", "replace")



class NullDisplay:
    def say(self, text):
        pass

    def download_progress(self):
        return None

    def start(self, total):
        pass

    def job_started(self, index, job):
        pass

    def event(self, event):
        pass

    def job_finished(self, record):
        pass

    def stop(self):
        pass


__all__ = ["run_plan", "docker_client", "DockerUnavailable"]
