"""The fair profile: one network per data set, the same work in every framework.

Deep500 asks a comparison to be *fair* (the same work everywhere) and *verifiable*
(correctness checked).  The fair profile trains one network per data set in every
framework: Caffe's MNIST LeNet and Caffe's ``cifar10_quick``, float32, from the same
initial weights, on the same batches in the same order, with plain SGD with momentum,
one learning rate, no weight decay, dropout or augmentation.

Its settings (batch size, learning rate, momentum, steps) are ``contract.FAIR``.
Standard library and numpy only, Python 3.9 and numpy 1.16 or later, like the runner: the
host imports it (through ``contract``) to plan, to write and check the initial weights and
to compute the reference forward pass; each image's ``fair.py`` builds its framework's
network from ``NETWORKS`` and trains it with ``FairData``.

The network, as plain data (``NETWORKS``): layers in order, each a dict with ``name`` and
``kind``:

    conv     ``in``, ``out`` channels, square ``kernel``, ``pad`` on every side, stride 1
    pool     ``mode`` "max" or "avg", square ``kernel`` and ``stride``; Caffe's rule for the
             output size, ceil((size - kernel) / stride) + 1, the last window cut at the
             border; an average divides by the inputs its window covers
    relu
    linear   ``in``, ``out``; its input is the previous layer's output flattened
             channel by channel, then row, then column (C, H, W: Caffe's order)

The weights file (``.npz``, float32, the neutral layout every adapter converts from):

    <layer>.weight   conv: (out, in, kernel, kernel), Caffe's and PyTorch's OIHW;
                     linear: (out, in), ``in`` in the C, H, W order above
    <layer>.bias     (out,)

The loss is the mean softmax cross-entropy of the batch.  One step: the batch's loss and
gradient at the current weights, then for every parameter ``v = momentum * v + gradient;
w = w - learning_rate * v`` (``v`` starts at 0); Caffe's form, ``v = momentum * v +
learning_rate * gradient; w = w - v``, is the same with a constant learning rate.
"""

import functools
import hashlib

import numpy as np

from .contract import FAIR_WEIGHTS_FILE as WEIGHTS_FILE  # noqa: F401 (the host's too)

# Caffe's MNIST LeNet (examples/mnist/lenet_train_test.prototxt) and its CIFAR-10 quick
# network (examples/cifar10/cifar10_quick_train_test.prototxt), layer by layer.
NETWORKS = {
    "mnist": {
        "name": "LeNet", "input": (1, 28, 28), "classes": 10,
        "layers": [
            {"name": "conv1", "kind": "conv", "in": 1, "out": 20, "kernel": 5, "pad": 0},
            {"name": "pool1", "kind": "pool", "mode": "max", "kernel": 2, "stride": 2},
            {"name": "conv2", "kind": "conv", "in": 20, "out": 50, "kernel": 5, "pad": 0},
            {"name": "pool2", "kind": "pool", "mode": "max", "kernel": 2, "stride": 2},
            {"name": "ip1", "kind": "linear", "in": 800, "out": 500},
            {"name": "relu1", "kind": "relu"},
            {"name": "ip2", "kind": "linear", "in": 500, "out": 10},
        ]},
    "cifar10": {
        "name": "cifar10_quick", "input": (3, 32, 32), "classes": 10,
        "layers": [
            {"name": "conv1", "kind": "conv", "in": 3, "out": 32, "kernel": 5, "pad": 2},
            {"name": "pool1", "kind": "pool", "mode": "max", "kernel": 3, "stride": 2},
            {"name": "relu1", "kind": "relu"},
            {"name": "conv2", "kind": "conv", "in": 32, "out": 32, "kernel": 5, "pad": 2},
            {"name": "relu2", "kind": "relu"},
            {"name": "pool2", "kind": "pool", "mode": "avg", "kernel": 3, "stride": 2},
            {"name": "conv3", "kind": "conv", "in": 32, "out": 64, "kernel": 5, "pad": 2},
            {"name": "relu3", "kind": "relu"},
            {"name": "pool3", "kind": "pool", "mode": "avg", "kernel": 3, "stride": 2},
            {"name": "ip1", "kind": "linear", "in": 1024, "out": 64},
            {"name": "ip2", "kind": "linear", "in": 64, "out": 10},
        ]},
}
# How the initial weights are drawn: the prototxts' fillers (biases 0).  "xavier" is Caffe's:
# uniform in +-sqrt(3 / fan_in); ("gaussian", std) a normal of that deviation.
FILLERS = {
    "mnist": {"conv1": "xavier", "conv2": "xavier", "ip1": "xavier", "ip2": "xavier"},
    "cifar10": {"conv1": ("gaussian", 0.0001), "conv2": ("gaussian", 0.01),
                "conv3": ("gaussian", 0.01), "ip1": ("gaussian", 0.1), "ip2": ("gaussian", 0.1)},
}

