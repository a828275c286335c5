"""A trained model handed over as a layer list, made into an ONNX graph on the host.

A framework without an ONNX exporter of its own (Caffe 1.0, Theano 1.0), and whose
image cannot take the ``onnx`` package, describes its trained model instead: the
adapter's ``export_layers(pixels)`` gives the layers from pixels to outputs, and the
runner writes them beside ``migration.npz`` as

    layers.json     {"format": "dlbench-layers", "version": 1,
                     "dtype": "float32" or "float64",      what the framework computes in
                     "input": [28, 28] or [3, 32, 32],     one image's pixels
                     "layers": [{"op": ..., ...}, ...]}    in order, each one's output the
                                                           next one's input
    layers.npz      the layers' arrays (numpy's format, no pickles), named in the layers
                    by strings: {"op": "conv", "weight": "1.weight", ...}

The input is what the robustness check takes, float32 pixels in [0, 1] with a free
batch dimension; shapes below are one image's, without it.  The layers (``VERSION`` 1):

    affine        y = x * scale + shift; each a number or an array that broadcasts
                  to x's shape (numpy's rules) without widening it: byte scaling,
                  a mean image, a per-channel bias (C x 1 x 1)
    pad           C x H x W, ``pads`` [top, left, bottom, right] of ``value``
    reshape       to ``shape`` (the same number of elements)
    flatten       to one dimension, in C order
    conv          C x H x W; ``weight`` O x C/group x kh x kw (cross-correlation, as
                  ONNX's Conv and Caffe's: a true convolution's kernel flipped),
                  ``bias`` O or null, ``stride`` [sh, sw], ``pads`` [t, l, b, r], ``group``
    pool          C x H x W; ``mode`` max or avg, ``kernel`` [kh, kw], ``stride``,
                  ``pads`` [t, l, b, r] (each less than the kernel), ``ceil``: the
                  output side is ceil((H + t + b - kh) / sh) + 1 instead of floor, less
                  one where that last window would start past the input and its top
                  padding (Caffe's rule); ``divisor`` of an average: ``valid`` (the
                  input's elements in the window), ``padded`` (the window clipped to
                  the padded input: Caffe's), ``window`` (kh * kw always); a maximum
                  never sees padding
    relu, tanh, sigmoid
    dense         a vector of n; ``weight`` m x n, ``bias`` m or null: y = x Wᵀ + b
    softmax, log_softmax    over a vector
    contrast      C x H x W; Torch's SpatialContrastiveNormalization of the plane
                  ``channel`` (the others as they are), its 1-D ``kernel`` (odd, taps
                  at least 0) over its sum, zero padding, the local standard deviation
                  replaced by ``value`` where not above ``threshold`` (``_contrast``);
                  computed in float64 inside the graph

TensorFlow's input pipeline and normalisation (the CIFAR-10 tutorial's):

    crop          C x H x W to C x h x w: ``size`` [h, w], ``offset`` [top, left] of the
                  window, or null for the central one (top (H - h) // 2, left likewise)
    standardize   each image apart, over all its elements (n of them): (x - mean) /
                  max(std, 1 / sqrt(n)), std the population's (tf.image.
                  per_image_standardization)
    lrn           C x H x W, across channels: x / (bias + alpha * s) ** beta, s the sum of
                  x² over the channels c - ``radius`` to c + ``radius`` that exist
                  (tf.nn.local_response_normalization's depth_radius, bias, alpha, beta;
                  a sum, not Caffe's mean: Caffe's alpha is alpha / (2 radius + 1) here)

The graph is float32 throughout, as onnxruntime has no float64 convolution: a float64
model's arrays are rounded to float32 (``dtype`` says the model's own type, the check
its cost).

The files are hostile input: every field is checked (``Listing``), every array must be
named by one layer and used by one, shapes must chain, and the sizes are capped
(``MAX_*``).  Whatever is wrong is ``Refused`` with a one-line reason.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .. import files

FORMAT = "dlbench-layers"
VERSION = 1
LAYERS = "layers.json"
ARRAYS = "layers.npz"
MAX_LIST_BYTES = 1 << 20
MAX_ARRAY_BYTES = 48 << 20      # all arrays together, as stored (contract.MAX_MODEL_BYTES)
MAX_LAYERS = 256
MAX_ELEMENTS = 1 << 19          # of one image's tensor between two layers
MAX_MACS = 1 << 27              # multiply-adds of conv and dense layers for one image
OPSET = 13


class Refused(Exception):
    """The layer list cannot be made into a graph; the message says why, in one line."""


# -- the format --------------------------------------------------------------------
Side = Annotated[int, Field(ge=1, le=4096)]
Pad = Annotated[int, Field(ge=0, le=4096)]
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
Number = Annotated[float, Field(allow_inf_nan=False)]
Pair = tuple[Side, Side]
Pads = tuple[Pad, Pad, Pad, Pad]


class _Layer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Affine(_Layer):
    op: Literal["affine"]
    scale: Number | Name = 1.0
    shift: Number | Name = 0.0


class PadLayer(_Layer):
    op: Literal["pad"]
    pads: Pads
    value: Number = 0.0


class Reshape(_Layer):
    op: Literal["reshape"]
    shape: tuple[Side, ...] = Field(min_length=1, max_length=4)


class Plain(_Layer):
    op: Literal["flatten", "relu", "tanh", "sigmoid", "softmax", "log_softmax"]


class Conv(_Layer):
    op: Literal["conv"]
    weight: Name
    bias: Name | None = None
    stride: Pair = (1, 1)
    pads: Pads = (0, 0, 0, 0)
    group: Side = 1


class Pool(_Layer):
    op: Literal["pool"]
    mode: Literal["max", "avg"]
    kernel: Pair
    stride: Pair
    pads: Pads = (0, 0, 0, 0)
    ceil: bool = False
    divisor: Literal["valid", "padded", "window"] = "valid"


class Dense(_Layer):
    op: Literal["dense"]
    weight: Name
    bias: Name | None = None


# -- Lua Torch7's layers: CIFAR-10's contrast normalisation (built below, in its section) --
class Contrast(_Layer):
    """nn.SpatialContrastiveNormalization of one plane, ``channel``; the others pass as
    they are."""

    op: Literal["contrast"]
    channel: Annotated[int, Field(ge=0, le=4096)] = 0
    kernel: Name
    threshold: Number = 1e-4
    value: Number = 1e-4



# -- TensorFlow's input pipeline and normalisation (fields) ----------------------------
class Crop(_Layer):
    op: Literal["crop"]
    size: Pair
    offset: tuple[Pad, Pad] | None = None


class Standardize(_Layer):
    op: Literal["standardize"]


class Lrn(_Layer):
    op: Literal["lrn"]
    radius: Annotated[int, Field(ge=0, le=1024)]
    bias: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] = 1.0
    alpha: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)] = 1.0
    beta: Annotated[float, Field(ge=-16, le=16, allow_inf_nan=False)] = 0.5


# -- (end of TensorFlow's fields) ----------------------------------------------------


Layer = Annotated[Union[Affine, PadLayer, Reshape, Plain, Conv, Pool, Dense, Contrast, Crop, Standardize, Lrn],
                  Field(discriminator="op")]


class Listing(BaseModel):
    """layers.json."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    format: Literal["dlbench-layers"]
    version: Literal[1]
    dtype: Literal["float32", "float64"]
    input: tuple[Side, ...] = Field(min_length=1, max_length=3)
    layers: list[Layer] = Field(min_length=1, max_length=MAX_LAYERS)


