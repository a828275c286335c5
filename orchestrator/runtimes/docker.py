"""The Docker runtime: each job in its own hardened container of its framework's image.

Every container is labelled, runs without network as an unprivileged user
under an init process, with a memory limit (``--memory``, or 90% of the Docker
host's memory), a pids limit, ulimits and a bounded, noexec ``/tmp``; it reads
its data set and spec read-only and writes only its own ``out/`` directory, which
the host treats as hostile input (``jobdir.py``).  While it runs, a sampler
thread records its resource trace (``traces.py``).  Images are built when
missing (``build.py``).  A container left by a dlbench that died is found by its
owner's lock file (``owners.py``) and removed at the next start, with its job
directory.  For a scheduler that runs jobs on other nodes (Slurm), an image is
shipped as a file: ``export`` saves it once (``docker save``), ``load`` loads it on
a node whose Docker lacks it, checked by id.  Docker's errors are translated once,
in ``errors.docker_errors``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from .. import build, catalog, hostinfo, jobdir, owners
from ..build import progress as build_progress
from ..errors import DlbenchError, docker_errors
from ..interrupts import signals_deferred
from . import workers
from .containers import OutWatch, kill
from .traces import Sampler
from .base import Outcome, Running, Target, follow_output, gpu_device, split_lines

if TYPE_CHECKING:
    from ..plan import Job

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


def default_memory(client) -> int | None:
    """A job's memory limit when none is given: a share of the Docker host's memory."""
    with docker_errors("asking Docker for the host's memory"):
        total = client.info().get("MemTotal")
    return int(total * DEFAULT_MEMORY_SHARE) if total else None


def prepare_job_dir(job_dir: Path, spec: dict, inputs: dict | None = None):
    """``jobdir.prepare`` for a container: ``out/`` handed to the container's user
    (nobody when dlbench runs as root); returns log.txt open for writing."""
    return jobdir.prepare(job_dir, spec, owner=NOBODY if os.getuid() == 0 else None, inputs=inputs)


def image_unsupported(image, tag: str) -> str | None:
    """Why a GPU variant image cannot run GPU jobs (stored as ``unsupported`` rows), or None."""
    if tag.endswith(":gpu") and image.labels.get(f"{LABEL}.cuda", "none") == "none":
        return f"image {tag} is a build without CUDA: it cannot run GPU jobs"
    return None


class DockerRuntime:
    """Jobs in hardened containers of the framework images; ``target`` finds an image, or
    builds it as ``build`` (a ``build.BuildOptions``) says."""

    name = "docker"
    # A job's workers are containers of this host's daemon (runtimes/workers.py), on a
    # network of the job's own: one node.
    spans_nodes = False
    allocation = None

    def __init__(self, display, build_options: build.BuildOptions | None = None):
        self.client = docker_client()
        for short_id in remove_stale(self.client):
            display.say(f"removed container {short_id} left by an interrupted run")
        self.owner = owners.current()
        self.builder = build.Builder(self.client, build_options, say=display.say,
                                     on_step=getattr(display, "build_step", None),
                                     times=build_progress.Times())
        self.default_memory = default_memory(self.client)
        self.running = Running(lambda container: kill(container, threading.Event()))

    def host_facts(self) -> dict:
        return hostinfo.host_facts(self.client.version().get("Version"))

    def planned_image(self, job: Job) -> str | None:
        return build.image_tag(job.framework, job.variant)

    def prepare(self, images: list[tuple[str, str]]) -> None:
        """Before any build: the pinned source archives of the images it must build, verified
        (fetched if need be)."""
        self.builder.prepare_sources(images)

    def target(self, framework: str, variant: str) -> Target:
        return dict(self.targets([(framework, variant)]))[(framework, variant)]

    def targets(self, images: list[tuple[str, str]]):
        """Each (framework, variant) with its target, yielded as soon as it is ready: the
        images present first, then the missing ones as they are built side by side
        (``build.DEFAULT_JOBS`` at once), as ``dlbench build-images`` builds them; an image
        is reused when nothing in its context changed.  A build that fails is a target with
        its error, and the others go on.  A variant the framework lacks never gets here: its
        jobs were planned unsupported."""
        if not images:
            return
        keys = {build.image_tag(fw, v): (fw, v) for fw, v in images}
        for tag, found in build.build_images(self.builder, dict.fromkeys(images), keep_going=True):
            if isinstance(found, Exception):
                yield keys[tag], Target(tag, None, error=str(found))
            else:
                yield keys[tag], Target(tag, found.id, image_unsupported(found, tag))

    def export(self, target: Target, folder: Path, say) -> Path | None:
        """The target's image saved once under ``folder`` (``docker save``), for the nodes."""
        with docker_errors(f"looking for image {target.name}"):
            image = self.client.images.get(target.id)
        return save_image(image, folder, say)

    def load(self, framework: str, variant: str, target: Target, archive: Path | None,
             say) -> Target:
        """The image a submitter resolved, as this node's target: by id, loaded here from
        its saved copy (``archive``) when missing, never built."""
        if target.id is None:
            return Target(target.name, None, f"no image {target.name} for this job")
        if target.reason is None:
            ensure_image(self.client, target, archive, say)
        return target

    def unsupported(self, target: Target, job: Job) -> str | None:
        return target.reason

    gpus: list[str] | None = None

    def run(self, job, target, run_id, job_id, job_dir, dataset_path, display, inputs=None) -> Outcome:
        # The image id checked and stored in the row, not the tag: a tag can be moved by
        # another build between the check and the start.
        # A job that runs while images build shares the CPUs with them: its row says so.
        mark = self.builder.activity.mark()
        outcome = run_container(self.client, job, target.id or target.name, run_id, job_id,
                                job_dir, dataset_path, display, self.owner.token,
                                gpu_device(job, self.gpus), self.running, inputs or {})
        outcome.builds_alongside = self.builder.activity.since(mark)
        return outcome

    def cancel(self) -> None:
        self.builder.cancelled.set()        # builds in flight stop at their next line of output
        self.running.cancel()

    def close(self) -> None:
        self.client.close()