# The input every framework trains on, made by this module from the data set's bytes:
# MNIST's pixels times 1/256 (LeNet's prototxt's scale), CIFAR-10's less the training
# set's mean of each channel (cifar10_quick subtracts the mean image; one mean per
# channel, fixed here, needs no file), float32, N x C x H x W.
MNIST_SCALE = 0.00390625
CIFAR10_MEANS = (125.3069, 122.9504, 113.8654)



def pooled_size(size, kernel, stride):
    """A pooling's output size by Caffe's rule (no padding): ceil((size - kernel) / stride) + 1."""
    return -(-(size - kernel) // stride) + 1


class WeightsError(Exception):
    """A weights file that does not fit the network; the message names the layer."""


def parameters(dataset):
    """(name, shape) of each parameter array of the data set's network, in order."""
    found = []
    for layer in NETWORKS[dataset]["layers"]:
        if layer["kind"] == "conv":
            k = layer["kernel"]
            found += [(layer["name"] + ".weight", (layer["out"], layer["in"], k, k)),
                      (layer["name"] + ".bias", (layer["out"],))]
        elif layer["kind"] == "linear":
            found += [(layer["name"] + ".weight", (layer["out"], layer["in"])),
                      (layer["name"] + ".bias", (layer["out"],))]
    return found


def parameter_count(dataset):
    return sum(int(np.prod(shape)) for _, shape in parameters(dataset))


def initial_weights(dataset, seed):
    """The initial weights of ``seed``: numpy's RandomState, whose stream numpy keeps
    the same in every version, drawn layer by layer in the network's order."""
    random = np.random.RandomState(seed)
    weights = {}
    for name, shape in parameters(dataset):
        layer, kind = name.split(".")
        if kind == "bias":
            weights[name] = np.zeros(shape, np.float32)
            continue
        filler = FILLERS[dataset][layer]
        if filler == "xavier":
            bound = np.sqrt(3.0 / int(np.prod(shape[1:])))
            values = random.uniform(-bound, bound, size=shape)
        else:
            values = random.normal(0.0, filler[1], size=shape)
        weights[name] = values.astype(np.float32)
    return weights


def check_weights(arrays, dataset):
    """The arrays of a weights file, checked against the network: every layer's weight
    and bias, of its shape, float32 and finite, and nothing else.  Raises WeightsError."""
    network = NETWORKS[dataset]["name"]
    expected = dict(parameters(dataset))
    for name, shape in expected.items():
        layer = name.split(".")[0]
        if name not in arrays:
            raise WeightsError("layer %s: the file has no %r (the fair %s's %s is %s)"
                               % (layer, name, network, name, _shape(shape)))
        array = arrays[name]
        if tuple(array.shape) != shape:
            raise WeightsError("layer %s: %r is %s, the fair %s's is %s"
                               % (layer, name, _shape(array.shape), network, _shape(shape)))
        if array.dtype != np.float32:
            raise WeightsError("layer %s: %r is %s, not float32" % (layer, name, array.dtype))
        if not np.isfinite(array).all():
            raise WeightsError("layer %s: %r holds values that are not finite" % (layer, name))
    check_names(arrays, dataset)


def _shape(shape):
    return " x ".join(str(n) for n in shape)


def load_weights(path, dataset):
    """A weights file's arrays, checked: its names before any array is read (as the host
    reads a user's file, whose headers it checked before the job was planned)."""
    with np.load(path, allow_pickle=False) as archive:
        check_names(archive.files, dataset)
        arrays = {name: archive[name] for name in archive.files}
    check_weights(arrays, dataset)
    return arrays


def check_names(names, dataset):
    """A weights file's array names: no layer the network does not have.  Raises WeightsError."""
    extra = sorted(set(names) - set(name for name, _ in parameters(dataset)))
    if extra:
        raise WeightsError("layer %s: the fair %s has no such layer (the file's %r)"
                           % (extra[0].split(".")[0], NETWORKS[dataset]["name"], extra[0]))


def weights_digest(arrays):
    """A digest of the weights themselves (names, shapes and bytes), whatever the file's
    compression: what a row records of its starting point."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name], dtype=np.float32)
        digest.update(("%s:%s;" % (name, _shape(array.shape))).encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def inputs(images, dataset):
    """The network's float32 N x C x H x W input of a data set's uint8 images."""
    if dataset == "mnist":
        return (images.astype(np.float32) * np.float32(MNIST_SCALE))[:, None, :, :]
    means = np.asarray(CIFAR10_MEANS, np.float32).reshape(1, 3, 1, 1)
    return images.astype(np.float32) - means


def order(seed, samples, steps, batch_size):
    """The training images of each step, ``steps`` x ``batch_size`` indices: passes over the
    training set one after another, each a permutation drawn from RandomState(seed)."""
    random = np.random.RandomState(seed)
    needed = steps * batch_size
    passes = [random.permutation(samples) for _ in range(-(-needed // samples))]
    return np.concatenate(passes)[:needed].reshape(steps, batch_size).astype(np.int64)


class FairData:
    """What a framework's fair network trains and tests on: the same arrays everywhere.
    ``arrays`` are the data set's own (uint8 images); the float32 inputs ``train_x`` and
    ``test_x`` are made when first used (Lua Torch7's program makes its own from the bytes)."""

    def __init__(self, arrays, dataset, hp, seed):
        self.dataset = dataset
        self.arrays = arrays
        self.network = NETWORKS[dataset]
        self.train_y = np.asarray(arrays["train_labels"], np.int64)
        self.test_y = np.asarray(arrays["test_labels"], np.int64)
        self.probe_x = inputs(arrays["test_images"][:hp["probe_images"]], dataset)
        self.order = order(seed, len(self.train_y), hp["steps"], hp["batch_size"])
        self.batch_size = hp["batch_size"]
        self.learning_rate = hp["learning_rate"]
        self.momentum = hp["momentum"]
        self.steps = hp["steps"]

    @functools.cached_property
    def train_x(self):
        return inputs(self.arrays["train_images"], self.dataset)

    @functools.cached_property
    def test_x(self):
        return inputs(self.arrays["test_images"], self.dataset)

    def batch(self, step):
        """Step ``step``'s images and labels."""
        chosen = self.order[step]
        return self.train_x[chosen], self.train_y[chosen]

    def test_scores(self, logits_of, batch_size=1000):
        """The test set's accuracy and mean cross-entropy from the network's logits
        (``logits_of(images)``, a batch at a time), computed here in float64."""
        correct, loss_sum = 0, 0.0
        for start in range(0, len(self.test_y), batch_size):
            logits = np.asarray(logits_of(self.test_x[start:start + batch_size]), np.float64)
            labels = self.test_y[start:start + batch_size]
            shifted = logits - logits.max(axis=1, keepdims=True)
            log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
            loss_sum -= float(log_p[np.arange(len(labels)), labels].sum())
            correct += int((logits.argmax(axis=1) == labels).sum())
        return {"accuracy": correct / len(self.test_y), "loss": loss_sum / len(self.test_y)}
