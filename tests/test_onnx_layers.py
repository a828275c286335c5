"""The host's builder of ONNX graphs from layer lists (orchestrator/checks/onnx_layers.py).

Each kind of layer is built into a graph, run with the real onnxruntime, and held
against a NumPy reference written from the format's definition (in float64, loops over
windows as Caffe's own pooling loops); the files are hostile input.
"""

from __future__ import annotations

import io
import json
import math
import zipfile

import numpy as np
import onnx
import onnxruntime
import pytest

from orchestrator.checks import onnx_layers
from orchestrator.checks.onnx_layers import Refused


def files(layers: list[dict], arrays: dict, shape, dtype="float32", **header) -> tuple[bytes, bytes]:
    """layers.json and layers.npz as the runner writes them."""
    document = {"format": "dlbench-layers", "version": 1, "dtype": dtype, "input": list(shape), "layers": layers}
    document.update(header)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return json.dumps(document).encode(), buffer.getvalue()


def run(layers, arrays, pixels, dtype="float32"):
    """The graph built from the list, run by onnxruntime on ``pixels``; and the model."""
    listing, found = onnx_layers.read(*files(layers, arrays, pixels.shape[1:], dtype))
    model, shape = onnx_layers.build(listing, found)
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    output = session.run(None, {"pixels": pixels.astype(np.float32)})[0]
    assert output.shape[1:] == shape
    return output, onnx.load_from_string(model)


# -- the reference: the format's definition, in float64 -------------------------------
def pooled_side(size, kernel, stride, before, after, ceil):
    if not ceil:
        return (size + before + after - kernel) // stride + 1
    side = int(math.ceil(float(size + before + after - kernel) / stride)) + 1
    return side - 1 if (side - 1) * stride >= size + before else side


