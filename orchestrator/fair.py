"""The fair profile's host side: the initial weights, and the checks that make it verifiable.

    weights     the same ``.npz`` for every framework's job of a data set and seed, drawn
                from the seed (``dlbench_runner.fair``, here ``networks``, holds the
                network, the draw and the file's layout) or the user's own
                (``--weights``, checked against the network before any job starts),
                written beside the job's spec
    reference   the fair network's forward pass in NumPy, float64, from the weights file:
                each framework's logits of the probe images before training are checked
                against it (``logit_error``)
    losses      each framework's step losses against the others' (``parting``)

A framework outside tolerance is a finding the report states, never a failed job.
"""

from __future__ import annotations

import functools
import io
import math
from pathlib import Path

import numpy as np

from dlbench_runner import contract, fair as networks

from . import files
from .errors import UsageError


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


def job_weights(job_dir: Path, dataset: str) -> dict | None:
    """The weights a fair job was given (its ``weights.npz``); None: it was given none, or
    the file is no longer one the host reads (a native job can replace it)."""
    try:
        return load(Path(job_dir) / networks.WEIGHTS_FILE, dataset)
    except (OSError, files.Refused):
        return None


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
    k = weight.shape[-1]
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (k, k), axis=(2, 3))  # N C Ho Wo K K
    out = np.tensordot(windows, np.asarray(weight, np.float64), axes=([1, 4, 5], [1, 2, 3]))
    return out.transpose(0, 3, 1, 2) + np.asarray(bias, np.float64)[None, :, None, None]


def pooling(x: np.ndarray, mode: str, kernel: int, stride: int) -> np.ndarray:
    """Max or average pooling with Caffe's ceil rule: the last window is cut at the border
    and an average divides by the inputs its window covers."""
    n, c, h, w = x.shape
    oh, ow = networks.pooled_size(h, kernel, stride), networks.pooled_size(w, kernel, stride)
    out = np.empty((n, c, oh, ow))
    reduce = np.max if mode == "max" else np.mean
    for i in range(oh):
        for j in range(ow):
            window = x[:, :, i * stride:min(i * stride + kernel, h), j * stride:min(j * stride + kernel, w)]
            out[:, :, i, j] = reduce(window, axis=(2, 3))
    return out


@functools.lru_cache(maxsize=4)
def probe_inputs(dataset: str, data_root: str, images: int) -> np.ndarray:
    """The network's input of the first ``images`` test images (the probe every fair job's
    logits are taken of before training)."""
    return networks.inputs(contract.formats.test_split(dataset, data_root)[0][:images], dataset)


def checked(fair_result, job_dir: Path, dataset: str, data_root: Path, run_id: str) -> tuple[dict, list[dict]]:
    """A fair job's row fields (the weights' digest, its logits against the reference) and
    its step-loss rows."""
    fields = {"fair_weights_sha256": fair_result.weights_sha256}
    weights = job_weights(job_dir, dataset)
    if weights is not None and fair_result.logits:
        probe = probe_inputs(dataset, str(data_root), len(fair_result.logits))
        fields["fair_logit_error"] = logit_error(fair_result.logits, forward(weights, probe, dataset))
    steps = [{"run_id": run_id, "step": step, "loss": loss} for step, loss in enumerate(fair_result.losses)]
    return fields, steps


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
