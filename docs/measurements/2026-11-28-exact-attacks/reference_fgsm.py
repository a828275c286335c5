"""FGSM on an exported LeNet, in float64 NumPy, by hand: the independent re-derivation of
the robustness rows' FGSM figures.

    .venv/bin/python docs/measurements/2026-11-28-exact-attacks/reference_fgsm.py \
        MODEL.onnx --data-dir DATA --images 1000 --epsilons 0.1,0.2,0.3

Reads the ONNX model a job exported (the migration check's, pixels in [0, 1] to logits),
evaluates its graph in float64 with NumPy (its float32 weights widened), differentiates the
cross entropy of its logits by hand (reverse mode through the graph's few operators: the
ones an MNIST LeNet exports to), and attacks the first ``--images`` MNIST test images with
x + eps sign(dL/dx), clipped to [0, 1], each epsilon's accuracy judged by the same float64
graph.  Nothing of the runner's or a framework's is used: what it shares with them is the
exported model and the definition of the attack.  Also prints how the float64 graph's clean
predictions compare with onnxruntime's float32 ones (they should agree on every image), and
how many images' float32 cross-entropy output gradient (softmax - onehot in float32) is
zero at the true class: those the old attacks could not move.
"""

import argparse
import gzip
import os

import numpy as np
import onnx
from onnx import numpy_helper


