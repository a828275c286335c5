"""Images without a registry: root file system -> base -> one image per framework.

1. root  ``dlbench/root:<suite>``: a Debian root file system made with
   debootstrap from Debian's mirror and imported, or a pulled debian image.
2. base  ``dlbench/base:<suite>``: Python 3 and the host's CA bundle.
3. ``dlbench/<framework>:<variant>``: the framework, the shared runner, the adapter.
   Its build context holds the variant's Dockerfile, the runner under
   ``runner/dlbench_runner/`` and the framework directory's other files (not its
   sub-folders) under ``<framework>/``, for any framework ``catalog`` finds.
   Variant ``cpu`` is built from the framework's ``Dockerfile``; ``gpu`` from its
   ``Dockerfile.gpu`` (CUDA builds from the package index), where there is one.
   The framework's models.json says, under ``variants``, each variant's version,
   CUDA and cuDNN ("none" where unused), or why it has none (``unsupported``: its GPU jobs are stored so).
   Another release of the framework (``versions`` there) is variant ``cpu-<release>``
   (``catalog.versioned``): the CPU Dockerfile with that release's build arguments.
4. ``dlbench/<tool>:cpu``: a tool image (``catalog.TOOLS``: the deploy image), whose
   image.json names its own Debian suite; its root and base are made for that suite
   as the frameworks' are for ``SUITE``, when a tool image is first built.

A framework whose models.json lists ``sources`` (GitHub repositories in the
registry of ``sources.py``) gets their verified archives in its build context
under ``sources/<group>/``; their pins and tree checksums, the registry's, are a
build argument, ``SOURCE_PINS``, so they are part of the context hash, and each
pinned commit is an image label ``org.dlbench.sources.<owner>/<repo>``.  The
archives themselves are needed only to build: an image present with the same
context hash runs without them (``prepare_sources`` checks, before any build,
the archives of those images that must be built).

Each build's inputs (files, build arguments, parent image) are hashed; an image
already labelled with the same hash is reused as it is, so a build with
nothing changed takes seconds and keeps its image id.  When something changed,
Docker's layer cache still reuses the unchanged steps.

The package's other rooms: ``progress.py`` (a build's step, time left and downloads, read
from its output, and each image's last build time), ``downloads.py`` (the download cache:
Debian's and the package index's files fetched once, through a local proxy) and
``sources.py`` (the pinned source archives: the registry, a local mirror, the checks).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

# build_progress, cache, downloads (an HTTP proxy) and sources (the archives) are imported where
# a build uses them: dlbench --help, which imports this module for its options' defaults, starts
# without them
from .. import __version__, catalog
from ..errors import BuildError, DlbenchError, DockerUnavailable, UsageError, docker_errors

SUITE = catalog.SUITE
DEFAULT_MIRROR = "http://deb.debian.org/debian"
PULL_IMAGE = f"debian:{SUITE}-slim"      # the default suite's (``pull_image``)
BASE_SOURCES = ("auto", "debootstrap", "pull")     # the root file system: pull, else debootstrap; or one
LABEL = "org.dlbench"
CA_CANDIDATES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                 "/etc/ssl/cert.pem")
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
DEFAULT_JOBS = 2        # framework images built at once


# A rolling suite's Release file is signed valid for a week only: a mirror that lags behind
# (or a snapshot of one) then refuses every ``apt-get update`` of its debootstrapped root.
# Such roots check the signature, not the date (pulled Debian images keep apt's default).
ROLLING_SUITES = frozenset({"sid", "unstable", "testing"})


def pull_image(suite=SUITE):
    return f"debian:{suite}-slim"


def root_tag(suite=SUITE):
    return f"dlbench/root:{suite}"


def base_tag(suite=SUITE):
    return f"dlbench/base:{suite}"


def image_tag(framework: str, variant: str = "cpu") -> str:
    return f"dlbench/{framework}:{variant}"


def find_ca_bundle(explicit: str | None = None) -> Path:
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise UsageError(f"--ca-bundle {explicit}: no such file")
        return path
    for candidate in (os.environ.get("SSL_CERT_FILE"), *CA_CANDIDATES):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    import certifi
    return Path(certifi.where())


def find_image(client, tag):
    import docker.errors
    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """How missing images are built: ``dlbench build-images``'s options, which ``dlbench
    run`` takes too (it builds what its plan lacks)."""

    base_source: str = "auto"           # one of BASE_SOURCES
    mirror: str = DEFAULT_MIRROR        # Debian's, for debootstrap
    ca_bundle: Path | None = None       # None: the host's system bundle
    network: str | None = None          # the builds' network mode; None: Docker's default
    sources_dir: Path | None = None     # the pinned archives' mirror; None: $DLBENCH_SOURCES_DIR or the cache
    download_cache: bool = True         # fetch Debian's and the index's files once (``downloads``)


class Activity:
    """The image builds a builder runs: how many now, and how many began so far, so that a
    job can count the builds that ran at any point beside it (``since``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.running = self.begun = 0

    def begin(self) -> None:
        with self._lock:
            self.running += 1
            self.begun += 1

    def end(self) -> None:
        with self._lock:
            self.running -= 1

    def mark(self) -> tuple[int, int]:
        with self._lock:
            return self.running, self.begun

    def since(self, mark: tuple[int, int]) -> int:
        """The builds that ran at any point since ``mark``: those running then, and those
        begun after."""
        with self._lock:
            return mark[0] + self.begun - mark[1]


class Builder:
    """Builds the images; ``say`` receives one line per step for the display, and
    ``on_step(tag, progress)`` each Dockerfile step a build starts (a
    ``build_progress.BuildProgress``, which the display may read at any time; None when the
    build ends, built or not).  ``times``: where each image's last build time is kept for the
    next build's estimate (``build_progress.Times``; None: nowhere).  Framework images may be
    built from several threads at once (``build_images``); the root and base images are
    built first, by one.  ``activity`` counts the builds running."""

    def __init__(self, client, options: BuildOptions | None = None, say=print,
                 log_dir: Path | None = None, suite: str = SUITE, on_step=None,
                 times: build_progress.Times | None = None):
        options = options or BuildOptions()
        if options.base_source not in BASE_SOURCES:
            raise UsageError(f"--base {options.base_source}: choose {', '.join(BASE_SOURCES)}")
        self.client, self.say, self.base_source = client, say, options.base_source
        self.on_step = on_step or (lambda tag, progress: None)
        self.times = times
        self.activity = Activity()
        self.cancelled = threading.Event()      # set: builds in flight stop at their next line
        self.mirror, self.network, self.suite = options.mirror, options.network, suite
        self.ca_bundle = find_ca_bundle(options.ca_bundle)
        self.log_dir = log_dir
        self.sources_dir = options.sources_dir
        self._built = {}   # tag -> image, built or checked by this builder
        self._download_cache = options.download_cache
        self._downloads: downloads.Proxy | None = None     # started by the first build that fetches
        self._downloads_lock = threading.Lock()
        self._sources_ready = set()    # (framework, variant) whose archives were checked
        self._roots_lock = threading.Lock()

    def expected_seconds(self, image: tuple[str, str]) -> float | None:
        """How long the image's build is expected to take: its last on this machine, else
        its framework's ``build_s`` (the CPU image from a bare Docker on 2 cores), else None."""
        last = self.times.last(image_tag(*image)) if self.times else None
        if last:
            return sum(step.seconds for step in last)
        if image[0] in catalog.TOOLS:
            return catalog.tool_info(image[0]).get("build_s")
        return catalog.models(image[0]).get("build_s") if image[1] == "cpu" else None

    # -- stage 1: the root file system ------------------------------------------
    def root(self, rebuild: bool = False, suite: str | None = None):
        """The root file system of ``suite`` (None: the frameworks', ``SUITE``)."""
        suite = suite or self.suite
        tag = root_tag(suite)
        image = None if rebuild else find_image(self.client, tag)
        if image is not None:
            return image
        with self._roots_lock:     # a tool's suite may be first wanted by two builds at once
            image = None if rebuild else find_image(self.client, tag)
            if image is not None:
                return image
            if self.base_source in ("auto", "pull"):
                try:
                    return self._pull(tag, suite)
                except BuildError as exc:
                    if self.base_source == "pull":
                        raise
                    self.say(f"no registry ({exc}); making the root file system with debootstrap")
            return self._debootstrap(tag, suite)

    def _pull(self, tag, suite):
        import docker.errors
        self.say(f"pulling {pull_image(suite)}")
        try:
            image = self.client.images.pull(pull_image(suite))
        except docker.errors.APIError as exc:
            raise BuildError(str(exc.explanation or exc).splitlines()[0]) from None
        image.tag(*tag.split(":"))
        return self.client.images.get(tag)

    def _debootstrap(self, tag, suite):
        if shutil.which("debootstrap") is None:
            raise BuildError("debootstrap is not installed (apt-get install debootstrap), "
                             "and no debian image could be pulled")
        if os.geteuid() != 0:
            raise BuildError("debootstrap needs root: run `sudo dlbench build-images`, "
                             "or use --base pull where a registry is reachable")
        self.say(f"debootstrap {suite} (minbase) from {self.mirror}")
        with tempfile.TemporaryDirectory(prefix="dlbench-root-") as tmp:
            target = Path(tmp) / "root"
            log = deque(maxlen=20)
            proxy = self.download_proxy()
            proc = subprocess.Popen(
                ["debootstrap", "--variant=minbase", "--include=ca-certificates",
                 suite, str(target), self.mirror],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env={**os.environ, **(proxy.environment() if proxy else {})})
            for line in proc.stdout:
                log.append(line.rstrip())
                self.say(line.rstrip())
            if proc.wait() != 0:
                raise BuildError(f"debootstrap failed (exit {proc.returncode}): {log[-1] if log else ''}")
            if suite in ROLLING_SUITES:
                (target / "etc" / "apt" / "apt.conf.d" / "50dlbench-rolling").write_text(
                    'Acquire::Check-Valid-Until "false";\n')
            self.say("importing the root file system into Docker")
            tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(target), "-c", "."],
                                   stdout=subprocess.PIPE)
            changes = [f'LABEL {LABEL}.role="root" {LABEL}.debian-suite="{suite}" '
                       f'{LABEL}.source="debootstrap" {LABEL}.build-date="{_now()}" '
                       f'{LABEL}.version="{__version__}"',
                       'CMD ["/bin/bash"]']
            with docker_errors("importing the root file system"):
                self.client.api.import_image_from_stream(
                    tar.stdout, repository=tag.split(":")[0], tag=tag.split(":")[1], changes=changes)
            tar.wait()
        return self.client.images.get(tag)

    # -- stages 2 and 3 ----------------------------------------------------------------
    def base(self, rebuild: bool = False, suite: str | None = None):
        suite = suite or self.suite
        return self._build(*self._base_inputs(self.root(suite=suite), suite), rebuild)

    def framework(self, framework: str, rebuild: bool = False, variant: str = "cpu"):
        reason = catalog.variant_unsupported(framework, variant)
        if reason is not None:
            raise UsageError(reason)
        base = self.base(suite=self._suite(framework, variant))
        return self._build(*self._framework_inputs(framework, variant, base), rebuild,
                           catalog.sources(framework, variant))

    def _suite(self, name: str, variant: str = "cpu") -> str:
        """The suite of an image: its own where it names one (a tool's image.json, a
        framework's models.json or its release's), else the builder's."""
        return catalog.suite(name, variant, default=self.suite)

    def tool(self, tool: str, rebuild: bool = False):
        """A tool image (``catalog.TOOLS``), on the base of its own suite."""
        base = self.base(suite=self._suite(tool))
        return self._build(*self._tool_inputs(tool, base), rebuild)

    def image(self, name: str, rebuild: bool = False, variant: str = "cpu"):
        """A framework's image of that variant, or a tool's."""
        if name in catalog.TOOLS:
            return self.tool(name, rebuild)
        return self.framework(name, rebuild, variant)

    def to_build(self, images, rebuild: bool = False) -> list[tuple[str, str]]:
        """Those of the images, (framework, variant) pairs, that ``framework`` would build
        (all of them with ``rebuild``); variants without an image are left out.  Asks
        Docker which images are present; builds nothing."""
        images = [(fw, v) for fw, v in images if catalog.variant_unsupported(fw, v) is None]
        if rebuild:
            return images
        return [(fw, v) for fw, v in images if self._present_image(fw, v) is None]

    def _present_image(self, name: str, variant: str):
        """The image, if present and built from the inputs it would be built from now."""
        suite = self._suite(name, variant)
        root = find_image(self.client, root_tag(suite))
        base = root and self._present(*self._base_inputs(root, suite))
        if base is None:
            return None
        if name in catalog.TOOLS:
            return self._present(*self._tool_inputs(name, base))
        return self._present(*self._framework_inputs(name, variant, base))

    def prepare_sources(self, images, rebuild: bool = False) -> None:
        """Before any build: the pinned source archives of those of the images that must be
        built, verified (fetched if need be); a present image of the same pins needs none."""
        from . import sources

        images = [key for key in images if key not in self._sources_ready]
        if images:      # `dlbench run` checks them before anything is written, then builds
            sources.prepare_for(self.to_build(images, rebuild), self.sources_dir)
            self._sources_ready.update(images)

    def _base_inputs(self, root, suite: str):
        files = {"Dockerfile": catalog.images_dir() / "base" / "Dockerfile",
                 "ca-bundle.crt": self.ca_bundle}
        labels = {f"{LABEL}.role": "base", f"{LABEL}.debian-suite": suite}
        return base_tag(suite), files, {"ROOT_IMAGE": root.id}, labels

    def _tool_inputs(self, tool: str, base):
        """A tool image's context: its Dockerfile and its folder's other files under <tool>/."""
        folder = catalog.images_dir() / tool
        info = catalog.tool_info(tool)
        files = {"Dockerfile": folder / "Dockerfile"}
        for path in sorted(folder.iterdir()):
            if path.is_file() and path.name != "Dockerfile":
                files[f"{tool}/{path.name}"] = path
        labels = {f"{LABEL}.role": "tool", f"{LABEL}.tool": tool, f"{LABEL}.variant": "cpu",
                  f"{LABEL}.framework-version": info["version"],
                  f"{LABEL}.debian-suite": info["suite"], f"{LABEL}.cuda": "none"}
        return image_tag(tool), files, {"BASE_IMAGE": base.id}, labels

    def _framework_inputs(self, framework: str, variant: str, base):
        from . import sources

        # The context: the variant's Dockerfile, the shared runner and the framework's own
        # files under <framework>/, wherever its directory is (catalog.frameworks).
        files = {"Dockerfile": catalog.dockerfile(framework, variant)}
        for name in _included(files["Dockerfile"].read_text()):      # shared steps, by name
            files[name] = catalog.images_dir() / name
        for path in sorted((catalog.images_dir() / "runner" / "dlbench_runner").glob("*.py")):
            files[f"runner/dlbench_runner/{path.name}"] = path
        for path in sorted(catalog.framework_dir(framework).iterdir()):
            if path.is_file() and not path.name.startswith("Dockerfile"):
                files[f"{framework}/{path.name}"] = path
        info = catalog.variant_info(framework, variant)
        labels = {f"{LABEL}.role": "framework", f"{LABEL}.framework": framework,
                  f"{LABEL}.variant": variant, f"{LABEL}.framework-version": info["version"],
                  f"{LABEL}.debian-suite": self._suite(framework, variant), f"{LABEL}.cuda": info.get("cuda", "none"),
                  f"{LABEL}.cudnn": info.get("cudnn", "none")}
        args = {"BASE_IMAGE": base.id, "FRAMEWORK_VERSION": info["version"], **info.get("build_args", {})}
        pinned = [sources.lookup(repo) for repo in catalog.sources(framework, variant)]
        if pinned:      # the registry's pins: no archive is needed to know them
            args["SOURCE_PINS"] = " ".join(f"{s.repo}@{s.commit}:{s.tree_sha256}" for s in pinned)
            labels.update({f"{LABEL}.sources.{s.repo}": s.commit for s in pinned})
        return image_tag(framework, variant), files, args, labels

    def _present(self, tag, files: dict[str, Path], buildargs: dict, labels: dict):
        """The image of that tag if it was built from these very inputs, else None."""
        if tag in self._built:
            return self._built[tag]
        existing = find_image(self.client, tag)
        if existing is not None and existing.labels.get(f"{LABEL}.context-hash") == \
                _context_hash(files, buildargs):
            return existing
        return None

    def _build(self, tag, files: dict[str, Path], buildargs: dict, labels: dict, rebuild: bool,
               pinned: list[str] = ()):
        """``pinned``: the source repositories whose archives go into the context, under
        ``sources/<group>/`` (their identity is a build argument already)."""
        from . import downloads, progress as build_progress, sources

        if not rebuild:
            existing = self._present(tag, files, buildargs, labels)
            if existing is not None:
                if tag not in self._built:
                    self.say(f"{tag}: up to date")
                    self._built[tag] = existing
                return existing
        context_hash = _context_hash(files, buildargs)
        archives = {}
        if pinned:
            found = sources.prepare(pinned, sources.mirror_dir(self.sources_dir))
            archives = {f"sources/{s.group}/{s.filename}": path for s, path in found.items()}
        labels = {**labels, f"{LABEL}.version": __version__, f"{LABEL}.build-date": _now(),
                  f"{LABEL}.context-hash": context_hash}
        proxies = {k: os.environ[k] for k in PROXY_VARIABLES if k in os.environ}
        network = self.network
        if (proxy := self.download_proxy()) is not None:    # in the host's network, to reach it
            network = "host"
            proxies.update(proxy.environment())
            if _declares(files["Dockerfile"], downloads.PIP_ARGUMENTS):
                proxies.update(downloads.PIP_ARGUMENTS)
        self.say(f"{tag}: building")
        started = time.monotonic()
        progress = build_progress.BuildProgress(self.times.last(tag) if self.times else None)
        self.activity.begin()
        try:
            self._stream(tag, files, archives, buildargs, labels, proxies, network, progress)
        finally:
            self.activity.end()
            self.on_step(tag, None)
        if self.times is not None:
            self.times.keep(tag, progress.finish())
        self.say(f"{tag}: built in {time.monotonic() - started:.0f} s")
        self._built[tag] = self.client.images.get(tag)
        return self._built[tag]

    def _stream(self, tag, files, archives, buildargs, labels, proxies, network, progress) -> None:
        """The build itself: Docker's output followed line by line, to the log, ``say`` and
        ``progress``."""
        with tempfile.TemporaryDirectory(prefix="dlbench-context-") as tmp:
            for name, source in {**files, **archives}.items():
                (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, Path(tmp) / name)
            dockerfile = Path(tmp) / "Dockerfile"
            dockerfile.write_text(_include(dockerfile.read_text(), Path(tmp)) + "\n"
                                  + label_instruction(labels) + "\n")
            log, tail = [], deque(maxlen=30)
            with docker_errors(f"building {tag}"):
                stream = self.client.api.build(
                    path=tmp, tag=tag, buildargs={**proxies, **buildargs},
                    container_limits={"cpushares": BUILD_CPU_SHARES},
                    rm=True, forcerm=True, decode=True, network_mode=network,
                    nocache=False)
                for chunk in stream:
                    if self.cancelled.is_set():     # leaving the stream closes it: Docker stops the build
                        raise BuildError(f"building {tag}: stopped")
                    if "error" in chunk:
                        self._write_log(tag, log)
                        detail = " | ".join(line for line in tail if line)[-600:]
                        raise BuildError(f"building {tag} failed: {chunk['error'].strip()} ({detail})")
                    text = chunk.get("stream", "").rstrip()
                    if text:
                        log.append(text)
                        tail.append(text)
                        self.say(text)
                        if any([progress.line(line) for line in text.splitlines()]):
                            self.on_step(tag, progress)
            self._write_log(tag, log)

    def download_proxy(self) -> downloads.Proxy | None:
        """The download cache's proxy, started on first use; None where it is off or the
        builds could not reach the host's loopback: with another ``--build-network`` than
        host, a Docker daemon on another machine, or a rootless one."""
        from .. import cache
        from . import downloads

        with self._downloads_lock:
            if self._download_cache and self._downloads is None:
                why = self._no_download_cache()
                if why:
                    self.say(f"download cache off: {why}")
                    self._download_cache = False
                else:
                    self._downloads = downloads.Proxy(cache.folder("downloads"), self.ca_bundle)
            return self._downloads

    def _no_download_cache(self) -> str | None:
        if self.network not in (None, "host"):
            return f"builds in network {self.network} cannot reach the host's loopback"
        if self.client.api.base_url != "http+docker://localhost":    # a unix socket (ssh:// is not)
            return f"the Docker daemon at {self.client.api.base_url} is on another machine"
        if any("rootless" in option for option in self.client.info().get("SecurityOptions") or []):
            return "a rootless Docker's host network is not the host's"
        return None

    def close(self) -> None:
        """Stop the download cache's proxy, saying what it saved."""
        with self._downloads_lock:
            if self._downloads is not None:
                self._downloads.close()
                self.say(self._downloads.counts.summary())
                self._downloads = None

    def _write_log(self, tag, lines):
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            (self.log_dir / (tag.replace("/", "_").replace(":", "_") + ".log")).write_text("\n".join(lines))


