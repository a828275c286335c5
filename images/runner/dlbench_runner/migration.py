"""Migration: the trained model exported to ONNX, with what the host needs to check it.

After the robustness check, unless ``export_onnx`` is 0, the runner asks the adapter for
an ONNX graph of its trained model and writes, beside ``result.json``:

    model.onnx      the graph, as the adapter exported it
    migration.npz   ``predictions``: the classes the framework itself predicts for the
                    test images the job tested on (the first ``test_samples``), from the
                    adapter's ``predict`` in batches of ``robustness.BATCH``;
                    ``logits``: the framework's own outputs for the first ``BATCH``
                    test images (``logits`` below), in its own floating-point type

The host runs the graph with onnxruntime on the same images and compares.  The graph is
the model's view of pixels, as the robustness check sees it, so that one graph holds
everything between a test image and its class:

    def export_onnx(self, path, pixels):
        # write the trained model as one ONNX file at ``path``: its one input the pixels,
        # float32, in the [0, 1] scale and the data set's own layout with a free batch
        # dimension (MNIST N x 28 x 28, CIFAR-10 N x 3 x 32 x 32), the model's own
        # preprocessing inside the graph; its first output N x 10, the classes' logits
        # or log-probabilities (what ``logits`` gives).  ``pixels``: a batch of real
        # test images in that form, for an exporter that traces the model.
    def logits(self, pixels):
        # -> the framework's own N x 10 outputs for ``pixels``, as the graph computes them
    def predict(self, pixels):
        # -> the classes the model predicts (the robustness check's)

An adapter without them, or one whose ``export_onnx`` raises ``NoExport`` (or fails in
any other way: the framework's exporter refuses an operator), gets ``migration_reason``
in the result and no files: never a failed job.  The runner copies the model out of a
scratch folder of its own, so that an exporter's other files (external weights) never
reach the host, and refuses one larger than ``contract.MAX_MODEL_BYTES``.
"""

import os
import shutil
import tempfile

import numpy as np

from . import contract, robustness
from .output import remove as _remove, write_atomic as _write_atomic

BATCH = 16              # test images whose logits the host compares, the first ones
MODEL = "model.onnx"
COMPARED = "migration.npz"


class NoExport(Exception):
    """The framework cannot export this model to ONNX; the message says why."""


def export(adapter, images, out_dir):
    """Export the adapter's model and its own predictions for ``images`` (uint8, the test
    images the job tested on) into ``out_dir``; returns the result's fields:
    ``migration_reason`` (None when exported) and ``migration_model_bytes``."""
    x = robustness.pixels_of(images)
    try:
        if not all(hasattr(adapter, name) for name in ("export_onnx", "logits", "predict")):
            raise NoExport("this framework's adapter exports no ONNX model yet")
        size = _export_file(adapter, x[:BATCH], os.path.join(out_dir, MODEL))
        predicted, = robustness._batched(adapter.predict, x)
        logits = np.asarray(adapter.logits(x[:BATCH]))
    except Exception as exc:        # the framework's exporter: any refusal is a reason
        _remove(os.path.join(out_dir, MODEL))
        reason = str(exc) if isinstance(exc, NoExport) else "%s: %s" % (type(exc).__name__, exc)
        return {"migration_reason": " ".join(reason.split())[:500] or type(exc).__name__,
                "migration_model_bytes": None}
    _write_atomic(os.path.join(out_dir, COMPARED),
                  lambda f: np.savez(f, predictions=np.asarray(predicted, dtype=np.int64), logits=logits))
    return {"migration_reason": None, "migration_model_bytes": size}


def _export_file(adapter, pixels, final):
    """The adapter's export into a scratch folder, its model copied to ``final``; its size."""
    folder = tempfile.mkdtemp(prefix="dlbench-onnx-")
    try:
        path = os.path.join(folder, MODEL)
        adapter.export_onnx(path, pixels)
        if not os.path.isfile(path) or not os.path.getsize(path):
            raise NoExport("the adapter's export wrote no model")
        others = sorted(set(os.listdir(folder)) - {MODEL})
        if others:
            # onnxruntime would look for them beside the host's copy, which has only the model
            raise NoExport("the exporter wrote the model's weights to other files (%s): dlbench "
                           "keeps one self-contained ONNX file" % ", ".join(others[:3]))
        size = os.path.getsize(path)
        if size > contract.MAX_MODEL_BYTES:
            raise NoExport("the ONNX model is %d bytes, more than the %d a job may keep"
                           % (size, contract.MAX_MODEL_BYTES))
        _write_atomic(final, lambda f: _copy(path, f))
        return size
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _copy(path, f):
    with open(path, "rb") as source:
        shutil.copyfileobj(source, f)