# -- reading -----------------------------------------------------------------------
def read(listing: bytes, arrays: bytes) -> tuple[Listing, dict[str, np.ndarray]]:
    """The two files, checked field by field; the arrays as float arrays, finite."""
    if len(listing) > MAX_LIST_BYTES:
        raise Refused(f"{LAYERS} is {len(listing)} bytes, more than {MAX_LIST_BYTES}")
    try:
        version = json.loads(listing).get("version")
    except (ValueError, AttributeError, RecursionError):
        version = None
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        raise Refused(f"{LAYERS} is version {version}; this dlbench reads version {VERSION} and older")
    try:
        parsed = Listing.model_validate_json(listing)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise Refused(f"{LAYERS} is invalid: {where + ': ' if where else ''}{files.one_line(error['msg'])}") from None
    return parsed, _arrays(arrays)


def _arrays(data: bytes) -> dict[str, np.ndarray]:
    """The npz's arrays, their stored and unpacked sizes capped before numpy reads them."""
    if len(data) > MAX_ARRAY_BYTES:
        raise Refused(f"{ARRAYS} is {len(data)} bytes, more than {MAX_ARRAY_BYTES}")
    try:
        found = files.read_npz(data, ARRAYS, MAX_ARRAY_BYTES, 2 * MAX_LAYERS)
    except files.Refused as exc:
        raise Refused(str(exc)) from None
    for name, array in found.items():
        if array.dtype not in (np.float32, np.float64) or not 0 < array.ndim <= 4:
            raise Refused(f"{ARRAYS} is invalid: {name} must be float32 or float64 of 1 to 4 dimensions, "
                          f"not {array.dtype} of {array.ndim}")
        if not np.isfinite(array).all() or np.abs(array).max(initial=0) > np.finfo(np.float32).max:
            raise Refused(f"{ARRAYS} is invalid: {name} holds numbers that are not finite in float32")
    return found