def images_to_build(frameworks: list[str], variants: list[str], named: bool = False) -> dict:
    """``dlbench build-images``' plan: (framework, variant) -> why it has no such image, or
    None; a framework asked for by name (``named``) without the variant is a UsageError,
    said before anything is built."""
    todo = {(fw, v): catalog.variant_unsupported(fw, v) for v in variants for fw in frameworks}
    for reason in todo.values():
        if reason is not None and named:
            raise UsageError(reason)
    return todo


def build_images(builder: Builder, todo: dict, rebuild: bool = False, skip=lambda reason: None,
                 jobs: int = DEFAULT_JOBS, keep_going: bool = False):
    """Carry out ``images_to_build``' plan: the source archives of the images to build checked
    first, then the base, then the framework images, ``jobs`` at a time, each yielded as
    (tag, image) as soon as it is ready: those present and up to date first, in the plan's
    order, then the others as they are built.  A variant a framework lacks is passed to ``skip``.
    The first build that fails stops the others (at their next line of output) and raises;
    with ``keep_going`` it is yielded as (tag, its ``DlbenchError``) and the others go on
    (Docker out of reach still raises)."""
    if jobs < 1:
        raise UsageError(f"--jobs {jobs}: build at least one image at a time")
    try:
        builder.prepare_sources([key for key, reason in todo.items() if reason is None], rebuild)
        builder.base(rebuild=rebuild)
        wanted = []
        for key, reason in todo.items():
            if reason is not None:
                skip(reason)
            else:
                wanted.append(key)
        missing = builder.to_build(wanted, rebuild)

        def outcome(build):
            try:
                return build()
            except DockerUnavailable:
                raise
            except DlbenchError as exc:
                if not keep_going or builder.cancelled.is_set():
                    raise
                return exc

        # The present ones here, one after another in the plan's order (a look, no build):
        # the caller sees them in that order whatever the pool's threads would have done.
        for framework, variant in wanted:
            if (framework, variant) not in missing:
                yield image_tag(framework, variant), outcome(
                    functools.partial(builder.image, framework, rebuild, variant))
        pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="dlbench-build")
        order = start_order(missing, jobs, builder.expected_seconds)
        pending = {pool.submit(builder.image, fw, rebuild, v): (fw, v) for fw, v in order}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: missing.index(pending[f])):
                    framework, variant = pending.pop(future)
                    yield image_tag(framework, variant), outcome(future.result)
        finally:
            if pending:                 # a failure, an interrupt, or the caller stopped early
                builder.cancelled.set()
            pool.shutdown(wait=True, cancel_futures=True)
    finally:
        builder.close()        # the download cache's proxy, if a build started it


