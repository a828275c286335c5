"""Transfer attacks: a framework's FGSM images tried on every other framework's model.

The runner keeps the FGSM images it crafted at ``pgd_epsilon`` as ``transfer.npz`` in the
job's out/ (the runner's ``robustness.py`` says what it holds).  Once the job has ended the
host takes the file (``taken``: a regular file of at most ``MAX_TRANSFER_BYTES``, read as
any of a job's output, that ``read`` finds valid) and stores it as it is, beside the job's
row, as ``RESULTS/transfer/<run id>.npz``.  What it holds is checked again where it is used
(``read``): a results directory is as untrusted as a job's out/.  ``accuracies`` runs an ONNX model
(``RESULTS/models/<run id>.onnx``) on such images, as an untrusted program in a child
process (``untrusted``); the report builds its matrices of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from dlbench_runner.contract import IMAGE_SHAPES, MAX_MODEL_BYTES, MAX_TRANSFER_BYTES, TEST_IMAGES, TRANSFER_FILE

from .. import files, jobdir
from . import untrusted
from .base import After, Check, Found
from .migration import CLASSES, Refused

MEMBERS = ("images", "labels", "epsilon")
HEADER_BYTES = 1024         # an .npy member's header, at most (numpy writes 128 bytes)


class Images(NamedTuple):
    """A run's FGSM images, checked."""

    images: np.ndarray      # float32 pixels in [0, 1], the data set's layout
    labels: np.ndarray      # their classes
    epsilon: float


def taken(job_dir: Path, dataset: str) -> tuple[bytes | None, str | None]:
    """The FGSM images a job left in its out/, as they are, or None and why the host did
    not take the file it left (a link, a FIFO, one past ``MAX_TRANSFER_BYTES``, one that
    ``read`` refuses: a header that lies about its shape would be stored unread, and break
    every report of the folder that reads it); (None, None) where it left none."""
    data, problem = jobdir.read_output(job_dir, TRANSFER_FILE, MAX_TRANSFER_BYTES)
    if data is None:
        return None, None if problem == jobdir.absent(TRANSFER_FILE) else problem
    try:
        read(data, dataset)
    except Refused as exc:
        return None, str(exc)
    return data, None


def load(path: Path, dataset: str) -> Images:
    """The stored images of ``path`` (``store.transfer_path``), checked (``read``)."""
    return read(_stored(path, MAX_TRANSFER_BYTES), dataset)


def read_model(path: Path) -> bytes:
    """A stored ONNX model (``store.model_path``): a regular file within the model's cap."""
    return _stored(path, MAX_MODEL_BYTES)


def _stored(path: Path, limit: int) -> bytes:
    try:
        return files.read_regular(path, limit, follow_links=False)
    except files.Refused as exc:
        raise Refused(f"{path.parent.name}/{path.name} is {exc}") from None
    except OSError as exc:
        raise Refused(f"{path.parent.name}/{path.name} cannot be read "
                      f"({exc.strerror or type(exc).__name__})") from None


def read(data: bytes, dataset: str) -> Images:
    """The images, labels and epsilon of a transfer file, each checked: a zip of the three
    arrays, none pickled, none larger than the data set's test split would make it, the
    images N x the data set's image shape, float32 pixels in [0, 1], N labels of 0 to 9,
    epsilon in [0, 1]; else ``Refused`` with the reason."""
    shape, most = IMAGE_SHAPES.get(dataset), TEST_IMAGES.get(dataset, 0)
    if shape is None:
        raise Refused(f"no transfer attacks on data set {dataset!r}")
    bound = most * int(np.prod(shape)) * 4 + HEADER_BYTES      # float32 images
    try:
        arrays = files.read_npz(data, TRANSFER_FILE, bound + most * 8 + 2 * HEADER_BYTES + 8,
                                len(MEMBERS) + 1, MEMBERS)  # images, int64 labels, epsilon; one more to name
    except files.Refused as exc:
        raise Refused(str(exc)) from None
    if sorted(arrays) != sorted(MEMBERS):
        raise Refused(f"{TRANSFER_FILE} is invalid: it holds {', '.join(f'{n}.npy' for n in sorted(arrays)) or 'nothing'}, "
                      f"not {', '.join(MEMBERS)}")
    images, labels, epsilon = (arrays[name] for name in MEMBERS)
    layout = "x".join(map(str, shape))
    if (images.dtype != np.float32 or images.shape[1:] != shape or not 1 <= len(images) <= most
            or images.ndim != 1 + len(shape)):
        raise Refused(f"{TRANSFER_FILE} is invalid: images must be 1 to {most} float32 images "
                      f"of {layout}, not {images.dtype} {'x'.join(map(str, images.shape))}")
    if not (np.isfinite(images).all() and images.min() >= 0 and images.max() <= 1):
        raise Refused(f"{TRANSFER_FILE} is invalid: pixels must be in [0, 1]")
    if (labels.shape != (len(images),) or labels.dtype.kind not in "iu"
            or ((labels < 0) | (labels >= CLASSES)).any()):
        raise Refused(f"{TRANSFER_FILE} is invalid: labels must be one class of 0 to "
                      f"{CLASSES - 1} per image")
    if epsilon.shape != () or epsilon.dtype.kind != "f" or not 0 <= float(epsilon) <= 1:
        raise Refused(f"{TRANSFER_FILE} is invalid: epsilon must be one number in [0, 1]")
    return Images(images, labels, float(epsilon))


def accuracies(model: bytes, sets: list[Images]) -> list[float | Refused]:
    """The fraction of each set's images the ONNX model classifies as their labels
    (onnxruntime's CPU provider, the model loaded once in a child process within the host's
    limits: ``untrusted``; a report's column of a matrix); a set it cannot run has the
    ``Refused`` that says why."""
    found = untrusted.classify(model, [images.images for images in sets])
    return [result if isinstance(result, Refused) else float(np.mean(result[0] == images.labels))
            for result, images in zip(found, sets)]


class TransferCheck(Check):
    """The FGSM images a job kept, taken once it has ended (``taken``) and stored beside
    its ok row as they are; ``transfer_reason`` says why a file it left was not taken."""

    name = "transfer"
    row_fields = {"transfer_reason": (str | None, None)}

    def take(self, after: After, stop, before) -> tuple[bytes | None, str | None]:
        return taken(after.job_dir, after.job.dataset)

    def found(self, after: After, result, kept: tuple[bytes | None, str | None]) -> Found:
        images, reason = kept or (None, None)
        return Found({"transfer_reason": reason}, files={} if images is None else {"transfer": images})


CHECK = TransferCheck()
