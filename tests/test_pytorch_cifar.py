"""The PyTorch port of Torch7's CIFAR-10 model (train-on-cifar.lua, model 'convnet') through the pipeline.

One quick run (built image, real container, real CIFAR-10) leaves a row; the
connection tables are checked both as the pure algorithm (on the host) and as
the grouped convolutions of the model the image builds.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pandas as pd
import pytest

from conftest import REPO, assert_migration, assert_model_size, assert_robustness, quick_profile
from dlbench_runner.runner import adapter_module

pytestmark = pytest.mark.docker

# conv1 16*1*25+16, conv2 256*4*25+256, linear 6400*128+128, linear 128*10+10
CIFAR_PARAMS = 416 + 25856 + 819328 + 1290


def torch_adapter_module():
    return adapter_module(REPO / "images" / "pytorch")   # torch itself: only inside the container


@pytest.fixture(scope="module")
def quick_row(quick_run):
    frame = pd.read_parquet(quick_run("pytorch", "cifar10") / "runs")
    assert len(frame) == 1
    return frame.iloc[0]


def test_quick_cifar_run_learns_and_counts_only_connected_weights(quick_row, quick_run):
    row = quick_row
    assert (row.framework, row.dataset, row.profile, row.status) == ("pytorch", "cifar10", "quick", "ok")
    assert row.model == "torch7-cifar10-convnet"
    assert row.accuracy >= 0.20                 # twice chance
    assert row.param_count == CIFAR_PARAMS == 846890
    assert_model_size(row, at_most=1.01)        # and the connection tables' indices
    assert_robustness(quick_run("pytorch", "cifar10"), row)    # through the YUV normalisation
    assert_migration(quick_run("pytorch", "cifar10"), row)     # the normalisation in the graph
    quick = quick_profile("pytorch", "cifar10")
    assert (row.train_samples, row.test_samples) == (quick["train_subset"], quick["test_subset"])
    assert len(row.epoch_loss) == 1
    assert row.train_time_s > 0 and row.test_time_s > 0 and row.setup_time_s > 0


def test_random_connection_tables_follow_nn_tables_random():
    module = torch_adapter_module()
    rng = random.Random(7)

    def randperm(n):
        return rng.sample(range(n), n)

    for nin, nout, nto in ((3, 16, 1), (16, 256, 4)):
        table = module.random_connection_table(nin, nout, nto, randperm)
        assert len(table) == nout * nto
        inputs = {out: [inp for inp, o in table if o == out] for out in range(nout)}
        assert all(len(set(planes)) == nto for planes in inputs.values())
        assert all(0 <= inp < nin for planes in inputs.values() for inp in planes)
    # 16 -> 256 by 4: every run of 4 output planes covers each input plane once.
    uses = Counter(inp for inp, _ in module.random_connection_table(16, 256, 4, randperm))
    assert set(uses.values()) == {64}


CHECK_IN_IMAGE = """
import json, sys, torch
sys.path.insert(0, "/opt/dlbench/framework")
import adapter
class Ctx:
    hp, threads, seed, device, dataset = {}, 1, 1, "cpu", "cifar10"
a = adapter.Adapter(Ctx)
a.torch = torch
torch.manual_seed(1)
a.model = a._cifar_model()
convs = [m for m in a.model.modules() if hasattr(m, "gather")]
x = torch.randn(1, 3, 32, 32)
first = convs[0]
# the grouped convolution is the table's own sum over each output's connected planes
direct = torch.stack([sum(torch.nn.functional.conv2d(x[:, i:i + 1], first.weight[o:o + 1, k:k + 1])[0, 0]
                          for k, i in enumerate([i for i, oo in first.table if oo == o]))
                      + first.bias[o] for o in range(16)])
print(json.dumps({
    "inputs_per_output": [m.weight.shape[1] for m in convs],
    "outputs": [m.weight.shape[0] for m in convs],
    "gathered_follow_the_table": all(sorted(m.gather.tolist()) == sorted(i for i, _ in m.table) for m in convs),
    "matches_the_table": bool(torch.allclose(first(x)[0], direct, atol=1e-5)),
    "param_count": a._param_count(),
}))
"""


def test_the_images_connection_tables_are_grouped_convolutions_of_1_and_4_inputs(quick_row):
    import docker

    out = docker.from_env().containers.run(
        "dlbench/pytorch:cpu", entrypoint=["python3", "-c", CHECK_IN_IMAGE],
        remove=True, network_mode="none").decode()
    found = json.loads(out.strip().splitlines()[-1])
    assert found["inputs_per_output"] == [1, 4]
    assert found["outputs"] == [16, 256]
    assert found["gathered_follow_the_table"] is True and found["matches_the_table"] is True
    assert found["param_count"] == CIFAR_PARAMS


def test_the_banded_matrices_smooth_as_the_zero_padded_separable_filter():
    """The local contrast normalisation's smoothing as two matrix products (a float64
    convolution has no onnxruntime kernel): B @ x @ B.T is the 1-D kernel's correlation
    down and across the plane, zero-padded, as nn.SpatialSubtractiveNormalization's."""
    import numpy as np

    taps = np.array(torch_adapter_module().gaussian1d(7))
    band = np.array(torch_adapter_module().banded(list(taps), 12))
    plane = np.random.RandomState(3).rand(12, 12)
    padded = np.pad(plane, 3)
    down = np.array([[taps @ padded[i:i + 7, j] for j in range(18)] for i in range(12)])
    expected = np.array([[taps @ down[i, j:j + 7] for j in range(12)] for i in range(12)])
    assert np.allclose(band @ plane @ band.T, expected, rtol=1e-13, atol=0)
