"""The TensorFlow adapter's layer lists, on the host (numpy only): each model's list, built
into ONNX by the host and run by onnxruntime, against the model as TensorFlow computes it,
written here in NumPy from tf.nn's definitions in TF's own NHWC layout (HWIO kernels, SAME
padding, NHWC flattening, per-image standardisation, LRN over the last axis), float64."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from conftest import REPO
from dlbench_runner import migration as exporting
from dlbench_runner.runner import adapter_module
from orchestrator.checks import onnx_layers


@pytest.fixture(scope="module")
def adapter():
    return adapter_module(REPO / "images" / "tensorflow")


def same(x, kernel, stride, value):
    """x (N x H x W x C) padded as TF's SAME pads it: the odd row and column after."""
    pads = []
    for size in x.shape[1:3]:
        total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
        pads.append((total // 2, total - total // 2))
    return np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)), constant_values=value)


def conv_relu(x, w, b):
    windows = sliding_window_view(same(x, w.shape[0], 1, 0.0), w.shape[:2], axis=(1, 2))
    return np.maximum(np.einsum("nhwcij,ijco->nhwo", windows, w) + b, 0)


def max_pool(x, kernel, stride):
    windows = sliding_window_view(same(x, kernel, stride, -np.inf), (kernel, kernel), axis=(1, 2))
    return windows[:, ::stride, ::stride].max(axis=(4, 5))


def lrn(x, radius=4, bias=1.0, alpha=0.001 / 9, beta=0.75):
    squares = np.pad(x ** 2, ((0, 0), (0, 0), (0, 0), (radius, radius)))
    sums = sliding_window_view(squares, 2 * radius + 1, axis=3).sum(axis=-1)
    return x / (bias + alpha * sums) ** beta


def mnist_deep(pixels, params):
    w1, b1, w2, b2, w3, b3, w4, b4 = params
    h = max_pool(conv_relu(pixels[..., None], w1, b1), 2, 2)
    h = max_pool(conv_relu(h, w2, b2), 2, 2)
    return np.maximum(h.reshape(len(h), -1) @ w3 + b3, 0) @ w4 + b4


def cifar10_tutorial(pixels, params):
    w1, b1, w2, b2, w3, b3, w4, b4, w5, b5 = params
    x = np.transpose(pixels * 255.0, (0, 2, 3, 1))[:, 4:28, 4:28, :]
    n = x[0].size
    x = (x - x.mean(axis=(1, 2, 3), keepdims=True)) / np.maximum(x.std(axis=(1, 2, 3), keepdims=True),
                                                                  1 / np.sqrt(n))
    h = lrn(max_pool(conv_relu(x, w1, b1), 3, 2))
    h = max_pool(lrn(conv_relu(h, w2, b2)), 3, 2)
    h = np.maximum(h.reshape(len(h), -1) @ w3 + b3, 0)
    return np.maximum(h @ w4 + b4, 0) @ w5 + b5


def random_params(rng, shapes, scale):
    return [(rng.standard_normal(shape) * scale).astype(np.float32) + (0.1 if len(shape) == 1 else 0.0)
            for shape in shapes]


class Weight:
    """A tf.Variable's stand-in: its value, by .numpy()."""

    def __init__(self, value):
        self.value = value

    def numpy(self):
        return self.value


def exporter(adapter, model, params, augment):
    """The adapter as test() leaves it, as far as export_layers reads it: its model, the
    weights test() scores with, whether it crops and standardises (CIFAR-10)."""
    bare = adapter.Adapter.__new__(adapter.Adapter)
    bare.model, bare.augment = model, augment
    bare._params = lambda: [Weight(p) for p in params]
    return bare


def graph_outputs(bare, pixels, folder):
    """The adapter's list as the runner writes it, built by the host, run by onnxruntime."""
    assert exporting._export_layers(bare, pixels, str(folder)) is None
    model, shape = onnx_layers.build(*onnx_layers.read((folder / "layers.json").read_bytes(),
                                                       (folder / "layers.npz").read_bytes()))
    assert shape == (10,)
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, {"pixels": pixels})[0]


def test_the_mnist_list_computes_the_deep_convnet(adapter, tmp_path):
    rng = np.random.default_rng(1)
    params = random_params(rng, [(5, 5, 1, 32), (32,), (5, 5, 32, 64), (64,), (3136, 1024), (1024,),
                                 (1024, 10), (10,)], 0.1)
    pixels = rng.random((3, 28, 28), dtype=np.float32)
    found = graph_outputs(exporter(adapter, adapter.MnistDeep, params, None), pixels, tmp_path)
    expected = mnist_deep(pixels.astype(np.float64), [p.astype(np.float64) for p in params])
    assert np.abs(found - expected).max() <= 1e-5 * np.abs(expected).max()


def test_the_cifar10_list_computes_the_tutorials_model(adapter, tmp_path):
    """Its input cropped and standardised, two LRNs, SAME pooling of 24 and 12 padded after,
    local3 on NHWC's flattening."""
    rng = np.random.default_rng(2)
    params = random_params(rng, [(5, 5, 3, 64), (64,), (5, 5, 64, 64), (64,), (2304, 384), (384,),
                                 (384, 192), (192,), (192, 10), (10,)], 0.05)
    pixels = rng.random((3, 3, 32, 32), dtype=np.float32)
    found = graph_outputs(exporter(adapter, adapter.Cifar10Tutorial, params, "distort"), pixels, tmp_path)
    expected = cifar10_tutorial(pixels.astype(np.float64), [p.astype(np.float64) for p in params])
    assert np.abs(found - expected).max() <= 1e-5 * np.abs(expected).max()