# The CPU weight of a build's steps, against a job container's 1024 (Docker's default): a
# job that starts while other images still build (``dlbench run`` starts each job as soon as
# its image is ready) gets four fifths of the CPUs the two contend for, not half, so its
# timings are less disturbed; alone, a build still takes every CPU that is free.
BUILD_CPU_SHARES = 256


def label_instruction(labels: dict) -> str:
    """The image's labels as one ``LABEL`` line, appended to its Dockerfile: Docker's build
    API given ``labels`` adds a step for each, and the classic builder commits a layer a step
    (several seconds each on an overlay file system in a busy machine: a framework image's
    ten labels took 74 s of a 315 s build)."""
    return "LABEL " + " ".join(f"{json.dumps(key)}={json.dumps(value, ensure_ascii=False)}"
                               for key, value in labels.items())


def start_order(images: list, jobs: int, expected=lambda image: None) -> list:
    """The order the builds start in: the shortest expected first (``expected(image)``:
    seconds, or None where unknown, taken as long), so that the first images, and the first
    rows, come early; with more than one at a time, the images that compile code before
    them, the longest first (Lua Torch7's pinned sources took 8 minutes on two cores from a
    bare Docker, the web image's crates 6 to 10; every other image, which installs
    packages, 1 to 4.5), so that a long build does not start last and hold up the end (the
    web image, started last of eleven, was 12 minutes of CI's images alone).  Equal
    expectations keep the plan's order."""
    def key(image):
        seconds = expected(image)
        seconds = math.inf if seconds is None else seconds
        if jobs > 1 and catalog.compiles(*image):
            return (0, -seconds)
        return (1, seconds)
    return sorted(images, key=key)


