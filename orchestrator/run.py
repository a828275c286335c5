"""Carry out a plan: one container per job, one after another, each job's row stored at once.

Every container is labelled, runs without network as an unprivileged user,
reads its data set read-only and writes only its own job directory.  While it
runs, a sampler thread records its resource trace (``traces.py``).

Every job leaves exactly one row, whatever happens to it (``collect.py`` lists
the statuses); a job the image cannot run is stored as ``unsupported`` without
starting a container.  A bad job never stops the campaign unless ``fail_fast``.
Ctrl-C or SIGTERM stops and removes the running container; the rows stored so
far stay, and ``--resume`` runs only the jobs not yet stored as ok.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from . import build, datasets, hostinfo, native, store
from .collect import Outcome, collect, follow_output, unsupported
from .errors import DlbenchError, DockerUnavailable, GpuError, docker_errors
from .plan import Job, Plan
from .traces import Sampler

LABEL = build.LABEL
NOBODY = 65534


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
        self.builder = build.Builder(self.client, say=display.say, **(builder_options or {}))

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
        # The image id checked and stored in the row, not the tag: a tag can be moved by
        # another build between the check and the start.
        return run_container(self.client, job, target.id or target.name, run_id, job_id, job_dir,
                             dataset_path, display)


class NativeBackend:
    """Jobs as processes of a Python on the host (``native.py``)."""

    runtime = "native"

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
             python: str | None = None) -> list:
    """Run every job of the plan; returns the stored rows.

    Each job leaves exactly one row, whatever happened to it; a bad job never stops
    the campaign unless ``fail_fast``.  ``memory`` and ``timeout``, when given,
    replace the jobs' own limits.  ``runtime`` is docker (containers) or native
    (processes of the ``python`` interpreter)."""
    display = display or NullDisplay()
    for gpu in plan.gpus:
        check_gpu(gpu)
    backend = DockerBackend(builder_options, display) if runtime == "docker" else NativeBackend(python)
    data = datasets.prepare(plan.datasets, data_dir, progress=display.download_progress())
    targets = {}
    for job in plan.jobs:
        key = (job.framework, job.variant)
        if key not in targets:
            targets[key] = backend.target(*key)
    provenance_host = dict(backend.host_facts(), runtime=backend.runtime)
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
            target = targets[job.framework, job.variant]
            dataset = data[job.dataset]
            run_id = uuid.uuid4().hex[:16]
            display.job_started(index, job)
            provenance = dict(provenance_host, image=target.name, image_id=target.id,
                              dataset_sha256=dataset.sha256)
            reason = backend.unsupported(target, job)
            if reason is not None:
                record = unsupported(job, run_id, job_id, reason, provenance)
            else:
                job_dir = store.job_dir(results, run_id)
                try:
                    outcome = backend.run(job, target, run_id, job_id, job_dir, dataset.path, display)
                except DockerUnavailable:
                    raise
                except DlbenchError as exc:     # Docker refused this job's container
                    outcome = Outcome(exit_code=None, wall_time_s=0.0, log_tail=[], error=str(exc))
                store.write_trace(results, run_id, outcome.samples)
                record = collect(job, run_id, job_id, job_dir, outcome, provenance)
            store.append(results, [record])
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


def owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def remove_stale(client) -> list[str]:
    """Remove job containers left by dlbench processes of this host that are gone."""
    removed = []
    host = socket.gethostname()
    for container in client.containers.list(all=True, filters={"label": f"{LABEL}.role=job"}):
        name, _, pid = container.labels.get(f"{LABEL}.owner", "").rpartition(":")
        if name == host and pid.isdigit() and not _alive(int(pid)):
            container.remove(force=True)
            removed.append(container.short_id)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_container(client, job: Job, tag: str, run_id: str, job_id: str, job_dir: Path,
                  dataset_path: Path, display) -> Outcome:
    (job_dir / "job.json").write_text(json.dumps(job.spec(run_id, job_id), indent=1))
    user = _user_for(job_dir)
    kwargs = dict(
        image=tag, detach=True, user=user, network_mode="none",
        environment={**job.thread_environment, "HOME": "/tmp", "PYTHONUNBUFFERED": "1"},
        volumes={str(dataset_path.resolve()): {"bind": f"/data/{job.dataset}", "mode": "ro"},
                 str(job_dir.resolve()): {"bind": "/out", "mode": "rw"}},
        labels={f"{LABEL}.run-id": run_id, f"{LABEL}.job-id": job_id,
                f"{LABEL}.framework": job.framework, f"{LABEL}.role": "job",
                f"{LABEL}.owner": owner(), **({f"{LABEL}.campaign": job.campaign} if job.campaign else {})},
        read_only=True, tmpfs={"/tmp": "rw,exec,nosuid,size=2g"},
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
    try:
        with docker_errors(f"running {job.label}"):
            container = client.containers.run(**kwargs)
            sampler = Sampler(container, started, job.gpu).start()
            if timeout:
                watchdog = threading.Timer(timeout, _kill, (container, timed_out))
                watchdog.start()
            tail = follow_output(_lines(container.logs(stream=True, follow=True)),
                                 job_dir / "log.txt", display)
            state = container.wait()
            wall = time.perf_counter() - started
            container.reload()
            oom = bool(container.attrs["State"].get("OOMKilled"))
        sampler.stop()
        return Outcome(exit_code=state.get("StatusCode"), wall_time_s=wall,
                       log_tail=tail, oom_killed=oom, timed_out=timed_out.is_set(),
                       error=f"the job ran past its time limit of {timeout:g} s" if timed_out.is_set() else None,
                       samples=sampler.samples, trace=sampler.summary())
    finally:
        if watchdog is not None:
            watchdog.cancel()
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


def _user_for(job_dir: Path) -> str:
    """Jobs never run as root: as the invoking user, or as nobody when that is root."""
    uid, gid = os.getuid(), os.getgid()
    if uid == 0:
        os.chown(job_dir, NOBODY, NOBODY)
        return f"{NOBODY}:{NOBODY}"
    return f"{uid}:{gid}"


def _lines(chunks):
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
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