def save_image(image, folder: Path, say) -> Path:
    """``docker save`` the image once into ``folder`` (shared with the nodes); returns the
    file's path."""
    final = folder / f"{image.id.replace(':', '-')}.tar"
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{os.getpid()}.tmp"
    say(f"saving image {image.tags[0] if image.tags else image.short_id} for the nodes")
    try:
        with docker_errors(f"saving image {image.short_id}"), open(tmp, "wb") as out:
            for chunk in image.save(named=True):
                out.write(chunk)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()
    return final


def ensure_image(client, target: Target, archive: Path | None, say=lambda text: None):
    """The target's image on this node, by id: loaded from its saved copy (``archive``)
    when Docker lacks it."""
    import docker.errors

    with docker_errors(f"looking for image {target.name}"):
        try:
            found = client.images.get(target.id)
        except docker.errors.ImageNotFound:
            found = None
    if found is None:
        if archive is None or not archive.is_file():
            raise DlbenchError(f"image {target.name} ({target.id}) is not on this node and there is "
                               f"no saved copy of it" + (f" at {archive}" if archive else ""))
        say(f"loading image {target.name} from {archive}")
        with docker_errors(f"loading image {target.name}"), open(archive, "rb") as f:
            client.images.load(f)
            found = client.images.get(target.id)
    if target.name not in found.tags:        # the node's tag pointed elsewhere: run the saved one
        repository, _, tag = target.name.rpartition(":")
        found.tag(repository, tag)
    return found


def remove_stale(client) -> list[str]:
    """Remove the job containers whose owner is dead on this machine (``owners.py``),
    with their job directories; returns their short ids."""
    import docker.errors

    removed, by_owner, networks = [], {}, {}
    # ignore_removed: another dlbench's job may end between the listing and its inspection
    for container in client.containers.list(all=True, filters={"label": f"{LABEL}.role=job"},
                                            ignore_removed=True):
        by_owner.setdefault(container.labels.get(f"{LABEL}.owner", ""), []).append(container)
    for network in client.networks.list(filters={"label": f"{LABEL}.role=job-network"}):
        networks.setdefault(network.attrs.get("Labels", {}).get(f"{LABEL}.owner", ""), []).append(network)
    for token in {**by_owner, **networks}:
        lapsed = owners.Lapsed.claim(token)
        if lapsed is None:
            continue                    # alive, or not this machine's
        with lapsed:
            for container in by_owner.get(token, []):
                with contextlib.suppress(docker.errors.NotFound):   # removed meanwhile
                    container.remove(force=True)
                removed.append(container.short_id)
                _remove_job_dir(container.labels)
            for network in networks.get(token, []):     # a job of several workers' own
                with contextlib.suppress(docker.errors.NotFound):
                    network.remove()
    owners.sweep_lock_files(keep={**by_owner, **networks})
    return removed


def _remove_job_dir(labels: dict) -> None:
    from .. import store     # pyarrow: not for doctor, which only reaches Docker here

    run_id, results = labels.get(f"{LABEL}.run-id", ""), labels.get(f"{LABEL}.results")
    if results and jobdir.RUN_ID.fullmatch(run_id):
        jobdir.remove(Path(results) / store.JOBS / run_id)


def hardened() -> dict:
    """What every container dlbench starts for untrusted work (a job, a tool on a job's
    model) is held to: ``containers.run`` arguments.  No network, a read-only root, no
    capabilities nor new privileges, nobody's user (the host's own where it is not root),
    an init process, bounded processes and open files, no core dumps."""
    return dict(
        detach=True, network_mode="none", read_only=True, init=True,
        user=f"{NOBODY}:{NOBODY}" if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}",
        cap_drop=["ALL"], security_opt=["no-new-privileges"], pids_limit=PIDS_LIMIT,
        ulimits=[docker_ulimit("nofile", NOFILE), docker_ulimit("core", 0)])