# -- building ----------------------------------------------------------------------
class _Graph:
    """The nodes and initializers made so far; the current tensor's name and one image's
    shape; what is left of the caps."""

    def __init__(self, arrays: dict[str, np.ndarray], shape: tuple[int, ...]):
        self.arrays, self.used = arrays, set()
        self.nodes, self.initializers = [], []
        self.tensor, self.shape = "pixels", shape
        self.count, self.macs = 0, 0

    def array(self, where: str, name: str) -> np.ndarray:
        if name not in self.arrays:
            raise Refused(f"{where}: {ARRAYS} has no array {name}")
        if name in self.used:
            raise Refused(f"{where}: the array {name} is used twice")
        self.used.add(name)
        return self.arrays[name]

    def constant(self, value, dtype=np.float32) -> str:
        from onnx import numpy_helper

        name = f"c{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value, dtype), name))
        return name

    def node(self, op: str, inputs: list[str], shape: tuple[int, ...], **attributes) -> None:
        from onnx import helper

        elements = math.prod(shape)
        if not shape or min(shape) < 1 or elements > MAX_ELEMENTS:
            raise Refused(f"layer {self.count}: its output would be {'x'.join(map(str, shape))} per image, "
                          f"outside 1 to {MAX_ELEMENTS} elements")
        output = f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, [self.tensor] + inputs, [output], **attributes))
        self.tensor, self.shape = output, shape

    def side(self, op: str, inputs: list[str], **attributes) -> str:
        """A node off the chain, all its inputs named (a layer made of several); its output."""
        from onnx import helper

        output = f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [output], **attributes))
        return output

    def add_macs(self, count: int) -> None:
        self.macs += count
        if self.macs > MAX_MACS:
            raise Refused(f"layer {self.count}: the model takes more than {MAX_MACS} multiply-adds per image")


def build(listing: Listing, arrays: dict[str, np.ndarray]) -> tuple[bytes, tuple[int, ...]]:
    """The ONNX model of a checked layer list (its input ``pixels``, float32, N x
    ``listing.input``) and one image's output shape."""
    import onnx
    from onnx import helper

    graph = _Graph(arrays, tuple(listing.input))
    for index, layer in enumerate(listing.layers):
        graph.count = index
        _LAYER[type(layer)](graph, f"layer {index} ({layer.op})", layer)
    unused = sorted(set(arrays) - graph.used)
    if unused:
        raise Refused(f"{ARRAYS} holds arrays no layer uses: {', '.join(unused[:3])}")
    graph.nodes[-1].output[0] = "outputs"
    inputs = [helper.make_tensor_value_info("pixels", onnx.TensorProto.FLOAT, ["N", *listing.input])]
    outputs = [helper.make_tensor_value_info("outputs", onnx.TensorProto.FLOAT, ["N", *graph.shape])]
    model = helper.make_model(helper.make_graph(graph.nodes, "dlbench_layers", inputs, outputs,
                                                graph.initializers),
                              opset_imports=[helper.make_opsetid("", OPSET)], producer_name="dlbench")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:     # a gap in the checks above
        raise Refused(f"the graph built from {LAYERS} is not valid ONNX: {files.one_line(exc)}") from None
    return model.SerializeToString(), graph.shape


def _image(graph: _Graph, where: str) -> tuple[int, int, int]:
    if len(graph.shape) != 3:
        raise Refused(f"{where}: takes C x H x W, not {_shape(graph.shape)}")
    return graph.shape


