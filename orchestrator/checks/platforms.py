"""Where a trained model goes after training (Guo et al.'s deployment half): the job's ONNX
model deployed on the mobile runtime, with and without 8-bit quantization, by ONNX Runtime
quantized, and in a web browser, each platform in the tool image that serves it
(``catalog.PLATFORM_TOOLS``: ``images/deploy``, whose ``deploy.py`` says how each converts
and runs the model; ``images/web``, a headless Chromium running a WebAssembly engine).

The check of the after-training stage (``PlatformsCheck``) deploys the model the migration
check ran (``migration.Migration``: the framework's file, or the one the host built of its
layer list) on the platforms the job asks for (``Job.platforms``: ``--platforms``, else
``plan.default_platforms``).  The host hands each tool's container a folder (``request``):
the model, the test images the framework predicted with its classes and its first batch of
logits, the calibration images, drawn from the training split (never the test split) with a
fixed seed, and the FGSM images the job kept (``transfer``), whose accuracy on each deployed
model says whether quantization changes robustness; the container writes one row per
platform, which the host reads as hostile input (``read_rows``: as a job's out/, each row
checked by ``PlatformRow``).  The rows go to the ``platforms`` side table, one per job and
platform.  A platform that cannot convert or run the model is a failed row with its reason:
a finding, not an error; a model that cannot be deployed at all (the job exported none, its
tool image could not be built, the container broke) is the ``platforms_reason`` of its row.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .. import build, catalog, jobdir
from ..errors import DlbenchError, docker_errors
from .base import After, Check, Found

if TYPE_CHECKING:
    from .platform_row import PlatformRow

PLATFORMS = catalog.PLATFORMS
TOOL = "deploy"
CALIBRATION_IMAGES = 200
CALIBRATION_SEED = 0
RESULT = "result.json"
MAX_RESULT_BYTES = 1 << 16
TIMEOUT_S = 900
MEMORY_BYTES = 6 << 30
POLL_S = 0.2


class Refused(Exception):
    """Why the container's rows cannot be read."""


def calibration(dataset: str, data_root: Path, count: int = CALIBRATION_IMAGES,
                seed: int = CALIBRATION_SEED) -> np.ndarray:
    """``count`` training images, bytes as stored, drawn without replacement by ``seed``."""
    from dlbench_runner.contract import formats

    images = formats.load(dataset, os.fspath(data_root), ("train",))["train_images"]
    chosen = np.random.default_rng(seed).choice(len(images), size=min(count, len(images)), replace=False)
    return images[np.sort(chosen)]


def request(folder: Path, model: bytes, images: np.ndarray, labels: np.ndarray,
            predictions: np.ndarray, logits: np.ndarray, calibration_images: np.ndarray,
            platforms=PLATFORMS, batch: int = 100, threads: int = 1, timed: int = 200,
            warmup: int = 20, extra: dict | None = None) -> Path:
    """The deploy program's input folder, written (``extra``: more arrays by name, the
    adversarial images and their labels)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(model)
    arrays = {"images": images, "labels": labels, "predictions": predictions, "logits": logits,
              "calibration": calibration_images, **(extra or {})}
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", np.ascontiguousarray(array), allow_pickle=False)
    fields = {name: f"{name}.npy" for name in arrays}
    fields.update(model="model.onnx", platforms=list(platforms), batch=batch, threads=threads,
                  timed=timed, warmup=warmup)
    (folder / "request.json").write_text(json.dumps(fields))
    return folder


def read_rows(folder: Path, platforms=PLATFORMS) -> list[PlatformRow]:
    """The rows a container wrote in ``folder/out/``, one per platform asked for, in
    ``PLATFORMS``'s order, read as hostile input (as a job's out/: ``jobdir.read_output``)."""
    from pydantic import ValidationError    # not for a command that reads rows

    from .platform_row import PlatformRow

    data, problem = jobdir.read_output(folder, RESULT, MAX_RESULT_BYTES)
    if data is None:
        raise Refused(f"the deploy program wrote no {RESULT}" if problem == jobdir.absent(RESULT) else problem)
    try:
        rows = [PlatformRow.model_validate(row) for row in json.loads(data)["platforms"]]
    except (ValueError, KeyError, TypeError, ValidationError) as exc:
        raise Refused(f"{RESULT} is invalid: {str(exc).splitlines()[0]}") from None
    if [row.platform for row in rows] != ordered(platforms):
        raise Refused(f"{RESULT} holds other platforms than those asked for")
    return rows


def ordered(platforms) -> list[str]:
    """``platforms`` in ``PLATFORMS``'s order."""
    return [name for name in PLATFORMS if name in platforms]


def tools(platforms) -> dict[str, list[str]]:
    """The tool images that serve ``platforms``, each with its platforms, in order."""
    found: dict[str, list[str]] = {}
    for name in ordered(platforms):
        found.setdefault(catalog.PLATFORM_TOOLS[name], []).append(name)
    return found


def deploy(client, folder: Path, platforms=PLATFORMS, images: dict[str, str] | None = None,
           timeout: float = TIMEOUT_S, stop: threading.Event | None = None) -> list[PlatformRow]:
    """Every platform's row for the request in ``folder``, each from a container of the
    tool image that serves it (``images``: tool -> image, default ``build.image_tag``),
    held as a job's container is (``docker.hardened``) with a memory limit and ``timeout``
    seconds; ``stop`` ends it early (``Refused``)."""
    rows = []
    for tool, names in tools(platforms).items():
        tag = (images or {}).get(tool) or build.image_tag(tool)
        rows.extend(_deploy(client, folder, names, tag, timeout, stop))
    return rows