def container_options(job: Job, tag: str, run_id: str, job_id: str, job_dir: Path,
                      dataset_path: Path, owner: str, device: str | None = None,
                      inputs: dict[str, bytes] | None = None) -> dict:
    """How a job's container is started: the Docker SDK's ``containers.run`` arguments
    (hardening, limits, mounts, labels).  ``bench/overhead.py`` starts its containers
    with these too."""
    environment = {**job.thread_environment, "HOME": "/tmp", "PYTHONUNBUFFERED": "1"}
    tmpfs = {"/tmp": f"rw,noexec,nosuid,nodev,size={TMP_SIZE}"}
    if catalog.compiles_code(job.framework):
        tmpfs[COMPILE_DIR] = f"rw,exec,nosuid,nodev,size={COMPILE_SIZE}"
        environment["DLBENCH_COMPILE_DIR"] = COMPILE_DIR
    kwargs = dict(
        hardened(), image=tag, command=["--spec", SPEC], environment=environment,
        volumes={str(dataset_path.resolve()): {"bind": f"/data/{job.dataset}", "mode": "ro"},
                 str((job_dir / "job.json").resolve()): {"bind": SPEC, "mode": "ro"},
                 str((job_dir / jobdir.OUT).resolve()): {"bind": "/out", "mode": "rw"},
                 **{str((job_dir / name).resolve()): {"bind": os.path.join(os.path.dirname(SPEC), name),
                                                      "mode": "ro"}
                    for name in inputs or {}}},
        labels={f"{LABEL}.run-id": run_id, f"{LABEL}.job-id": job_id,
                f"{LABEL}.framework": job.framework, f"{LABEL}.role": "job",
                f"{LABEL}.owner": owner, f"{LABEL}.results": str(job_dir.parent.parent.resolve()),
                **({f"{LABEL}.campaign": job.campaign} if job.campaign else {})},
        tmpfs=tmpfs,
    )
    if job.cpus:
        kwargs.update(cpuset_cpus=job.cpuset, nano_cpus=job.cpus * 10**9)
    if job.memory_bytes:
        kwargs["mem_limit"] = job.memory_bytes
    if job.gpu is not None:
        import docker.types
        kwargs["device_requests"] = [docker.types.DeviceRequest(
            device_ids=[device], capabilities=[["gpu"]])]
    return kwargs


def run_container(client, job: Job, tag: str, run_id: str, job_id: str, job_dir: Path,
                  dataset_path: Path, display, owner: str, device: str | None = None,
                  running: Running | None = None, inputs: dict[str, bytes] | None = None) -> Outcome:
    """Run the job's container to its end, following its output and sampling its
    resources; the container is removed whatever happens.  ``running``: where the
    runtime keeps its running containers, for ``cancel``; ``inputs``: the files it finds
    beside its spec (``checks.stage``), mounted read-only."""
    inputs = inputs or {}
    kwargs = container_options(job, tag, run_id, job_id, job_dir, dataset_path, owner, device, inputs)
    if job.workers:         # one container a worker, on a network of their own
        log = prepare_job_dir(job_dir, job.spec(run_id, job_id), inputs)
        with log:
            return workers.run_workers(client, job, kwargs, job_dir, display, running,
                                       int(device) if device and device.isdigit() else job.gpu, log)
    timeout = job.timeout
    begun = hostinfo.mark(job.cpu_list)     # the host as the job starts: its noise facts
    started = begun.clock
    container, watchdog, sampler, timed_out = None, None, None, threading.Event()
    out_watch = None
    log = prepare_job_dir(job_dir, job.spec(run_id, job_id), inputs)
    try:
        with docker_errors(f"running {job.label}"):
            with signals_deferred():        # never a started container we do not know of
                container = client.containers.run(**kwargs)
            if running is not None:
                running.add(container)
            sampler = Sampler(container, started, int(device) if device and device.isdigit() else job.gpu).start()
            out_watch = OutWatch(job_dir, container).start()
            if timeout:
                watchdog = threading.Timer(timeout, kill, (container, timed_out))
                watchdog.start()
            tail = follow_output(split_lines(container.logs(stream=True, follow=True)), log, display)
            state = container.wait()
            ended = hostinfo.mark(job.cpu_list)
            wall = ended.clock - started
            container.reload()
            oom = bool(container.attrs["State"].get("OOMKilled"))
        sampler.stop()
        out_watch.stop()
        error = (f"the job ran past its time limit of {timeout:g} s" if timed_out.is_set()
                 else out_watch.verdict())
        return Outcome(exit_code=state.get("StatusCode"), wall_time_s=wall,
                       log_tail=tail, oom_killed=oom, timed_out=timed_out.is_set(), error=error,
                       samples=sampler.samples, trace=sampler.summary(), host_marks=(begun, ended),
                       cpu_time_s=sampler.cpu_seconds())
    finally:
        log.close()
        if watchdog is not None:
            watchdog.cancel()
        if out_watch is not None:
            out_watch.stop()
        if container is not None:
            if running is not None:
                running.discard(container)
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001 - best effort; stale containers are found by label
                pass
        if sampler is not None:
            sampler.stop(timeout=2.0)


def docker_ulimit(name: str, limit: int):
    import docker.types
    return docker.types.Ulimit(name=name, soft=limit, hard=limit)