def _affine(graph: _Graph, where: str, layer: Affine) -> None:
    made = len(graph.nodes)
    for op, value, neutral in (("Mul", layer.scale, 1.0), ("Add", layer.shift, 0.0)):
        if isinstance(value, str):
            array = graph.array(where, value)
            if not _broadcasts(array.shape, graph.shape):
                raise Refused(f"{where}: {value} is {_shape(array.shape)}, which does not broadcast "
                              f"to {_shape(graph.shape)}")
            graph.node(op, [graph.constant(array)], graph.shape)
        elif value != neutral:
            graph.node(op, [graph.constant(value)], graph.shape)
    if len(graph.nodes) == made:        # y = x
        graph.node("Identity", [], graph.shape)


def _broadcasts(small: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether ``small`` broadcasts to ``shape`` and leaves it as it is."""
    try:
        return len(small) <= len(shape) and np.broadcast_shapes(small, shape) == tuple(shape)
    except ValueError:
        return False


def _pad(graph: _Graph, where: str, layer: PadLayer) -> None:
    c, h, w = _image(graph, where)
    t, l, b, r = layer.pads
    graph.node("Pad", [graph.constant([0, 0, t, l, 0, 0, b, r], np.int64), graph.constant(layer.value)],
               (c, h + t + b, w + l + r), mode="constant")


def _reshape(graph: _Graph, where: str, layer: Reshape) -> None:
    if math.prod(layer.shape) != math.prod(graph.shape):
        raise Refused(f"{where}: {_shape(graph.shape)} cannot become {_shape(layer.shape)}")
    graph.node("Reshape", [graph.constant([-1, *layer.shape], np.int64)], tuple(layer.shape))


_PLAIN = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "softmax": "Softmax", "log_softmax": "LogSoftmax"}


def _plain(graph: _Graph, where: str, layer: Plain) -> None:
    if layer.op == "flatten":
        graph.node("Flatten", [], (math.prod(graph.shape),), axis=1)
    elif layer.op in ("softmax", "log_softmax"):
        if len(graph.shape) != 1:
            raise Refused(f"{where}: takes a vector, not {_shape(graph.shape)}")
        graph.node(_PLAIN[layer.op], [], graph.shape, axis=1)
    else:
        graph.node(_PLAIN[layer.op], [], graph.shape)


def _conv(graph: _Graph, where: str, layer: Conv) -> None:
    c, h, w = _image(graph, where)
    weight = graph.array(where, layer.weight)
    if weight.ndim != 4 or weight.shape[1] * layer.group != c or weight.shape[0] % layer.group:
        raise Refused(f"{where}: the weight {_shape(weight.shape)} does not fit {c} channels in "
                      f"{layer.group} group(s)")
    out_c, _, kh, kw = weight.shape
    t, l, b, r = layer.pads
    sh, sw = layer.stride
    out = (out_c, (h + t + b - kh) // sh + 1, (w + l + r - kw) // sw + 1)
    if h + t + b < kh or w + l + r < kw:
        raise Refused(f"{where}: a {kh}x{kw} kernel is larger than its padded input {c}x{h}x{w}")
    inputs = [graph.constant(weight)]
    if layer.bias is not None:
        bias = graph.array(where, layer.bias)
        if bias.shape != (out_c,):
            raise Refused(f"{where}: the bias is {_shape(bias.shape)}, not {out_c}")
        inputs.append(graph.constant(bias))
    graph.add_macs(math.prod(out) * weight[0].size)
    graph.node("Conv", inputs, out, kernel_shape=[kh, kw], strides=[sh, sw], pads=[t, l, b, r],
               group=layer.group)


def pool_side(size: int, kernel: int, stride: int, before: int, after: int, ceil: bool) -> int:
    """A pooled side, as ``pool`` defines it (floor, or Caffe's ceil)."""
    span = size + before + after - kernel
    if not ceil:
        return span // stride + 1
    side = -(-span // stride) + 1
    if (side - 1) * stride >= size + before:     # the last window starts past the input
        side -= 1
    return side


def _pool(graph: _Graph, where: str, layer: Pool) -> None:
    c, h, w = _image(graph, where)
    (kh, kw), (sh, sw) = layer.kernel, layer.stride
    t, l, b, r = layer.pads
    if max(t, b) >= kh or max(l, r) >= kw:
        raise Refused(f"{where}: the padding must be less than the {kh}x{kw} kernel")
    if h + t + b < kh or w + l + r < kw:
        raise Refused(f"{where}: a {kh}x{kw} kernel is larger than its padded input {c}x{h}x{w}")
    out_h, out_w = pool_side(h, kh, sh, t, b, layer.ceil), pool_side(w, kw, sw, l, r, layer.ceil)
    # every window made whole by more padding after the input, which ONNX's pooling then
    # ignores (max, an average of the ``valid`` elements) or counts (``window``)
    extra_h = max(0, (out_h - 1) * sh + kh - (h + t + b))
    extra_w = max(0, (out_w - 1) * sw + kw - (w + l + r))
    if layer.mode == "avg" and layer.divisor == "padded" and any(layer.pads):
        # Caffe's: the padding counts, what lies past it does not: the padding made real first
        graph.node("Pad", [graph.constant([0, 0, t, l, 0, 0, b, r], np.int64), graph.constant(0.0)],
                   (c, h + t + b, w + l + r), mode="constant")
        t = l = b = r = 0
    pads = [t, l, b + extra_h, r + extra_w]
    h_all, w_all = graph.shape[1] + pads[0] + pads[2], graph.shape[2] + pads[1] + pads[3]
    if ((h_all - kh) // sh + 1, (w_all - kw) // sw + 1) != (out_h, out_w):
        raise Refused(f"{where}: the pooled size {out_h}x{out_w} cannot be made with ONNX's pooling")
    attributes = dict(kernel_shape=[kh, kw], strides=[sh, sw], pads=pads)
    if layer.mode == "max":
        graph.node("MaxPool", [], (c, out_h, out_w), **attributes)
    else:
        graph.node("AveragePool", [], (c, out_h, out_w), count_include_pad=int(layer.divisor == "window"),
                   **attributes)


def _dense(graph: _Graph, where: str, layer: Dense) -> None:
    if len(graph.shape) != 1:
        raise Refused(f"{where}: takes a vector (flatten first), not {_shape(graph.shape)}")
    weight = graph.array(where, layer.weight)
    if weight.ndim != 2 or weight.shape[1] != graph.shape[0]:
        raise Refused(f"{where}: the weight {_shape(weight.shape)} does not take {graph.shape[0]} inputs")
    inputs = [graph.constant(weight)]
    if layer.bias is not None:
        bias = graph.array(where, layer.bias)
        if bias.shape != (weight.shape[0],):
            raise Refused(f"{where}: the bias is {_shape(bias.shape)}, not {weight.shape[0]}")
        inputs.append(graph.constant(bias))
    graph.add_macs(weight.size)
    graph.node("Gemm", inputs, (weight.shape[0],), transB=1)


# -- Lua Torch7's layers -------------------------------------------------------------
def banded(taps: np.ndarray, size: int) -> np.ndarray:
    """The size x size matrix B for which B @ p @ B.T applies the 1-D kernel ``taps`` down
    and across a zero-padded size x size plane p (a centred cross-correlation): row i holds
    the taps from column i - len(taps) // 2."""
    half = len(taps) // 2
    band = np.zeros((size, size))
    for i in range(size):
        for k in range(max(0, i - half), min(size, i + half + 1)):
            band[i, k] = taps[k - i + half]
    return band


def _contrast(graph: _Graph, where: str, layer: Contrast) -> None:
    """Torch's SpatialContrastiveNormalization (nn's SpatialSubtractiveNormalization, then
    SpatialDivisiveNormalization) of one plane y, with k the kernel over its sum, smooth(p)
    = B p Bᵀ, coef = smooth(ones): z = y - smooth(y) / coef, s = sqrt(smooth(z²)) / coef,
    y' = z / (s where s > threshold, else value).  In float64 inside the float32 graph (the
    matrix products, onnxruntime having no float64 convolution), as the script computes it:
    in float32, Lua Torch7's quick CIFAR-10 model's logits were 1.6e-5 off instead of 1.9e-7
    (z in a nearly flat region is a difference of close numbers, divided by a small std)."""
    from onnx import TensorProto, helper

    c, h, w = _image(graph, where)
    if layer.channel >= c:
        raise Refused(f"{where}: there is no channel {layer.channel} in {_shape(graph.shape)}")
    kernel = graph.array(where, layer.kernel).astype(np.float64)
    if kernel.ndim != 1 or len(kernel) % 2 == 0 or len(kernel) > 2 * min(h, w) - 1:
        raise Refused(f"{where}: the kernel must be one odd length up to {2 * min(h, w) - 1}, "
                      f"not {_shape(kernel.shape)}")
    if (kernel < 0).any() or not kernel.sum() > 0:
        raise Refused(f"{where}: the kernel's taps must be at least 0 and sum to more than 0")
    taps = kernel / kernel.sum()
    down, across = banded(taps, h), banded(taps, w).T
    coef = down @ np.ones((h, w)) @ across
    if not coef.min() > 0:
        raise Refused(f"{where}: the kernel leaves an element without neighbours")
    graph.add_macs(2 * (h * h * w + h * w * w))
    names = {"down": graph.constant(down, np.float64), "across": graph.constant(across, np.float64),
             "coef": graph.constant(coef, np.float64),
             "threshold": graph.constant(layer.threshold, np.float64),
             "value": graph.constant(layer.value, np.float64)}

    def node(op, inputs, **attributes):
        output = f"t{len(graph.nodes)}"
        graph.nodes.append(helper.make_node(op, inputs, [output], **attributes))
        return output

    def plane(first, last):
        bounds = [graph.constant([value], np.int64) for value in (first, last, 1)]
        return node("Slice", [graph.tensor, *bounds])

    def smooth(p):
        return node("MatMul", [node("MatMul", [names["down"], p]), names["across"]])

    y = node("Cast", [plane(layer.channel, layer.channel + 1)], to=TensorProto.DOUBLE)
    z = node("Sub", [y, node("Div", [smooth(y), names["coef"]])])
    s = node("Div", [node("Sqrt", [smooth(node("Mul", [z, z]))]), names["coef"]])
    s = node("Where", [node("Greater", [s, names["threshold"]]), s, names["value"]])
    normalised = node("Cast", [node("Div", [z, s])], to=TensorProto.FLOAT)
    parts = ([plane(0, layer.channel)] if layer.channel else []) + [normalised] \
        + ([plane(layer.channel + 1, c)] if layer.channel + 1 < c else [])
    graph.tensor = parts[0]
    if len(parts) == 1:
        graph.node("Identity", [], (c, h, w))
    else:
        graph.node("Concat", parts[1:], (c, h, w), axis=1)


# -- TensorFlow's input pipeline and normalisation (building) ---------------------------
def _crop(graph: _Graph, where: str, layer: Crop) -> None:
    c, h, w = _image(graph, where)
    kh, kw = layer.size
    top, left = layer.offset if layer.offset is not None else ((h - kh) // 2, (w - kw) // 2)
    if top < 0 or left < 0 or top + kh > h or left + kw > w:
        raise Refused(f"{where}: a {kh}x{kw} window at {top},{left} reaches past its input {c}x{h}x{w}")
    graph.node("Slice", [graph.constant([top, left], np.int64), graph.constant([top + kh, left + kw], np.int64),
                         graph.constant([2, 3], np.int64)], (c, kh, kw))


def _standardize(graph: _Graph, where: str, layer: Standardize) -> None:
    axes = list(range(1, len(graph.shape) + 1))
    x, shape = graph.tensor, graph.shape
    mean = graph.side("ReduceMean", [x], axes=axes, keepdims=1)
    centred = graph.side("Sub", [x, mean])
    variance = graph.side("ReduceMean", [graph.side("Mul", [centred, centred])], axes=axes, keepdims=1)
    floor = graph.constant(1.0 / math.sqrt(math.prod(shape)))
    deviation = graph.side("Max", [graph.side("Sqrt", [variance]), floor])
    graph.tensor = centred              # the chain goes on from x - mean
    graph.node("Div", [deviation], shape)


def _lrn(graph: _Graph, where: str, layer: Lrn) -> None:
    _image(graph, where)
    size = 2 * layer.radius + 1         # ONNX's LRN divides the sum by its size
    graph.node("LRN", [], graph.shape, size=size, alpha=layer.alpha * size, beta=layer.beta, bias=layer.bias)


# -- (end of TensorFlow's building) --------------------------------------------------


_LAYER = {Affine: _affine, PadLayer: _pad, Reshape: _reshape, Plain: _plain, Conv: _conv, Pool: _pool,
          Dense: _dense, Contrast: _contrast, Crop: _crop, Standardize: _standardize, Lrn: _lrn}


def _shape(shape) -> str:
    return "x".join(map(str, shape)) or "a number"


