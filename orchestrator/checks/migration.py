"""The migration check on the host: a job's exported ONNX model run with onnxruntime.

The runner leaves ``model.onnx`` and ``migration.npz`` in the job's out/ (the runner's
``migration.py`` says what they hold), or instead of the model the layer list of a
framework without an ONNX exporter, ``layers.json`` and ``layers.npz``, which the host
makes into the ONNX model (``onnx_layers``: a list that cannot be is a reason, like a
model that cannot be run).  Once the job has ended, ``evaluate`` reads both
as hostile input (``jobdir.read_output``: regular files only, size-capped; the arrays
without pickles), runs the model with onnxruntime's CPU provider on the test images the
framework predicted (the first ones of the test split, read with the runner's own
readers and scaled to pixels as the runner scales them) in a child process within the
host's limits (``untrusted``: a job's model is an untrusted program; nothing stored as
external data, a wall-clock, CPU and memory limit), and compares:

    migrated_accuracy           the fraction of those images the ONNX model classifies right
    migration_mismatches        how many it classifies otherwise than the framework itself
    migration_max_logit_error   on the runner's batch (its first images), the largest of
                                max |ONNX - own| / max |own| over each image's outputs
    migration_reason            why they are empty

Whatever onnxruntime makes of the file (it cannot load it, an operator it lacks, a wrong
shape, a limit it meets) is a reason, never a failed job; the file is still stored, so
that it can be looked at.  ``MigrationCheck`` puts the figures into an ok row; ``store``
keeps the file as ``RESULTS/models/<run id>.onnx``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from pathlib import Path

import numpy as np

from dlbench_runner.contract import MAX_MODEL_BYTES, TEST_IMAGES, formats

from .. import files, jobdir
from . import untrusted
from .base import After, Check, Found
from .untrusted import Refused     # why the files cannot be checked: the reason in the row

MODEL = "model.onnx"
COMPARED = "migration.npz"
MAX_COMPARED_BYTES = 1 << 20    # 10,000 predictions and a batch of logits: ~90 KB
CLASSES = untrusted.CLASSES


@dataclasses.dataclass(frozen=True)
class Migration:
    """What the host found of a job's exported model."""

    images: int | None = None               # the test images the framework predicted
    migrated_accuracy: float | None = None
    migration_mismatches: int | None = None
    migration_max_logit_error: float | None = None
    migration_reason: str | None = None
    model: bytes | None = None              # the ONNX file, to store
    predictions: np.ndarray | None = None   # the framework's own classes of those images
    logits: np.ndarray | None = None        # its outputs of the first of them
    seconds: float | None = None            # the check's time on the host

    def fields(self) -> dict:
        """The row's columns."""
        return dict(migrated_accuracy=self.migrated_accuracy,
                    migration_mismatches=self.migration_mismatches,
                    migration_max_logit_error=self.migration_max_logit_error,
                    migration_reason=self.migration_reason, migration_host_time_s=self.seconds)


def evaluate(job_dir: Path, dataset: str, data_root: Path,
             stop: threading.Event | None = None) -> Migration | None:
    """The check of the model a job left in its out/, or None when it left none (the
    runner did not export: the result says why; or the job failed before); its
    ``seconds``, what it took.  ``stop``: an event that ends the model's run early."""
    started = time.perf_counter()
    found = _evaluate(job_dir, dataset, data_root, stop)
    return found and dataclasses.replace(found, seconds=time.perf_counter() - started)


def _evaluate(job_dir: Path, dataset: str, data_root: Path, stop) -> Migration | None:
    compared, problem = jobdir.read_output(job_dir, COMPARED, MAX_COMPARED_BYTES)
    if compared is None and problem == jobdir.absent(COMPARED):
        return None
    model, model_problem = jobdir.read_output(job_dir, MODEL, MAX_MODEL_BYTES)
    try:
        if compared is None:
            raise Refused(problem)
        if model is None and model_problem != jobdir.absent(MODEL):
            raise Refused(model_problem)
        predictions, own_logits = _arrays(compared, dataset)
        images, labels = test_split(dataset, data_root)
        if model is None:
            model = _from_layers(job_dir, dataset, images.shape[1:])
        found = run_model(model, images[:len(predictions)], len(own_logits), stop)
    except Refused as exc:
        return Migration(migration_reason=str(exc), model=model)
    classes, logits = found
    return Migration(images=len(predictions),
                     migrated_accuracy=float(np.mean(classes == labels[:len(predictions)])),
                     migration_mismatches=int(np.count_nonzero(classes != predictions)),
                     migration_max_logit_error=logit_error(logits, own_logits),
                     model=model, predictions=predictions, logits=own_logits)


def test_split(dataset: str, data_root: Path) -> tuple[np.ndarray, np.ndarray]:
    """The data set's test images and labels, read-only, read once a run rather than once a
    job (CIFAR-10's test batch is 0.2 s of decompression); read again where a file of the
    data set changed (its size or time)."""
    return _read_test_split(dataset, os.fspath(data_root), data_state(dataset, data_root))


def data_state(dataset: str, data_root: Path) -> tuple:
    """What a data set's files are now (path, size, time of each): the key of a cache of
    what is read of them."""
    files = sorted(path for path in (Path(data_root) / dataset).rglob("*") if path.is_file())
    return tuple((str(path), path.stat().st_size, path.stat().st_mtime_ns) for path in files)


@functools.lru_cache(maxsize=2)
def _read_test_split(dataset: str, data_root: str, state: tuple) -> tuple[np.ndarray, np.ndarray]:
    arrays = formats.test_split(dataset, data_root)
    for array in arrays:
        array.flags.writeable = False
    return arrays