# A Dockerfile's line that stands for the steps of a file that several share (the BLAS
# libraries' install), named from the images' directory: ``# dlbench-include: runner/blas.dockerfile``.
# It is a comment to Docker itself; the build puts the file's lines in its place.
INCLUDE = re.compile(r"^# dlbench-include: (\S+)$", re.MULTILINE)


def _included(text: str) -> list[str]:
    """The shared files a Dockerfile's text includes (each a file of the build context)."""
    return INCLUDE.findall(text)


def _include(text: str, context: Path) -> str:
    """The Dockerfile's text with each include line replaced by the file's lines."""
    return INCLUDE.sub(lambda found: (context / found.group(1)).read_text().rstrip("\n"), text)


def _declares(dockerfile: Path, arguments: dict) -> bool:
    """Whether a Dockerfile declares every one of these build arguments (``ARG NAME``)."""
    declared = set(re.findall(r"^\s*ARG\s+(\w+)", dockerfile.read_text(), re.MULTILINE))
    return set(arguments) <= declared


def _context_hash(files: dict[str, Path], buildargs: dict) -> str:
    """A build's inputs, hashed: the context's files (name and bytes) and the build arguments."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].read_bytes() + b"\0")
    for key in sorted(buildargs):
        digest.update(f"{key}={buildargs[key]}\0".encode())
    return digest.hexdigest()[:32]


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
