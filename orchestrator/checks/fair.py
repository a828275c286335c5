"""The fair profile's host side: the initial weights, and the checks that make it verifiable.

    weights     the same ``.npz`` for every framework's job of a data set and seed, drawn
                from the seed (``dlbench_runner.fair``, here ``networks``, holds the
                network, the draw and the file's layout) or the user's own
                (``--weights``, checked against the network before any job starts),
                written beside the job's spec
    reference   the fair network's forward pass in NumPy, float64, from the weights file:
                each framework's logits of the probe images before training are checked
                against it (``logit_error``)
    training    the fair training's first steps in NumPy, float64, under either max-pooling
                tie rule (``Layers``, ``reference_losses``): each framework's stored step
                losses are held to its own rule's (``TIE_RULES``, ``reference_curve``; the
                report computes it, report/verification.py)
    losses      each framework's step losses against the others' (``parting``)

A framework outside tolerance is a finding the report states, never a failed job.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import os
from pathlib import Path

import numpy as np

from dlbench_runner import contract, fair as networks

from .. import cache, files
from ..errors import DlbenchError, UsageError
from .base import After, Check, Found


LOGIT_TOLERANCE = 1e-4             # max |framework - reference| / max |reference|
LOSS_TOLERANCE = 1e-3              # |a - b| / |b| of two frameworks' loss at one step
AGREED_STEPS = 10                  # the first steps every framework's losses must share
ZIP_RECORDS = 64 << 10             # a weights file's zip records beside its arrays, at most


# -- the weights file ----------------------------------------------------------------------------
def job_input_names(job) -> list[str]:
    """The names of the files ``job_inputs`` gives the job (a container mounts each)."""
    return [networks.WEIGHTS_FILE] if job.profile == contract.FAIR_PROFILE else []


def job_inputs(job) -> dict[str, bytes]:
    """The files a job finds beside its spec (``jobdir.prepare``): a fair job's initial
    weights, the user's file (``--weights``) or those its seed draws."""
    return {name: _npz(job.dataset, job.seed, job.weights, job.weights_sha256) for name in job_input_names(job)}


@functools.lru_cache(maxsize=8)
def _npz(dataset: str, seed: int, path: str | None, digest: str | None) -> bytes:
    weights = _planned_weights(Path(path), dataset, digest) if path else networks.initial_weights(dataset, seed)
    buffer = io.BytesIO()
    np.savez(buffer, **weights)
    return buffer.getvalue()