def _arrays(data: bytes, dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """The framework's predictions and its batch of logits, checked."""
    try:
        arrays = files.read_npz(data, COMPARED, MAX_COMPARED_BYTES, 2, ("predictions", "logits"))
        predictions, logits = arrays["predictions"], arrays["logits"]
    except files.Refused as exc:
        raise Refused(str(exc)) from None
    except KeyError as exc:
        raise Refused(f"{COMPARED} is invalid: it has no array {exc}") from None
    most = TEST_IMAGES.get(dataset, 0)
    if (predictions.ndim != 1 or predictions.dtype.kind not in "iu" or not 1 <= len(predictions) <= most
            or ((predictions < 0) | (predictions >= CLASSES)).any()):
        raise Refused(f"{COMPARED} is invalid: predictions must be 1 to {most} classes of 0 to {CLASSES - 1}")
    if (logits.ndim != 2 or logits.dtype.kind != "f" or not 1 <= len(logits) <= len(predictions)
            or logits.shape[1] != CLASSES or not np.isfinite(logits).all()):
        raise Refused(f"{COMPARED} is invalid: logits must be N x {CLASSES} finite numbers")
    return predictions, logits


def _from_layers(job_dir: Path, dataset: str, pixels: tuple[int, ...]) -> bytes:
    """The ONNX model built from the layer list the runner wrote instead of a model."""
    from . import onnx_layers       # its layers' pydantic models: not for a command that reads rows

    listing, problem = jobdir.read_output(job_dir, onnx_layers.LAYERS, onnx_layers.MAX_LIST_BYTES)
    if listing is None:
        raise Refused(f"the runner wrote no {MODEL} and no {onnx_layers.LAYERS}"
                      if problem == jobdir.absent(onnx_layers.LAYERS) else problem)
    arrays, problem = jobdir.read_output(job_dir, onnx_layers.ARRAYS, onnx_layers.MAX_ARRAY_BYTES)
    if arrays is None:
        raise Refused(problem)
    try:
        layers, found = onnx_layers.read(listing, arrays)
        if tuple(layers.input) != pixels:
            raise onnx_layers.Refused(f"{onnx_layers.LAYERS} takes images of {'x'.join(map(str, layers.input))}, "
                                      f"not {dataset}'s {'x'.join(map(str, pixels))}")
        model, shape = onnx_layers.build(layers, found)
        if shape != (CLASSES,):
            raise onnx_layers.Refused(f"the layers of {onnx_layers.LAYERS} end in "
                                      f"{'x'.join(map(str, shape))} per image, not {CLASSES} outputs")
    except onnx_layers.Refused as exc:
        raise Refused(str(exc)) from None
    if len(model) > MAX_MODEL_BYTES:
        raise Refused(f"the ONNX model built from {onnx_layers.LAYERS} is {len(model)} bytes, "
                       f"more than the {MAX_MODEL_BYTES} a job may keep")
    return model


def run_model(model: bytes, images: np.ndarray, first: int = 0,
              stop: threading.Event | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The ONNX model's classes for ``images`` (the data set's bytes, scaled to pixels
    as the runner scales them, or pixels already: float32 in [0, 1]) and its outputs for
    the ``first`` of them, computed in a child process within the host's limits
    (``untrusted``); ``Refused`` with the reason where it cannot run the model."""
    found, = untrusted.classify(model, [images], first, stop)
    if isinstance(found, Refused):
        raise found
    return found


def logit_error(found: np.ndarray, expected: np.ndarray) -> float:
    """The largest, over images, of max |found - expected| / max |expected| of that image's
    outputs (in float64; an image whose outputs are all 0 counts its absolute error)."""
    found, expected = np.asarray(found, np.float64), np.asarray(expected, np.float64)
    scale = np.abs(expected).max(axis=1)
    error = np.abs(found - expected).max(axis=1) / np.where(scale > 0, scale, 1.0)
    return float(error.max())


class MigrationCheck(Check):
    """The migration check in the after-training stage: the model taken once the job has
    ended (``evaluate``), its figures in an ok row, the file stored beside it."""

    name = "migration"
    row_fields = {
        "migrated_accuracy": (float | None, None),
        "migration_mismatches": (int | None, None),        # images classified otherwise than by the framework
        "migration_max_logit_error": (float | None, None),  # relative, on the runner's batch
        "migration_reason": (str | None, None),            # why the three above are empty
        "migration_model_bytes": (int | None, None),       # RESULTS/models/<run id>.onnx
        "migration_time_s": (float | None, None),          # the export in the job, outside every span
        "migration_host_time_s": (float | None, None),     # the ONNX run on the host, after the job
    }

    def take(self, after: After, stop, before) -> Migration | None:
        return evaluate(after.job_dir, after.job.dataset, after.data_root, stop=stop)

    def found(self, after: After, result, taken: Migration | None) -> Found:
        found = _migrated(result, taken)
        # the host's model is the one stored: a layer list's is built on the host
        fields = dict(found.fields(), migration_time_s=result.migration_time_s,
                      migration_model_bytes=(result.migration_model_bytes if found.model is None
                                             else len(found.model)))
        return Found(fields, files={} if found.model is None else {"model": found.model})


CHECK = MigrationCheck()


def _migrated(result, migration: Migration | None) -> Migration:
    """The migration check of an ok result: the runner's reason where it exported nothing
    (nothing at all from a runner before the check), else what the host found, on the
    images the job tested on."""
    if result.migration_time_s is None or result.migration_reason is not None:
        return Migration(migration_reason=result.migration_reason)
    if migration is None:
        return Migration(migration_reason="the job left no ONNX model to check")
    if migration.migration_reason is None and migration.images != result.test_samples:
        return Migration(migration_reason=f"the framework predicted {migration.images} test images, "
                                          f"not the {result.test_samples} it tested",
                         model=migration.model, seconds=migration.seconds)
    return migration