def _deploy(client, folder: Path, platforms: list[str], tag: str, timeout: float,
            stop: threading.Event | None) -> list[PlatformRow]:
    from ..runtimes.docker import hardened

    with tempfile.TemporaryDirectory(prefix="dlbench-deploy-") as tmp:
        out = Path(tmp) / jobdir.OUT
        out.mkdir()
        os.chmod(out, 0o777)        # the container's user is not this one
        with docker_errors(f"deploying in {tag}"):
            container = client.containers.run(
                tag, ["/in", "/out"], **hardened(),
                environment={"HOME": "/tmp", "OMP_NUM_THREADS": "1"},
                volumes={str(folder.resolve()): {"bind": "/in", "mode": "ro"},
                         str(out.resolve()): {"bind": "/out", "mode": "rw"}},
                tmpfs={"/tmp": "rw,nosuid,nodev,size=2g"}, mem_limit=MEMORY_BYTES,
                labels={f"{build.LABEL}.role": "deploy"})
            try:
                code = _wait(container, timeout, stop)
                if code != 0:
                    tail = container.logs(tail=5).decode(errors="replace").strip().splitlines()
                    raise Refused(f"the {tag} program ended with exit status {code}"
                                  + (f": {tail[-1][:300]}" if tail else ""))
            finally:
                container.remove(force=True)
        return read_rows(Path(tmp), platforms)


def _wait(container, timeout: float, stop: threading.Event | None) -> int:
    """The container's exit status, waited for at most ``timeout`` seconds, or until
    ``stop`` is set (``Refused`` either way: the caller removes it)."""
    deadline = time.monotonic() + timeout
    while True:
        container.reload()
        if container.status in ("exited", "dead"):
            return int(container.attrs["State"]["ExitCode"])
        if stop is not None and stop.is_set():
            raise Refused("stopped")
        if time.monotonic() > deadline:
            raise Refused(f"the deployment ran past its {timeout:g} s limit")
        time.sleep(POLL_S)


@functools.lru_cache(maxsize=2)
def _calibration(dataset: str, data_root: str, state: tuple) -> np.ndarray:
    images = calibration(dataset, Path(data_root))
    images.flags.writeable = False
    return images


@dataclasses.dataclass(frozen=True)
class Deployed:
    """What the platforms check took of a job: the rows, or why there are none."""

    rows: list[PlatformRow] = dataclasses.field(default_factory=list)
    reason: str | None = None
    seconds: float | None = None
    images: int | None = None           # the test images each platform classified


def deploy_job(after: After, migration, transfer, stop=None) -> Deployed | None:
    """The job's model on its platforms (None: it asks for none)."""
    job = after.job
    if not job.platforms:
        return None
    if migration is None or migration.model is None or migration.migration_reason is not None:
        why = (migration.migration_reason if migration is not None and migration.migration_reason
               else "the job left no ONNX model")
        return Deployed(reason=f"nothing to deploy: {why}")
    broken = [f"the {tool} image: {target.error or target.reason}"
              for tool, target in after.tools.items() if target.error or target.reason]
    if broken:
        return Deployed(reason="; ".join(broken))
    started = time.perf_counter()
    from .migration import data_state, test_split      # read once a run

    images, labels = test_split(job.dataset, after.data_root)
    count = len(migration.predictions)
    state = data_state(job.dataset, after.data_root)
    adversarial = {}
    if transfer is not None and transfer[0] is not None:
        from .transfer import read
        kept = read(transfer[0], job.dataset)
        adversarial = {"adversarial": kept.images, "adversarial_labels": kept.labels}
    batch = int(job.hyperparameters.get("test_batch_size") or job.hyperparameters.get("batch_size") or 100)
    with tempfile.TemporaryDirectory(prefix="dlbench-platforms-") as tmp:
        folder = request(Path(tmp) / "in", migration.model, images[:count], labels[:count],
                         migration.predictions, migration.logits,
                         _calibration(job.dataset, os.fspath(after.data_root), state),
                         platforms=job.platforms, batch=batch, extra=adversarial)
        try:
            from ..runtimes.docker import docker_client
            rows = deploy(docker_client(), folder, job.platforms,
                          {tool: target.name for tool, target in after.tools.items()}, stop=stop)
        except (Refused, DlbenchError) as exc:
            return Deployed(reason=str(exc), seconds=time.perf_counter() - started)
    return Deployed(rows, seconds=time.perf_counter() - started, images=count)


class PlatformsCheck(Check):
    """The platforms in the after-training stage: the migrated model deployed once the job
    has ended (``deploy_job``), a row a platform in the ``platforms`` side table."""

    name = "platforms"
    row_fields = {
        "platforms": (str | None, None),            # the platforms asked for, comma-separated
        "platforms_time_s": (float | None, None),   # the deployments on the host, after the job
        "platforms_reason": (str | None, None),     # why there are no platform rows
    }

    def take(self, after: After, stop, before) -> Deployed | None:
        return deploy_job(after, before.get("migration"), before.get("transfer"), stop)

    def found(self, after: After, result, taken: Deployed | None) -> Found:
        if not after.job.platforms:
            return Found()
        taken = taken or Deployed(reason="the job left nothing to deploy")
        fields = {"platforms": ",".join(after.job.platforms), "platforms_time_s": taken.seconds,
                  "platforms_reason": taken.reason}
        return Found(fields, sides={"platforms": [dict(row.model_dump(), images=taken.images)
                                                  for row in taken.rows]})


CHECK = PlatformsCheck()