def reference(layers, arrays, pixels):
    x = pixels.astype(np.float64)

    def value(layer, key, default):
        found = layer.get(key, default)
        return arrays[found].astype(np.float64) if isinstance(found, str) else found

    for layer in layers:
        op = layer["op"]
        if op == "affine":
            x = x * value(layer, "scale", 1.0) + value(layer, "shift", 0.0)
        elif op == "pad":
            t, l, b, r = layer["pads"]
            x = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=layer.get("value", 0.0))
        elif op == "reshape":
            x = x.reshape(len(x), *layer["shape"])
        elif op == "flatten":
            x = x.reshape(len(x), -1)
        elif op == "conv":
            w = value(layer, "weight", None)
            t, l, b, r = layer.get("pads", (0, 0, 0, 0))
            sh, sw = layer.get("stride", (1, 1))
            group = layer.get("group", 1)
            xp = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))
            oh, ow = (xp.shape[2] - w.shape[2]) // sh + 1, (xp.shape[3] - w.shape[3]) // sw + 1
            out = np.zeros((len(x), w.shape[0], oh, ow))
            per_in, per_out = w.shape[1], w.shape[0] // group
            for n in range(len(x)):
                for o in range(w.shape[0]):
                    g = o // per_out
                    for i in range(oh):
                        for j in range(ow):
                            window = xp[n, g * per_in:(g + 1) * per_in, i * sh:i * sh + w.shape[2],
                                        j * sw:j * sw + w.shape[3]]
                            out[n, o, i, j] = (window * w[o]).sum()
            if layer.get("bias") is not None:
                out += value(layer, "bias", None)[:, None, None]
            x = out
        elif op == "pool":
            (kh, kw), (sh, sw) = layer["kernel"], layer["stride"]
            t, l, b, r = layer.get("pads", (0, 0, 0, 0))
            ceil, h, w = layer.get("ceil", False), x.shape[2], x.shape[3]
            oh, ow = pooled_side(h, kh, sh, t, b, ceil), pooled_side(w, kw, sw, l, r, ceil)
            out = np.zeros(x.shape[:2] + (oh, ow))
            for i in range(oh):
                for j in range(ow):
                    hs, ws = i * sh - t, j * sw - l
                    he, we = min(hs + kh, h + b), min(ws + kw, w + r)     # clipped to the padded input
                    window = x[:, :, max(hs, 0):min(he, h), max(ws, 0):min(we, w)]
                    if layer["mode"] == "max":
                        out[:, :, i, j] = window.max(axis=(2, 3))
                    else:
                        divisor = {"padded": (he - hs) * (we - ws), "window": kh * kw,
                                   "valid": window.shape[2] * window.shape[3]}[layer.get("divisor", "valid")]
                        out[:, :, i, j] = window.sum(axis=(2, 3)) / divisor
            x = out
        elif op == "dense":
            x = x @ value(layer, "weight", None).T
            if layer.get("bias") is not None:
                x = x + value(layer, "bias", None)
        elif op == "relu":
            x = np.maximum(x, 0)
        elif op == "tanh":
            x = np.tanh(x)
        elif op == "sigmoid":
            x = 1 / (1 + np.exp(-x))
        elif op == "contrast":
            x = x.copy()
            x[:, layer["channel"]] = contrast(x[:, layer["channel"]], arrays[layer["kernel"]].astype(np.float64),
                                              layer["threshold"], layer["value"])
        elif op in ("softmax", "log_softmax"):
            z = x - x.max(axis=1, keepdims=True)
            x = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
            x = x if op == "log_softmax" else np.exp(x)
        # TensorFlow's input pipeline and normalisation
        elif op == "crop":
            (kh, kw), offset = layer["size"], layer.get("offset")
            top, left = offset if offset is not None else ((x.shape[2] - kh) // 2, (x.shape[3] - kw) // 2)
            x = x[:, :, top:top + kh, left:left + kw]
        elif op == "standardize":
            axes = tuple(range(1, x.ndim))
            floor = 1 / math.sqrt(math.prod(x.shape[1:]))
            x = (x - x.mean(axis=axes, keepdims=True)) / np.maximum(x.std(axis=axes, keepdims=True), floor)
        elif op == "lrn":
            r, bias, alpha, beta = (layer["radius"], layer.get("bias", 1.0), layer.get("alpha", 1.0),
                                    layer.get("beta", 0.5))
            sums = np.stack([(x[:, max(0, c - r):c + r + 1] ** 2).sum(axis=1) for c in range(x.shape[1])], axis=1)
            x = x / (bias + alpha * sums) ** beta
    return x


def smoothed(planes, taps):
    """Each N x H x W plane's centred cross-correlation with taps down, then across, over
    its zero padding, by loops."""
    half, (n, h, w) = len(taps) // 2, planes.shape
    padded = np.pad(planes, ((0, 0), (half, half), (half, half)))
    down = np.zeros((n, h, w + 2 * half))
    for i in range(h):
        for k, tap in enumerate(taps):
            down[:, i] += tap * padded[:, i + k]
    out = np.zeros((n, h, w))
    for j in range(w):
        for k, tap in enumerate(taps):
            out[:, :, j] += tap * down[:, :, j + k]
    return out


def contrast(planes, kernel, threshold, value):
    """nn.SpatialContrastiveNormalization of N x H x W planes, as torch/nn's sources compute
    it: subtractive, then divisive, each divided by the smoothing of ones."""
    taps = kernel / kernel.sum()
    coef = smoothed(np.ones((1,) + planes.shape[1:]), taps)
    z = planes - smoothed(planes, taps) / coef
    std = np.sqrt(smoothed(z * z, taps)) / coef
    return z / np.where(std > threshold, std, value)


RNG = np.random.RandomState(5)
W = {"w": RNG.randn(4, 3, 3, 3).astype(np.float32), "b": RNG.randn(4).astype(np.float32),
     "g": RNG.randn(6, 1, 2, 3).astype(np.float32), "d": RNG.randn(5, 27).astype(np.float32),
     "c": RNG.randn(3, 1, 1).astype(np.float32), "m": RNG.rand(3, 9, 9).astype(np.float32),
     "v": RNG.randn(5).astype(np.float32), "d36": RNG.randn(5, 36).astype(np.float32),
     "k": np.exp(-np.linspace(-1.5, 1.5, 5) ** 2)}


def pool(mode, kernel, stride, pads=(0, 0, 0, 0), ceil=False, divisor="valid"):
    return {"op": "pool", "mode": mode, "kernel": kernel, "stride": stride, "pads": list(pads), "ceil": ceil,
            "divisor": divisor}


CASES = {
    "affine by numbers": [{"op": "affine", "scale": 255.0, "shift": -3.5}],
    "affine by arrays": [{"op": "affine", "scale": "c", "shift": "m"}],
    "affine of nothing": [{"op": "affine"}],
    "pad": [{"op": "pad", "pads": [1, 0, 2, 3], "value": -0.5}],
    "reshape, flatten": [{"op": "reshape", "shape": [9, 27]}, {"op": "flatten"}],
    "conv": [{"op": "conv", "weight": "w", "bias": "b", "stride": [2, 1], "pads": [1, 2, 0, 1]}],
    "conv in groups, no bias": [{"op": "pad", "pads": [0, 0, 0, 1], "value": 0.0},
                                {"op": "conv", "weight": "g", "group": 3}],
    "max pool": pool("max", [3, 3], [2, 2]),
    "max pool, ceil (Caffe's)": pool("max", [3, 3], [2, 2], ceil=True),
    "max pool, ceil, padded, last window dropped": pool("max", [3, 2], [3, 2], (1, 1, 1, 1), ceil=True),
    "avg pool, ceil, Caffe's divisor": pool("avg", [3, 3], [2, 2], (1, 1, 1, 1), True, "padded"),
    "avg pool, ceil, valid elements": pool("avg", [3, 3], [2, 2], (1, 0, 2, 1), True, "valid"),
    "avg pool, the whole window": pool("avg", [2, 3], [2, 2], (1, 1, 0, 2), False, "window"),
    "relu, tanh, sigmoid": [{"op": "affine", "scale": 4.0, "shift": -2.0}, {"op": "relu"}, {"op": "tanh"},
                            {"op": "affine", "shift": -0.5}, {"op": "sigmoid"}],
    "dense, softmax": [{"op": "conv", "weight": "w", "bias": "b", "stride": [3, 3]},     # 4 x 3 x 3
                       {"op": "flatten"}, {"op": "affine", "scale": 0.5},
                       {"op": "dense", "weight": "d36", "bias": "v"}, {"op": "softmax"}],
    "contrast of the middle plane (Torch's)": [{"op": "affine", "scale": 255.0},
                                               {"op": "contrast", "channel": 1, "kernel": "k",
                                                "threshold": 1e-4, "value": 1e-4}],
    "contrast of the first plane, a small divisor kept": [{"op": "contrast", "channel": 0, "kernel": "k",
                                                           "threshold": 0.3, "value": 0.5}],
    "dense without bias, log_softmax": [{"op": "conv", "weight": "w", "stride": [3, 3]}, {"op": "flatten"},
                                        {"op": "dense", "weight": "d36"}, {"op": "log_softmax"}],
    # TensorFlow's input pipeline and normalisation
    "central crop": [{"op": "crop", "size": [4, 7]}],
    "crop at an offset": [{"op": "crop", "size": [3, 2], "offset": [6, 0]}],
    "standardize": [{"op": "affine", "scale": 255.0, "shift": -20.0}, {"op": "standardize"}],
    "standardize a vector": [{"op": "flatten"}, {"op": "standardize"}],
    "standardize, the floor of the deviation": [{"op": "affine", "scale": 1e-3}, {"op": "standardize"}],
    "lrn, TensorFlow's CIFAR-10": [{"op": "affine", "scale": 30.0},
                                   {"op": "lrn", "radius": 1, "bias": 1.0, "alpha": 0.001 / 9, "beta": 0.75}],
    "lrn, a radius past the channels": [{"op": "conv", "weight": "w", "bias": "b"},
                                        {"op": "lrn", "radius": 4, "bias": 2.0, "alpha": 0.3, "beta": 0.6}],
    "lrn, by its defaults": [{"op": "lrn", "radius": 0}],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_layer_kind_computes_its_definition(name):
    layers = CASES[name] if isinstance(CASES[name], list) else [CASES[name]]
    names = {value for layer in layers for value in layer.values() if isinstance(value, str) and value in W}
    arrays = {key: W[key] for key in names}
    pixels = RNG.rand(2, 3, 9, 9).astype(np.float32)
    found, model = run(layers, arrays, pixels)
    expected = reference(layers, arrays, pixels)
    assert found.shape == expected.shape
    np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_caffes_pooling_rounds_up_and_averages_over_the_window_inside_the_input():
    """cifar10_quick: 32 x 32 max-pooled 3/2 is 16 x 16 in Caffe (15 rounding down); 16
    average-pooled 3/2 is 8, its last window two rows and columns: divided by 2 x 2,
    not 3 x 3."""
    x = np.arange(32 * 32, dtype=np.float32).reshape(1, 1, 32, 32) / 1024
    found, _ = run([pool("max", [3, 3], [2, 2], ceil=True, divisor="padded")], {}, x)
    assert found.shape == (1, 1, 16, 16)
    assert found[0, 0, -1, -1] == x[0, 0, 31, 31] and found[0, 0, 0, 0] == x[0, 0, 2, 2]
    y = np.ones((1, 1, 16, 16), np.float32)
    found, _ = run([pool("avg", [3, 3], [2, 2], ceil=True, divisor="padded")], {}, y)
    assert found.shape == (1, 1, 8, 8)
    np.testing.assert_array_equal(found, np.ones((1, 1, 8, 8)))      # 4 / 4 at the edge, not 4 / 9


def test_a_float64_model_is_a_float32_graph_within_float32_rounding():
    """Weights of a float64 model rounded to float32: the graph's outputs within 1e-6
    relative of the float64 model's own, and not equal to them."""
    rng = np.random.RandomState(3)
    arrays = {"w": rng.randn(5, 3, 3, 3), "b": rng.randn(5) * 1e-3, "d": rng.randn(10, 5 * 3 * 3) / 3,
              "e": rng.randn(10)}
    layers = [{"op": "affine", "scale": 255 / 256}, {"op": "conv", "weight": "w", "bias": "b"},
              pool("max", [2, 2], [2, 2]), {"op": "tanh"}, {"op": "flatten"},
              {"op": "dense", "weight": "d", "bias": "e"}, {"op": "softmax"}]
    pixels = rng.rand(4, 3, 8, 8).astype(np.float32)
    found, model = run(layers, arrays, pixels, dtype="float64")
    expected = reference(layers, arrays, pixels)
    assert all(tensor.data_type == onnx.TensorProto.FLOAT for tensor in model.graph.initializer)
    error = np.abs(found - expected).max() / np.abs(expected).max()
    assert 0 < error <= 1e-6


def test_the_builder_takes_the_runners_own_files(tmp_path):
    """The runner's writer and the host's reader agree: a list with numpy's numbers and
    tuples in it, its arrays a flipped view, written by dlbench_runner.migration."""
    from dlbench_runner import migration as exporting

    class Listed:
        def export_layers(self, pixels):
            return [{"op": "conv", "weight": W["w"][:, :, ::-1, ::-1], "bias": W["b"],
                     "stride": (np.int64(1), 1), "pads": [np.int32(1)] * 4},
                    {"op": "pool", "mode": "avg", "kernel": (2, 2), "stride": (2, 2), "ceil": np.bool_(True)}]

    pixels = RNG.rand(2, 3, 9, 9).astype(np.float32)
    assert exporting._export_layers(Listed(), pixels, str(tmp_path)) is None
    listing, arrays = onnx_layers.read((tmp_path / "layers.json").read_bytes(), (tmp_path / "layers.npz").read_bytes())
    assert listing.dtype == "float32" and listing.input == (3, 9, 9) and sorted(arrays) == ["0.bias", "0.weight"]
    model, shape = onnx_layers.build(listing, arrays)
    assert shape == (4, 5, 5)


# -- hostile files ------------------------------------------------------------------
def npz_of(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


DENSE = [{"op": "flatten"}, {"op": "dense", "weight": "d", "bias": "b"}]
GOOD = {"d": np.ones((10, 12), np.float32), "b": np.zeros(10, np.float32)}


def bomb() -> bytes:
    """An npz whose one array unpacks to far more than its few stored bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                      "shape": (100 << 20,)})
        archive.writestr("d.npy", header.getvalue() + bytes(400 << 20))
    return buffer.getvalue()


@pytest.mark.parametrize("layers, arrays, reason", [
    (DENSE, {"b": GOOD["b"]}, "layer 1 (dense): layers.npz has no array d"),
    ([{"op": "flatten"}, {"op": "dense", "weight": "d", "bias": "b"}],
     {"d": np.ones((10, 13), np.float32), "b": GOOD["b"]}, "layer 1 (dense): the weight 10x13 does not take 12 inputs"),
    ([{"op": "dense", "weight": "d"}], {"d": GOOD["d"]},
     "layer 0 (dense): takes a vector (flatten first), not 3x2x2"),
    ([{"op": "conv", "weight": "w"}], {"w": np.ones((4, 2, 1, 1), np.float32)},
     "layer 0 (conv): the weight 4x2x1x1 does not fit 3 channels in 1 group(s)"),
    ([{"op": "reshape", "shape": [5, 2]}], {}, "layer 0 (reshape): 3x2x2 cannot become 5x2"),
    ([{"op": "affine", "shift": "m"}], {"m": np.ones((2, 2, 2), np.float32)},
     "layer 0 (affine): m is 2x2x2, which does not broadcast to 3x2x2"),
    ([{"op": "pad", "pads": [4000, 4000, 4000, 4000]}], {},
     "layer 0: its output would be 3x8002x8002 per image, outside 1 to 524288 elements"),
    (DENSE + [{"op": "dense", "weight": "d"}], GOOD, "layer 2 (dense): the array d is used twice"),
    (DENSE, dict(GOOD, extra=np.ones(3, np.float32)), "layers.npz holds arrays no layer uses: extra"),
    ([pool("max", [2, 2], [1, 1], (2, 0, 0, 0))], {}, "layer 0 (pool): the padding must be less than the 2x2 kernel"),
    ([{"op": "contrast", "channel": 3, "kernel": "k"}], {"k": np.ones(3)},
     "layer 0 (contrast): there is no channel 3 in 3x2x2"),
    ([{"op": "contrast", "kernel": "k"}], {"k": np.ones(2)},
     "layer 0 (contrast): the kernel must be one odd length up to 3, not 2"),
    ([{"op": "contrast", "kernel": "k"}], {"k": np.array([1.0, -1.0, 1.0])},
     "layer 0 (contrast): the kernel's taps must be at least 0 and sum to more than 0"),
    (DENSE, {"d": np.array([object()] * 3), "b": GOOD["b"]}, "layers.npz is invalid: "),       # a pickle
    (DENSE, {"d": np.ones((10, 12), np.int64), "b": GOOD["b"]},
     "layers.npz is invalid: d must be float32 or float64 of 1 to 4 dimensions, not int64 of 2"),
    (DENSE, {"d": np.full((10, 12), 1e300), "b": GOOD["b"]},
     "layers.npz is invalid: d holds numbers that are not finite in float32"),
    ([{"op": "dense", "weight": "d"}, {"op": "dense", "weight": "e"}],
     {"d": np.ones((6000, 12), np.float32), "e": np.ones((6000, 6000), np.float32)},
     "layers.npz is 144288490 bytes, more than 50331648"),
    ([{"op": "conv", "weight": "w", "pads": [400, 400, 400, 400]}], {"w": np.ones((3, 3, 1, 1), np.float32)},
     "layer 0: its output would be 3x802x802 per image"),
    ([{"op": "softmax"}], {}, "layer 0 (softmax): takes a vector, not 3x2x2"),
    ([{"op": "crop", "size": [3, 2]}], {}, "layer 0 (crop): a 3x2 window at -1,0 reaches past its input 3x2x2"),
    ([{"op": "crop", "size": [2, 2], "offset": [0, 1]}], {},
     "layer 0 (crop): a 2x2 window at 0,1 reaches past its input 3x2x2"),
    ([{"op": "flatten"}, {"op": "crop", "size": [1, 1]}], {}, "layer 1 (crop): takes C x H x W, not 12"),
    ([{"op": "flatten"}, {"op": "lrn", "radius": 2}], {}, "layer 1 (lrn): takes C x H x W, not 12"),
])
def test_a_layer_list_that_does_not_hold_together_is_refused(layers, arrays, reason):
    pixels_shape = (3, 2, 2)
    with pytest.raises(Refused) as refused:
        onnx_layers.build(*onnx_layers.read(*files(layers, arrays, pixels_shape)))
    assert str(refused.value).startswith(reason), str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("listing, reason", [
    (b"{not json", "layers.json is invalid: "),
    (b"[]", "layers.json is invalid: Input should be an object"),
    (files([{"op": "gelu"}], {}, (4,))[0], "layers.json is invalid: layers.0: Input tag 'gelu' found"),
    (files([{"op": "relu", "inplace": True}], {}, (4,))[0], "layers.json is invalid: layers.0.relu.inplace: Extra inputs"),
    (files([{"op": "pad", "pads": [1, 1, 1]}], {}, (4,))[0], "layers.json is invalid: layers.0.pad.pads.3: Field required"),
    (files([{"op": "conv", "weight": "w", "stride": ["1", 1]}], {}, (4,))[0],
     "layers.json is invalid: layers.0.conv.stride.0: Input should be a valid integer"),
    (files([{"op": "conv", "weight": "../../etc/passwd"}], {}, (4,))[0],
     "layers.json is invalid: layers.0.conv.weight: String should match pattern"),
    (b'{"format": "dlbench-layers", "version": 1, "dtype": "float32", "input": [4], '
     b'"layers": [{"op": "affine", "scale": NaN}]}', "layers.json is invalid: layers.0.affine.scale"),
    (files([{"op": "relu"}], {}, (4,), version=2)[0], "layers.json is version 2; this dlbench reads version 1"),
    (files([{"op": "relu"}], {}, (4,), dtype="float16")[0], "layers.json is invalid: dtype: Input should be"),
    (files([{"op": "relu"}] * 300, {}, (4,))[0], "layers.json is invalid: layers: List should have at most 256"),
    (b" " * (2 << 20), "layers.json is 2097152 bytes, more than 1048576"),
    (files([{"op": "lrn", "radius": 2, "bias": 0.0}], {}, (4,))[0],
     "layers.json is invalid: layers.0.lrn.bias: Input should be greater than 0"),
    (files([{"op": "lrn", "radius": -1}], {}, (4,))[0],
     "layers.json is invalid: layers.0.lrn.radius: Input should be greater than or equal to 0"),
    (files([{"op": "lrn", "radius": 2, "alpha": -1.0}], {}, (4,))[0], "layers.json is invalid: layers.0.lrn.alpha"),
    (files([{"op": "lrn", "radius": 2, "beta": 1e9}], {}, (4,))[0], "layers.json is invalid: layers.0.lrn.beta"),
    (files([{"op": "crop", "size": [0, 2]}], {}, (4,))[0], "layers.json is invalid: layers.0.crop.size.0"),
    (files([{"op": "crop", "size": [2, 2], "offset": [-1, 0]}], {}, (4,))[0],
     "layers.json is invalid: layers.0.crop.offset"),
    (files([{"op": "standardize", "epsilon": 1e-3}], {}, (4,))[0],
     "layers.json is invalid: layers.0.standardize.epsilon: Extra inputs"),
])
def test_a_layer_list_that_is_not_the_format_is_refused(listing, reason):
    with pytest.raises(Refused) as refused:
        onnx_layers.read(listing, npz_of())
    assert str(refused.value).startswith(reason), str(refused.value)
    assert "\n" not in str(refused.value)


def test_an_npz_that_unpacks_past_the_cap_is_refused_before_numpy_reads_it():
    data = bomb()
    assert len(data) < 1 << 20
    with pytest.raises(Refused, match=r"^layers.npz unpacks to \d+ bytes, more than 50331648$"):
        onnx_layers.read(files(DENSE, {}, (12,))[0], data)