def mnist_test(data_dir, count):
    folder = os.path.join(data_dir, "mnist")
    with gzip.open(os.path.join(folder, "t10k-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(os.path.join(folder, "t10k-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return images[:count], labels[:count].astype(np.int64)


def windows(x, k, stride):
    """N x C x H x W -> N x C x H' x W' x k x k views."""
    n, c, h, w = x.shape
    s = x.strides
    shape = (n, c, (h - k) // stride + 1, (w - k) // stride + 1, k, k)
    return np.lib.stride_tricks.as_strided(x, shape, s[:2] + (s[2] * stride, s[3] * stride) + s[2:])


class Graph:
    """The model's nodes run in order; each differentiable one keeps what its backward needs."""

    def __init__(self, path):
        model = onnx.load(path)
        self.nodes = list(model.graph.node)
        self.constants = {t.name: numpy_helper.to_array(t).astype(np.float64)
                          if numpy_helper.to_array(t).dtype.kind == "f" else numpy_helper.to_array(t)
                          for t in model.graph.initializer}
        self.input = model.graph.input[0].name
        self.output = model.graph.output[0].name

    def forward(self, x):
        values = dict(self.constants)
        values[self.input] = x
        tape = []
        for node in self.nodes:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            args = [values[name] if name else None for name in node.input]
            out, saved = run(node.op_type, args, attrs)
            values[node.output[0]] = out
            tape.append((node, attrs, args, saved))
        return values[self.output], tape, values

    def backward(self, tape, values, grad_output):
        grads = {self.output: grad_output}
        for node, attrs, args, saved in reversed(tape):
            g = grads.pop(node.output[0], None)
            if g is None:
                continue
            for name, gi in zip(node.input, back(node.op_type, args, attrs, saved, g)):
                if gi is not None and name not in self.constants:
                    grads[name] = grads.get(name, 0) + gi
        return grads[self.input]


def run(op, args, attrs):
    x = args[0]
    if op in ("Reshape",):
        shape = [d if d != 0 else x.shape[i] for i, d in enumerate(args[1].astype(np.int64))]
        return x.reshape(shape), None
    if op == "Unsqueeze":
        axes = attrs.get("axes", args[1] if len(args) > 1 else None)
        return np.expand_dims(x, tuple(int(a) for a in np.atleast_1d(axes))), None
    if op == "Flatten":
        axis = attrs.get("axis", 1)
        return x.reshape(int(np.prod(x.shape[:axis])), -1), None
    if op == "Shape":
        return np.array(x.shape, np.int64), None
    if op == "Slice":
        starts, ends = args[1], args[2]
        axes = args[3] if len(args) > 3 and args[3] is not None else range(len(starts))
        index = [slice(None)] * x.ndim
        for s, e, a in zip(starts, ends, axes):
            index[int(a)] = slice(int(s), int(min(e, x.shape[int(a)])))
        return x[tuple(index)], None
    if op == "Concat":
        return np.concatenate(args, axis=attrs["axis"]), None
    if op in ("Mul", "Add", "Sub"):
        return {"Mul": np.multiply, "Add": np.add, "Sub": np.subtract}[op](args[0], args[1]), None
    if op == "Tanh":
        y = np.tanh(x)
        return y, y
    if op == "Relu":
        return np.maximum(x, 0), x > 0
    if op == "Gemm":
        assert attrs.get("transA", 0) == 0 and attrs.get("alpha", 1.0) == 1.0
        w = args[1].T if attrs.get("transB", 0) else args[1]
        return x @ w + (args[2] if len(args) > 2 else 0), w
    if op == "Conv":
        w = args[1]
        assert attrs.get("group", 1) == 1 and not any(attrs.get("pads", [0])) \
            and tuple(attrs.get("strides", [1, 1])) == (1, 1)
        k = w.shape[-1]
        cols = windows(x, k, 1)                       # N C H' W' k k
        y = np.einsum("nchwij,ocij->nohw", cols, w, optimize=True)
        return y + (args[2].reshape(1, -1, 1, 1) if len(args) > 2 else 0), None
    if op == "MaxPool":
        k = attrs["kernel_shape"][0]
        assert tuple(attrs["strides"]) == (k, k) and not any(attrs.get("pads", [0]))
        n, c, h, w = x.shape
        cut = x[:, :, :h // k * k, :w // k * k]
        blocks = cut.reshape(n, c, h // k, k, w // k, k)
        y = blocks.max(axis=(3, 5))
        return y, (blocks, y)
    raise SystemExit(f"reference_fgsm: no operator {op} here")


def back(op, args, attrs, saved, g):
    x = args[0]
    if op in ("Reshape", "Unsqueeze", "Flatten"):
        return [g.reshape(x.shape)]
    if op in ("Shape", "Slice", "Concat"):
        return []
    if op == "Mul":
        return [g * args[1] if np.ndim(args[1]) == 0 or args[1].size == 1 or args[1].shape == g.shape
                else np.broadcast_to(g * args[1], g.shape), None]
    if op == "Add":
        return [g, None]
    if op == "Sub":
        return [g, None]
    if op == "Tanh":
        return [g * (1 - saved ** 2)]
    if op == "Relu":
        return [g * saved]
    if op == "Gemm":
        return [g @ saved.T]
    if op == "Conv":
        w = args[1]
        k = w.shape[-1]
        padded = np.pad(g, ((0, 0), (0, 0), (k - 1, k - 1), (k - 1, k - 1)))
        flipped = w[:, :, ::-1, ::-1]
        return [np.einsum("nohwij,ocij->nchw", windows(padded, k, 1), flipped, optimize=True)]
    if op == "MaxPool":
        blocks, y = saved
        k = blocks.shape[3]
        # the gradient goes to the first maximum of each window, as the frameworks give it
        n, c, hh, _, ww, _ = blocks.shape
        flat = blocks.transpose(0, 1, 2, 4, 3, 5).reshape(n, c, hh, ww, k * k)
        first = flat.argmax(-1)
        out = np.zeros_like(flat)
        np.put_along_axis(out, first[..., None], g[..., None], -1)
        out = out.reshape(n, c, hh, ww, k, k).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, hh * k, ww * k)
        full = np.zeros(x.shape)
        full[:, :, :hh * k, :ww * k] = out
        return [full]
    raise SystemExit(f"reference_fgsm: no backward of {op} here")


def cross_entropy_gradient(z, labels):
    """softmax - onehot in float64, the true class's term as minus the others' sum."""
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    g = p.copy()
    rows = np.arange(len(z))
    g[rows, labels] = 0.0
    g[rows, labels] = -g.sum(1)
    return g


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--epsilons", default="0.05,0.1,0.2,0.3")
    options = parser.parse_args()
    images, labels = mnist_test(options.data_dir, options.images)
    x = images.astype(np.float64) / 255.0
    graph = Graph(options.model)
    z, tape, values = graph.forward(x)
    predicted = z.argmax(1)
    import onnxruntime
    session = onnxruntime.InferenceSession(options.model, providers=["CPUExecutionProvider"])
    z32 = session.run(None, {graph.input: x.astype(np.float32)})[0]
    print(f"model {os.path.basename(options.model)}: {len(x)} images, clean accuracy "
          f"{np.mean(predicted == labels):.4f}; onnxruntime float32 predicts otherwise on "
          f"{int(np.sum(z32.argmax(1) != predicted))}, largest logit difference "
          f"{np.abs(z32 - z).max():.2e}")
    p32 = np.exp(z32 - z32.max(1, keepdims=True), dtype=np.float32)
    p32 /= p32.sum(1, keepdims=True)
    rows = np.arange(len(x))
    print(f"images whose float32 softmax gives the true class exactly 1 (its output gradient 0 "
          f"there): {int(np.sum((p32[rows, labels] == np.float32(1.0)) & (predicted == labels)))}")
    gradient = graph.backward(tape, values, cross_entropy_gradient(z, labels))
    direction = np.sign(gradient)
    for eps in [float(e) for e in options.epsilons.split(",")]:
        adversarial = np.clip(x + eps * direction, 0.0, 1.0)
        found = graph.forward(adversarial)[0].argmax(1)
        print(f"FGSM eps {eps:g}: accuracy {np.mean(found == labels):.4f}")


if __name__ == "__main__":
    main()
