"""Migration: the trained model exported to ONNX, with what the host needs to check it.

After the robustness check, unless ``export_onnx`` is 0, the runner asks the adapter for
an ONNX graph of its trained model and writes, beside ``result.json``:

    model.onnx      the graph, as the adapter exported it
    migration.npz   ``predictions``: the classes the framework itself predicts for the
                    test images the job tested on (the first ``test_samples``): those its
                    test pass predicted, where the adapter's ``test`` gives them (all six
                    frameworks' do: the job's own test, not a second pass over the same
                    images), else from its ``predict`` in batches of ``PREDICT_BATCH``;
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

A framework without an ONNX exporter (or whose image cannot take one) describes its
model instead, and the host builds the graph (``orchestrator/checks/onnx_layers.py`` defines
the layers and their fields):

    def export_layers(self, pixels):
        # -> the trained model as a list of layers, each a dict: "op" and its fields,
        # arrays as numpy arrays of the framework's floating-point type; they map the
        # pixels above, through the model's own preprocessing, to what ``logits`` gives

The runner writes them as ``layers.json`` (the list, each array replaced by its name,
"<layer index>.<field>"; with the format's name and version, the pixels' shape and the
model's type: float64 when any array is) and ``layers.npz`` (the arrays), no model.onnx;
an adapter with ``export_onnx`` exports with it.

An adapter without them, or one whose ``export_onnx`` (``export_layers``) raises
``NoExport`` (or fails in any other way: the framework's exporter refuses an operator),
gets ``migration_reason`` in the result and no files: never a failed job.  The runner copies the model out of a
scratch folder of its own, so that an exporter's other files (external weights) never
reach the host, and refuses one larger than ``contract.MAX_MODEL_BYTES``.
"""

import json
import os
import shutil
import tempfile

import numpy as np

from . import contract, robustness
from .output import remove as _remove, write_atomic as _write_atomic

BATCH = 16              # test images whose logits the host compares, the first ones
PREDICT_BATCH = 500     # images per ``predict`` call, where the test pass gave no predictions
MODEL = "model.onnx"
COMPARED = "migration.npz"
LAYERS = "layers.json"
ARRAYS = "layers.npz"
LAYERS_FORMAT, LAYERS_VERSION = "dlbench-layers", 1


class NoExport(Exception):
    """The framework cannot export this model to ONNX; the message says why."""


def export(adapter, images, out_dir, predicted=None):
    """Export the adapter's model and its own predictions for ``images`` (uint8, the test
    images the job tested on) into ``out_dir``: ``predicted``, the test pass's classes for
    them where it gave them (one for each image), else its ``predict``'s; returns the
    result's fields: ``migration_reason`` (None when exported) and
    ``migration_model_bytes`` (None for a layer list: the host builds the model)."""
    x = robustness.pixels_of(images)
    try:
        if not (all(hasattr(adapter, name) for name in ("logits", "predict"))
                and (hasattr(adapter, "export_onnx") or hasattr(adapter, "export_layers"))):
            raise NoExport("this framework's adapter exports no ONNX model yet")
        if hasattr(adapter, "export_onnx"):
            size = _export_file(adapter, x[:BATCH], os.path.join(out_dir, MODEL))
        else:
            size = _export_layers(adapter, x[:BATCH], out_dir)
        if predicted is None or len(predicted) != len(x):
            predicted = np.concatenate([np.asarray(adapter.predict(x[start:start + PREDICT_BATCH]))
                                        for start in range(0, len(x), PREDICT_BATCH)])
        logits = np.asarray(adapter.logits(x[:BATCH]))
    except Exception as exc:        # the framework's exporter: any refusal is a reason
        for name in (MODEL, LAYERS, ARRAYS):
            _remove(os.path.join(out_dir, name))
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


def _export_layers(adapter, pixels, out_dir):
    """The adapter's layer list written as ``LAYERS`` and ``ARRAYS``; None (the model's
    size is the host's to know)."""
    listed, arrays = [], {}
    for index, layer in enumerate(adapter.export_layers(pixels)):
        entry = {}
        for key, value in dict(layer).items():
            if isinstance(value, np.ndarray):
                if value.dtype not in (np.float32, np.float64):
                    raise NoExport("the layer list's %s is %s, not float32 or float64"
                                   % ("%d.%s" % (index, key), value.dtype))
                entry[key] = "%d.%s" % (index, key)
                arrays[entry[key]] = np.ascontiguousarray(value)
            else:
                entry[key] = _plain(value)
        listed.append(entry)
    stored = sum(array.nbytes for array in arrays.values())
    if stored > contract.MAX_MODEL_BYTES:
        raise NoExport("the layer list's arrays are %d bytes, more than the %d a job may keep"
                       % (stored, contract.MAX_MODEL_BYTES))
    dtype = "float64" if any(a.dtype == np.float64 for a in arrays.values()) else "float32"
    text = json.dumps({"format": LAYERS_FORMAT, "version": LAYERS_VERSION, "dtype": dtype,
                       "input": [int(side) for side in pixels.shape[1:]], "layers": listed},
                      allow_nan=False)
    _write_atomic(os.path.join(out_dir, ARRAYS), lambda f: np.savez(f, **arrays))
    _write_atomic(os.path.join(out_dir, LAYERS), lambda f: f.write(text.encode()))
    return None


def _plain(value):
    """A field's value as JSON takes it: numpy's numbers as Python's, tuples as lists."""
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _copy(path, f):
    with open(path, "rb") as source:
        shutil.copyfileobj(source, f)