def _planned_weights(path: Path, dataset: str, digest: str | None) -> dict:
    """The user's weights file read again as a job starts, as the plan found it (its
    ``digest``); else a ``UsageError``, the job's failed row: the file was replaced since
    (by a FIFO, which is refused at once, or by other weights)."""
    try:
        weights = load(path, dataset)
    except files.Refused as exc:
        raise UsageError(f"--weights {path}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"--weights {path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if networks.weights_digest(weights) != digest:
        raise UsageError(f"--weights {path}: the file changed after the run was planned; "
                         "its jobs would not start from the weights they name")
    return weights


def user_weights(path: Path, dataset: str) -> dict:
    """A weights file the user gave (``--weights``), checked against the network: a
    ``networks.WeightsError`` saying why not in one line (naming the layer that does not
    fit, or why the file was not read)."""
    try:
        arrays = load(path, dataset)
    except files.Refused as exc:
        raise networks.WeightsError(str(exc)) from None
    except OSError as exc:
        raise networks.WeightsError(f"cannot be read ({exc.strerror or type(exc).__name__})") from None
    networks.check_weights(arrays, dataset)
    return arrays


def load(path: Path, dataset: str) -> dict:
    """The arrays of a weights file for the data set's network, read as any file dlbench did
    not make (``files.read_npz``): a regular file (a FIFO is refused, never waited on),
    holding no array the network does not name, none larger than the network's, each
    header checked before any array is read; ``files.Refused`` (or the open's ``OSError``)
    else.  What it holds is checked against the network by ``networks.check_weights``."""
    names = [name for name, _ in networks.parameters(dataset)]
    unpacked = sum(4 * math.prod(shape) + files.NPY_HEADER_BYTES for _, shape in networks.parameters(dataset))
    data = files.read_regular(path, unpacked + ZIP_RECORDS)
    return files.read_npz(data, path.name, unpacked, len(names) + 1, names)   # one more to name


# -- the reference forward pass ------------------------------------------------------------------
def forward(weights: dict, x: np.ndarray, dataset: str) -> np.ndarray:
    """The logits of the fair network with these weights for the inputs ``x`` (N x C x H x
    W, as ``networks.inputs`` makes them), computed in float64 layer by layer."""
    x = np.asarray(x, np.float64)
    for layer in networks.NETWORKS[dataset]["layers"]:
        kind, name = layer["kind"], layer["name"]
        if kind == "conv":
            x = convolution(x, weights[f"{name}.weight"], weights[f"{name}.bias"], layer["pad"])
        elif kind == "pool":
            x = pooling(x, layer["mode"], layer["kernel"], layer["stride"])
        elif kind == "relu":
            x = np.maximum(x, 0.0)
        elif kind == "linear":
            x = x.reshape(len(x), -1) @ np.asarray(weights[f"{name}.weight"], np.float64).T \
                + weights[f"{name}.bias"]
        else:
            raise ValueError(f"layer {name}: unknown kind {kind!r}")
    return x


def convolution(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, pad: int) -> np.ndarray:
    """Cross-correlation, stride 1, ``pad`` zeros on every side: N x C x H x W by O x C x K x K."""
    n, _, h, w = x.shape
    k = weight.shape[-1]
    out = np.asarray(weight, x.dtype).reshape(len(weight), -1) @ columns(x, k, pad)
    out = out.reshape(len(weight), n, h + 2 * pad - k + 1, w + 2 * pad - k + 1).transpose(1, 0, 2, 3)
    return out + np.asarray(bias, x.dtype)[None, :, None, None]


def columns(x: np.ndarray, k: int, pad: int) -> np.ndarray:
    """im2col: the (C * K * K) x (N * Ho * Wo) matrix of every K x K window of ``x`` (padded),
    filled one kernel offset at a time (a plain copy each, where a strided view of all the
    windows would be gathered element by element)."""
    n, c, h, w = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - k + 1, w + 2 * pad - k + 1
    found = np.empty((c, k, k, n, oh, ow), x.dtype)
    for i in range(k):
        for j in range(k):
            found[:, i, j] = padded[:, :, i:i + oh, j:j + ow].transpose(1, 0, 2, 3)
    return found.reshape(c * k * k, n * oh * ow)


def pooling(x: np.ndarray, mode: str, kernel: int, stride: int) -> np.ndarray:
    """Max or average pooling with Caffe's ceil rule: the last window is cut at the border
    and an average divides by the inputs its window covers."""
    windows, counts = pooling_windows(x, mode, kernel, stride)
    if mode == "max":
        return windows.max(axis=(4, 5))
    return windows.sum(axis=(4, 5)) / counts


def pooling_windows(x: np.ndarray, mode: str, kernel: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pooling window of ``x`` as a view, N x C x Ho x Wo x K x K, the input padded
    after its last row and column to whole windows (with -inf for a maximum, 0 for an
    average), and the count of real inputs in each window (Ho x Wo)."""
    n, c, h, w = x.shape
    oh, ow = networks.pooled_size(h, kernel, stride), networks.pooled_size(w, kernel, stride)
    extra = ((oh - 1) * stride + kernel - h, (ow - 1) * stride + kernel - w)
    fill = -np.inf if mode == "max" else 0
    padded = np.pad(x, ((0, 0), (0, 0), (0, extra[0]), (0, extra[1])), constant_values=fill)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (kernel, kernel), axis=(2, 3))
    covered = np.pad(np.ones((h, w)), ((0, extra[0]), (0, extra[1])))
    counts = np.lib.stride_tricks.sliding_window_view(covered, (kernel, kernel))[::stride, ::stride]
    return windows[:, :, ::stride, ::stride], counts.sum(axis=(2, 3)).astype(x.dtype)


@functools.lru_cache(maxsize=4)
def probe_inputs(dataset: str, data_root: str, images: int) -> np.ndarray:
    """The network's input of the first ``images`` test images (the probe every fair job's
    logits are taken of before training)."""
    return networks.inputs(contract.formats.test_split(dataset, data_root)[0][:images], dataset)


class FairCheck(Check):
    """A fair job's initial weights staged beside its spec (``job_inputs``), and once it has
    trained: the weights' digest and its logits of the probe images against the reference
    from the same weights (those it was given, not its job directory's file, which a
    native job could replace), and its step losses (the ``steps`` side table)."""

    name = "fair"
    row_fields = {
        "fair_weights_sha256": (str | None, None),     # the initial weights' digest
        "fair_logit_error": (float | None, None),      # probe logits against the NumPy reference
    }

    def stage(self, job) -> dict[str, bytes]:
        return job_inputs(job)

    def found(self, after: After, result, taken) -> Found:
        fair_result = result.fair
        if fair_result is None or after.data_root is None:
            return Found()
        fields = {"fair_weights_sha256": fair_result.weights_sha256}
        given = after.staged.get(networks.WEIGHTS_FILE)
        if given is not None and fair_result.logits:
            with np.load(io.BytesIO(given)) as arrays:      # the host's own file
                weights = dict(arrays)
            probe = probe_inputs(after.job.dataset, str(after.data_root), len(fair_result.logits))
            fields["fair_logit_error"] = logit_error(fair_result.logits,
                                                     forward(weights, probe, after.job.dataset))
        steps = [{"step": step, "loss": loss} for step, loss in enumerate(fair_result.losses)]
        return Found(fields, sides={"steps": steps})


CHECK = FairCheck()


# -- the reference training ----------------------------------------------------------------------
# Which input of a max-pooling window with a tied maximum takes the window's gradient, by
# framework: "first", the first maximum in the window's row-major order (Caffe's, Torch7's and
# PyTorch's loops keep a maximum only where a later input is larger; TensorFlow and MXNet
# agree with them to float32 rounding on the committed rows); "every", each input equal to the
# maximum takes the whole gradient (Theano's MaxPoolGrad compares every input with the
# window's output).  The fair LeNet's pool1 sees many ties (the digits' blank background), so
# the two rules train apart from the first update on.
TIE_RULES = {"caffe": "first", "tensorflow": "first", "torch": "first", "pytorch": "first",
             "mxnet": "first", "theano": "every", "pytorch2": "first", "jax": "first"}
REFERENCE_STEPS = 10               # the first steps each framework is held to its rule's reference
REFERENCE_VERSION = 3              # of the reference training: a cached curve of another is not read
# |framework - reference| / |reference| of a step's loss over the first REFERENCE_STEPS steps,
# by data set, derived from float32 rounding (docs/fair.md): the reference computed in float32
# parts from the float64 one by at most 8.1e-8 on MNIST, below a loss's own float32 resolution
# (1.2e-7 near 2.3, and the frameworks store it in float32), so the tolerance is some 8 of
# those units; on CIFAR-10 by 1.1e-4 (its tiny first weights make its float32 sums cancel, and
# its differences grow tenfold a step at first), so twice that: 4.5 times below the 9e-4 the
# two tie rules' references part by, so that it tells them apart
REFERENCE_TOLERANCE = {"mnist": 1e-6, "cifar10": 2e-4}


class Layers:
    """The fair network's forward pass that keeps what its backward pass needs, and that
    backward pass, in ``dtype`` (float64 for the reference; float32 to see what rounding
    does).  ``ties`` is a TIE_RULES rule."""

    def __init__(self, dataset: str, ties: str, dtype=np.float64, broken: bool = False):
        """``broken``: under the every rule, a tie that rounding decides (``exact_maxima``)
        given to the first maximum, as a framework whose sums broke it would."""
        if ties not in ("first", "every"):
            raise ValueError(f"unknown tie rule {ties!r}")
        self.layers, self.ties, self.dtype = networks.NETWORKS[dataset]["layers"], ties, dtype
        self.broken = broken
        self.columns = {}       # each convolution's im2col matrix, from its forward pass

    def loss(self, weights: dict, x: np.ndarray, labels: np.ndarray) -> tuple[float, dict]:
        """The batch's mean softmax cross-entropy and its gradient for every parameter."""
        saved, h = [], np.asarray(x, self.dtype)
        for layer in self.layers:
            saved.append(h)
            h = self._forward(layer, weights, h)
        shifted = h - h.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        rows = np.arange(len(labels))
        loss = -log_p[rows, labels].mean()
        g = np.exp(log_p)
        g[rows, labels] -= 1
        g /= len(labels)
        gradients = {}
        for index in reversed(range(len(self.layers))):
            # the first layer's input gradient is not needed (nor computed in training)
            g = self._backward(self.layers[index], weights, saved[index], g, gradients, index > 0)
        return float(loss), gradients

    def _forward(self, layer: dict, weights: dict, h: np.ndarray) -> np.ndarray:
        kind, name = layer["kind"], layer["name"]
        if kind == "conv":
            weight, (n, _, height, width) = weights[f"{name}.weight"], h.shape
            k, pad = weight.shape[-1], layer["pad"]
            self.columns[name] = found = columns(h, k, pad)        # for the weight's gradient
            out = (weight.reshape(len(weight), -1) @ found).reshape(
                len(weight), n, height + 2 * pad - k + 1, width + 2 * pad - k + 1)
            return out.transpose(1, 0, 2, 3) + weights[f"{name}.bias"][None, :, None, None]
        if kind == "pool":
            return pooling(h, layer["mode"], layer["kernel"], layer["stride"])
        if kind == "relu":
            return np.maximum(h, 0)
        return h.reshape(len(h), -1) @ weights[f"{name}.weight"].T + weights[f"{name}.bias"]

    def _backward(self, layer: dict, weights: dict, h: np.ndarray, g: np.ndarray, gradients: dict,
                  input_gradient: bool = True):
        """The gradient of the layer's input from its output's, ``g`` (None where not
        ``input_gradient``); a parameter's into ``gradients``."""
        kind, name = layer["kind"], layer["name"]
        if kind == "relu":
            return g * (h > 0)
        if kind == "pool":
            k, s = layer["kernel"], layer["stride"]
            if self.broken and self.ties == "every" and layer["mode"] == "max":
                exact = exact_maxima(h, layer, self._bias_before(layer, weights))
                return (pooling_gradient(h, g * exact, "max", k, s, "every")
                        + pooling_gradient(h, g * ~exact, "max", k, s, "first"))
            return pooling_gradient(h, g, layer["mode"], k, s, self.ties)
        weight = weights[f"{name}.weight"]
        if kind == "linear":
            flat = h.reshape(len(h), -1)
            gradients[f"{name}.weight"], gradients[f"{name}.bias"] = g.T @ flat, g.sum(axis=0)
            return (g @ weight).reshape(h.shape)
        n, c, height, width = h.shape
        k, pad = weight.shape[-1], layer["pad"]
        out = g.transpose(1, 0, 2, 3).reshape(len(weight), -1)                 # O x (N Ho Wo)
        gradients[f"{name}.weight"] = (out @ self.columns.pop(name).T).reshape(weight.shape)
        gradients[f"{name}.bias"] = out.sum(axis=1)
        if not input_gradient:
            return None
        # col2im: each window's share of the input gradient added back where it came from
        shares = (weight.reshape(len(weight), -1).T @ out).reshape(c, k, k, n, g.shape[2], g.shape[3])
        padded = np.zeros((n, c, height + 2 * pad, width + 2 * pad), h.dtype)
        for i in range(k):
            for j in range(k):
                padded[:, :, i:i + g.shape[2], j:j + g.shape[3]] += shares[:, i, j].transpose(1, 0, 2, 3)
        return padded[:, :, pad:pad + height, pad:pad + width]


    def _bias_before(self, layer: dict, weights: dict) -> np.ndarray | None:
        """The bias of the convolution right before ``layer``, if one is."""
        index = next(i for i, other in enumerate(self.layers) if other is layer)
        before = self.layers[index - 1] if index else None
        return weights[f"{before['name']}.bias"] if before and before["kind"] == "conv" else None


def exact_maxima(x: np.ndarray, layer: dict, bias: np.ndarray | None) -> np.ndarray:
    """Which of max-pooling ``layer``'s windows over ``x`` have a maximum that every summation
    order computes alike: 0, or its channel's ``bias`` (a convolution's output over an all-zero
    patch).  A tie of other values (identical patches at other positions) is exact here, NumPy
    summing identical patches alike, and may not be in a framework, whose BLAS kernel can sum
    the same patch in another order at another position; under the every rule a broken tie is
    a whole share of gradient less, not a rounding error (docs/fair.md, and the measurement
    2026-11-28-theano-ties, where Theano's float32 convolutions break 18 of 41 such ties of
    pool2 at step 1)."""
    windows, _ = pooling_windows(x, "max", layer["kernel"], layer["stride"])
    top = windows.max(axis=(4, 5))
    exact = top == 0
    if bias is not None:
        exact |= top == np.asarray(bias, x.dtype)[None, :, None, None]
    return exact


def pooling_gradient(x: np.ndarray, g: np.ndarray, mode: str, kernel: int, stride: int, ties: str) -> np.ndarray:
    """The gradient of ``pooling``'s input from its output's ``g``: an average's to each
    input its window covers, over their count; a maximum's by the tie rule ``ties``."""
    n, c, h, w = x.shape
    windows, counts = pooling_windows(x, mode, kernel, stride)
    oh, ow = counts.shape
    if mode == "avg":
        shares = np.broadcast_to((g / counts)[..., None, None], windows.shape)
    elif ties == "every":
        shares = g[..., None, None] * (windows == windows.max(axis=(4, 5), keepdims=True))
    else:
        flat = windows.reshape(n, c, oh, ow, kernel * kernel)
        first = np.arange(kernel * kernel) == flat.argmax(axis=4)[..., None]
        shares = (g[..., None] * first).reshape(windows.shape)
    # each window's shares added back where its inputs came from, one kernel offset at a time
    out = np.zeros((n, c, (oh - 1) * stride + kernel, (ow - 1) * stride + kernel), x.dtype)
    for i in range(kernel):
        for j in range(kernel):
            out[:, :, i:i + (oh - 1) * stride + 1:stride, j:j + (ow - 1) * stride + 1:stride] += shares[..., i, j]
    return out[:, :, :h, :w]


def reference_losses(weights: dict, data: networks.FairData, steps: int, ties: str,
                     dtype=np.float64) -> np.ndarray:
    """``reference_training``'s losses."""
    return reference_training(weights, data, steps, ties, dtype)[0]


def reference_training(weights: dict, data: networks.FairData, steps: int, ties: str,
                       dtype=np.float64) -> tuple[np.ndarray, int]:
    """The fair training's first ``steps`` losses (each before its step's update) from
    ``weights`` on ``data``'s batches, under the tie rule ``ties``: the fair step, ``v =
    momentum * v + gradient; w = w - learning_rate * v``, constant learning rate, no weight
    decay (the fair profile's; Caffe's ``v = momentum * v + lr * gradient; w = w - v`` is
    the same rule).  Also how many of the first losses it predicts whatever a framework's
    rounding (``held``): under the every rule, the leading steps where the same training with
    every tie that rounding decides broken (``exact_maxima``) stays within the data set's
    REFERENCE_TOLERANCE of it; ``steps`` under the first rule, where breaking such a tie
    only moves a window's gradient between identical patches (the five first-rule frameworks
    follow the reference to float32 rounding over all 10 steps)."""
    losses = _training(Layers(data.dataset, ties, dtype), weights, data, steps, dtype)
    if ties == "first":
        return losses, steps
    broken = _training(Layers(data.dataset, ties, dtype, broken=True), weights, data, steps, dtype)
    apart = np.abs(losses - broken) > REFERENCE_TOLERANCE[data.dataset] * np.abs(losses)
    return losses, int(np.argmax(apart)) if apart.any() else steps


def _training(layers: Layers, weights: dict, data: networks.FairData, steps: int, dtype) -> np.ndarray:
    current = {name: np.asarray(array, dtype) for name, array in weights.items()}
    velocity = {name: np.zeros_like(array) for name, array in current.items()}
    rate, momentum = dtype(data.learning_rate), dtype(data.momentum)
    losses = []
    for step in range(steps):
        x, y = data.batch(step)
        loss, gradients = layers.loss(current, x, y)
        losses.append(loss)
        if step + 1 < steps:
            for name, gradient in gradients.items():
                velocity[name] = momentum * velocity[name] + gradient
                current[name] = current[name] - rate * velocity[name]
    return np.asarray(losses)


class ReferenceUnavailable(Exception):
    """A run whose reference training cannot be computed here; the message says why."""


def reference_curve(row, ties: str, data_root: Path, steps: int = REFERENCE_STEPS) -> np.ndarray:
    """The reference's first ``steps`` losses for a stored fair row (its data set, seed,
    settings and initial weights), under the tie rule ``ties``.  The job's weights file is
    removed once its row is made, so the weights are the seed's, drawn again, and must have
    the row's digest (a run from the user's own ``--weights`` cannot be checked afterwards).
    ``ReferenceUnavailable`` says why not."""
    return reference_check(row, ties, data_root, steps)[0]


def reference_check(row, ties: str, data_root: Path, steps: int = REFERENCE_STEPS) -> tuple[np.ndarray, int]:
    """``reference_curve``'s losses, and how many of the first it predicts whatever the
    framework's rounding (``reference_training``)."""
    weights = networks.initial_weights(row.dataset, int(row.seed))
    if networks.weights_digest(weights) != row.fair_weights_sha256:
        raise ReferenceUnavailable("its initial weights are not its seed's (a --weights file, gone)")
    hp = json.loads(row.hyperparameters)
    settings = (hp["batch_size"], hp["learning_rate"], hp["momentum"])
    return _reference_curve(row.dataset, int(row.seed), row.fair_weights_sha256, settings, ties,
                            str(data_root), steps)


@functools.lru_cache(maxsize=16)
def _reference_curve(dataset: str, seed: int, digest: str, settings: tuple, ties: str,
                     data_root: str, steps: int) -> tuple[np.ndarray, int]:
    """The reference training of ``reference_curve``, kept in the user cache (a CIFAR-10
    reference takes minutes on two CPUs; its losses are 80 bytes); a cache that cannot be
    read or written is computed past."""
    key = json.dumps([REFERENCE_VERSION, dataset, seed, digest, settings, ties, steps])
    try:
        path = cache.folder("fair-reference") / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
    except DlbenchError:
        path = None
    if path is not None:
        try:
            found = json.loads(path.read_text())
            kept, held = np.asarray(found["losses"], np.float64), found["held"]
            if kept.shape == (steps,) and np.isfinite(kept).all() and type(held) is int and 0 < held <= steps:
                return kept, held
        except (OSError, ValueError, KeyError, TypeError):
            pass
    try:
        arrays = contract.formats.load(dataset, data_root)
    except (OSError, contract.formats.DataError):
        raise ReferenceUnavailable(f"no readable {dataset} data set in {data_root} (--data-dir)") from None
    batch_size, learning_rate, momentum = settings
    hp = dict(contract.fair_hyperparameters(dataset), batch_size=batch_size,
              learning_rate=learning_rate, momentum=momentum, steps=steps)
    data = networks.FairData(arrays, dataset, hp, seed)
    losses, held = reference_training(networks.initial_weights(dataset, seed), data, steps, ties)
    if path is not None:
        written = path.with_name(f"{path.name}.{os.getpid()}")
        try:
            written.write_text(json.dumps({"key": json.loads(key), "losses": losses.tolist(), "held": held}))
            os.replace(written, path)
        except OSError:
            pass
    return losses, held


# -- the checks ----------------------------------------------------------------------------------
def logit_error(logits: np.ndarray, reference: np.ndarray) -> float:
    """How far a framework's logits are from the reference's: the largest absolute
    difference over the largest absolute reference logit."""
    logits, reference = np.asarray(logits, np.float64), np.asarray(reference, np.float64)
    if logits.shape != reference.shape:
        return float("inf")
    return float(np.max(np.abs(logits - reference)) / max(np.max(np.abs(reference)), 1e-30))


def parting(losses: np.ndarray, others: np.ndarray, tolerance: float = LOSS_TOLERANCE) -> int | None:
    """The first step (0-based) where two frameworks' losses differ by more than
    ``tolerance`` relative to the second's; None: never, over the steps both hold."""
    a, b = np.asarray(losses, np.float64), np.asarray(others, np.float64)
    steps = min(len(a), len(b))
    apart = np.abs(a[:steps] - b[:steps]) > tolerance * np.abs(b[:steps])
    return int(np.argmax(apart)) if apart.any() else None
