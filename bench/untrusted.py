"""What the host's check of a job's model takes in its child process (orchestrator/checks/untrusted.py):
wall-clock time, CPU time and peak memory, against the limits.

The models: the stored MNIST models of the paper profile in docs/measurements (MXNet's and
Caffe's, 10,000 test images each), and a graph of ResNet-110's shape (the paper's CIFAR-10
model, MXNet's; 109 convolutions with BatchNorm in 54 residual blocks, 16/32/64 channels, random
weights: the time depends on the shape, not on the values) on the 10,000 CIFAR-10 test
images of the paper profile, the heaviest check of a job.

    .venv/bin/python bench/untrusted.py --data-dir DIR
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dlbench_runner.contract import formats      # noqa: E402
from orchestrator.checks import untrusted              # noqa: E402

STORED = REPO / "docs" / "measurements" / "2026-11-26-mnist-paper-checks" / "models"


def resnet110() -> bytes:
    """A graph of ResNet-110's shape for CIFAR-10 (N x 3 x 32 x 32 -> N x 10)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, count = [], [], [0]

    def name(kind):
        count[0] += 1
        return f"{kind}{count[0]}"

    def conv(x, cin, cout, stride, relu=True):
        w, s, b, m, v, y = (name(k) for k in "wsbmvy")
        weights.append(numpy_helper.from_array((rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin))
                                               .astype(np.float32), w))
        for n, value in ((s, 1.0), (b, 0.0), (m, 0.0), (v, 1.0)):
            weights.append(numpy_helper.from_array(np.full(cout, value, np.float32), n))
        nodes.append(helper.make_node("Conv", [x, w], [y + "c"], pads=[1, 1, 1, 1], strides=[stride, stride]))
        nodes.append(helper.make_node("BatchNormalization", [y + "c", s, b, m, v], [y + ("b" if relu else "")]))
        if relu:
            nodes.append(helper.make_node("Relu", [y + "b"], [y]))
        return y

    x = conv("pixels", 3, 16, 1)
    cin = 16
    for cout in (16, 32, 64):
        for block in range(18):
            stride = 2 if cout != cin else 1
            h = conv(conv(x, cin, cout, stride), cout, cout, 1, relu=False)
            if stride != 1 or cin != cout:
                x = conv(x, cin, cout, stride, relu=False)
            y = name("sum")
            nodes.append(helper.make_node("Add", [h, x], [y]))
            nodes.append(helper.make_node("Relu", [y], [y + "r"]))
            x, cin = y + "r", cout
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"]))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["flat"]))
    weights.append(numpy_helper.from_array(rng.standard_normal((64, 10)).astype(np.float32), "fc"))
    nodes.append(helper.make_node("MatMul", ["flat", "fc"], ["outputs"]))
    graph = helper.make_graph(nodes, "resnet110", [helper.make_tensor_value_info("pixels", TensorProto.FLOAT,
                                                                                 ["N", 3, 32, 32])],
                              [helper.make_tensor_value_info("outputs", TensorProto.FLOAT, ["N", 10])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, type=Path)
    args = parser.parse_args()
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), platform.processor() or platform.machine(),
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(" ".join(sys.argv))
    print(f"limits: {untrusted.WALL_SECONDS} s wall, {untrusted.CPU_SECONDS} s CPU, "
          f"{untrusted.MEMORY_BYTES >> 30} GiB address space, {untrusted.THREADS} threads")
    mnist, _ = formats.test_split("mnist", str(args.data_dir))
    cifar, _ = formats.test_split("cifar10", str(args.data_dir))
    models = [(f"stored {p.stem} (MNIST, paper)", p.read_bytes(), mnist) for p in sorted(STORED.glob("*.onnx"))]
    models.append(("ResNet-110's shape (CIFAR-10, paper)", resnet110(), cifar))
    for label, model, images in models:
        started = time.monotonic()
        found, = untrusted.classify(model, [images], 16)
        wall = time.monotonic() - started
        usage = untrusted.last_usage[0]
        state = f"refused: {found}" if isinstance(found, untrusted.Refused) else "ok"
        print(f"{label}: {len(model) / 1e6:.1f} MB, {len(images)} images: {wall:.1f} s wall, "
              f"{usage.ru_utime + usage.ru_stime:.1f} s CPU, peak {usage.ru_maxrss / 1024:.0f} MiB; {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
