"""Where a trained model goes after training (Guo et al.'s deployment half): the job's ONNX
model run in the deploy image (``images/deploy``, its ``deploy.py`` says how each platform
converts and runs it) on the mobile runtime, with and without 8-bit quantization, and by
ONNX Runtime quantized.

The host hands the container a folder (``request``): the model the migration check ran, the
test images the framework predicted with its classes and its first batch of logits, and the
calibration images, drawn from the training split (never the test split) with a fixed seed;
the container writes one row per platform, which the host reads as hostile input
(``read_rows``: size-capped, each row checked by ``PlatformRow``).  A platform that cannot
convert or run the model is a failed row with its reason: a finding, not an error.

Not yet a check of the after-training stage (``checks.NAMES``): ``deploy`` runs one model,
as ``tests/test_deploy.py`` does.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from .. import build
from ..errors import docker_errors

PLATFORMS = ("mobile", "mobile-int8", "onnx-int8")
TOOL = "deploy"
CALIBRATION_IMAGES = 200
CALIBRATION_SEED = 0
RESULT = "result.json"
MAX_RESULT_BYTES = 1 << 16
TIMEOUT_S = 900
MEMORY_BYTES = 6 << 30


class Refused(Exception):
    """Why the container's rows cannot be read."""


class PlatformRow(BaseModel):
    """One platform's figures, as the deploy program writes them."""

    model_config = ConfigDict(extra="forbid")

    platform: str
    status: str                         # ok, failed
    reason: str | None = None
    conversion_s: float | None = None
    model_bytes: int | None = None
    converter_layout: str | None = None  # how onnx2tf was told to hold the input
    conversion_shared: bool | None = None  # mobile-int8's model came of mobile's conversion
    accuracy: float | None = None
    mismatches: int | None = None       # images classified otherwise than by the framework
    max_logit_error: float | None = None
    latency_ms: float | None = None     # median, batch 1, after warm-up
    latency_iqr_ms: float | None = None
    throughput: float | None = None     # images per second
    throughput_batch: int | None = None
    peak_memory_bytes: int | None = None  # the runtime's process
    adversarial_images: int | None = None
    adversarial_accuracy: float | None = None


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
            warmup: int = 20) -> Path:
    """The deploy program's input folder, written."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(model)
    arrays = {"images": images, "labels": labels, "predictions": predictions, "logits": logits,
              "calibration": calibration_images}
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", np.ascontiguousarray(array), allow_pickle=False)
    fields = {name: f"{name}.npy" for name in arrays}
    fields.update(model="model.onnx", platforms=list(platforms), batch=batch, threads=threads,
                  timed=timed, warmup=warmup)
    (folder / "request.json").write_text(json.dumps(fields))
    return folder


def read_rows(out: Path, platforms=PLATFORMS) -> list[PlatformRow]:
    """The container's rows, one per platform asked for, read as hostile input."""
    path = out / RESULT
    if not path.is_file() or path.is_symlink():
        raise Refused(f"the deploy program wrote no {RESULT}")
    if path.stat().st_size > MAX_RESULT_BYTES:
        raise Refused(f"{RESULT} is larger than {MAX_RESULT_BYTES} bytes")
    try:
        rows = [PlatformRow.model_validate(row) for row in json.loads(path.read_text())["platforms"]]
    except (ValueError, KeyError, TypeError, ValidationError) as exc:
        raise Refused(f"{RESULT} is invalid: {str(exc).splitlines()[0]}") from None
    if [row.platform for row in rows] != [name for name in PLATFORMS if name in platforms]:
        raise Refused(f"{RESULT} holds other platforms than those asked for")
    return rows


def deploy(client, folder: Path, platforms=PLATFORMS, image: str | None = None,
           timeout: float = TIMEOUT_S) -> list[PlatformRow]:
    """Every platform's row for the request in ``folder``, from a container of the deploy
    image: no network, read-only but for its output, no capabilities, a memory limit."""
    tag = image or build.image_tag(TOOL)
    with tempfile.TemporaryDirectory(prefix="dlbench-deploy-") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        os.chmod(out, 0o777)        # the container's user is not this one
        with docker_errors(f"deploying in {tag}"):
            container = client.containers.run(
                tag, ["/in", "/out"], detach=True, network_mode="none",
                user="65534:65534" if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}",
                environment={"HOME": "/tmp", "OMP_NUM_THREADS": "1"},
                volumes={str(folder.resolve()): {"bind": "/in", "mode": "ro"},
                         str(out.resolve()): {"bind": "/out", "mode": "rw"}},
                read_only=True, tmpfs={"/tmp": "rw,nosuid,nodev,size=2g"}, mem_limit=MEMORY_BYTES,
                cap_drop=["ALL"], security_opt=["no-new-privileges"], pids_limit=512,
                labels={f"{build.LABEL}.role": "deploy"})
            try:
                state = container.wait(timeout=timeout)
                if state.get("StatusCode") != 0:
                    tail = container.logs(tail=5).decode(errors="replace").strip().splitlines()
                    raise Refused(f"the deploy program ended with exit status {state.get('StatusCode')}"
                                  + (f": {tail[-1]}" if tail else ""))
            finally:
                container.remove(force=True)
        return read_rows(out, platforms)
