"""Lua Torch7 running GTDLBench's own scripts: built from the shared source mirror,
trained on the real data sets (quick profile), counted by Torch7 itself.

The image needs its source archives to be built, not to run (a run without them is
tested here); the source registry's errors (damaged archive, missing mirror, unknown
commit, a failed download) are tested in test_sources.py.
"""

from __future__ import annotations

import json

import docker
import pandas as pd
import pytest

from conftest import (NO_CHECKS, NO_ROUTE, assert_migration, assert_model_size, assert_robustness, dlbench,
                      quick_profile)
from orchestrator import catalog
from orchestrator.build import sources

pytestmark = pytest.mark.docker

MNIST_PARAMS = 832 + 51264 + 115400 + 2010            # SpatialConvolutionMM x2, Linear x2
CIFAR_PARAMS = 16 * 25 + 16 + 1024 * 25 + 256 + 819328 + 1290   # connections only, as Map holds them
# A small MNIST job for the tests of other things than training: 1,000 images each way, and
# none of the checks after training (the quick rows test those)
SMALL = [arg for setting in ("train_subset=1000", "test_subset=1000") + NO_CHECKS
         for arg in ("--set", setting)]


@pytest.fixture(scope="module")
def built(sources_root):
    proc = dlbench("build-images", "--frameworks", "torch", "--sources", sources_root, check=True,
                   timeout=3600)
    return proc


@pytest.fixture(scope="module")
def quick_rows(built, sources_root, data_root, tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    dlbench("run", "--frameworks", "torch", "--profile", "quick", "--results", results,
            "--data-dir", data_root, "--sources", sources_root, check=True, timeout=3600)
    return pd.read_parquet(results / "runs").set_index("dataset"), results


def test_the_image_records_every_pinned_commit(built, sources_root):
    tag, image_id, version = built.stdout.split(None, 2)     # "dlbench/torch:cpu  sha256:…  torch7@…"
    assert tag == "dlbench/torch:cpu" and version.startswith("torch7@")
    labels = docker.from_env().images.get(image_id.removeprefix("sha256:")).labels
    for repo in catalog.models("torch")["sources"]:
        assert labels[f"org.dlbench.sources.{repo}"] == sources.lookup(repo).commit
    again = dlbench("build-images", "--frameworks", "torch", "--sources", sources_root, check=True)
    assert "dlbench/torch:cpu: up to date" in again.stderr


def test_a_built_image_runs_without_its_sources(built, data_root, tmp_path):
    """Sources are needed to build, not to run: the image built (from the mirror), a run
    with no mirror, an empty user cache and no route to GitHub stores an ok row."""
    results, cache = tmp_path / "results", tmp_path / "cache"
    proc = dlbench("run", "--frameworks", "torch", "--datasets", "mnist", "--profile", "quick",
                   *SMALL, "--results", results,
                   "--data-dir", data_root, env={**NO_ROUTE, "XDG_CACHE_HOME": str(cache)}, check=True)
    assert "dlbench/torch:cpu: up to date" in proc.stderr
    rows = pd.read_parquet(results / "runs")
    assert rows["status"].tolist() == ["ok"], rows["error"].tolist()
    assert not (cache / "dlbench" / "sources").exists()


def test_omp_threads_is_the_scripts_thread_count(built, data_root, tmp_path):
    """``--set omp_threads=1`` on a two-thread job: the script's own -threads (its
    torch.setnumthreads, TH's OpenMP threads) is 1, OpenBLAS keeps the job's two."""
    results = tmp_path / "results"
    dlbench("run", "--frameworks", "torch", "--datasets", "mnist", "--profile", "quick",
            "--threads", "2", "--set", "omp_threads=1", *SMALL, "--results", results,
            "--data-dir", data_root, check=True)
    row = pd.read_parquet(results / "runs").iloc[0]
    assert row.status == "ok", row.error
    assert json.loads(row.threads_framework)["torch.getnumthreads"] == 1
    environment = json.loads(row.threads_env)
    assert (environment["OMP_NUM_THREADS"], environment["OPENBLAS_NUM_THREADS"]) == ("1", "2")


def test_quick_mnist_and_cifar10_are_ok_rows_of_torch7(quick_rows):
    rows, results = quick_rows
    assert set(rows.index) == {"mnist", "cifar10"} and set(rows["status"]) == {"ok"}, rows["error"].tolist()
    torch7 = sources.lookup("torch/torch7").commit
    for row in rows.itertuples():
        assert row.framework == "torch"
        assert row.framework_version == f"torch7@{torch7} LuaJIT 2.1.0-beta1"
        assert row.train_time_s > 0 and row.test_time_s > 0 and row.setup_time_s > 0
        assert row.paper_train_time_s > 0 and row.paper_test_time_s > 0
        assert "openblas" in json.loads(row.libraries)["th_blas"][0] and row.blas_loaded == "openblas-pthread"
        assert len(row.epoch_loss) == 1
    mnist, cifar = rows.loc["mnist"], rows.loc["cifar10"]
    assert mnist.accuracy >= 0.80          # 150 steps of 10 images: 86%
    assert mnist.param_count == MNIST_PARAMS == 169506
    assert cifar.param_count == CIFAR_PARAMS == 846890
    for row in (mnist, cifar):              # torch.save of the model: weights and gradient buffers
        assert_model_size(row, element_sizes=(4, 8), at_most=2.1)
    assert_robustness(results, mnist)       # by Torch7's own updateGradInput, in th
    assert_robustness(results, cifar)       # through the rebuilt contrast normalisation too
    assert_migration(results, mnist)        # the trained modules th wrote, as a layer list
    assert_migration(results, cifar)        # the contrast layer, connection tables as dense weights
    assert cifar.accuracy > 0.15
    for ds, row in (("mnist", mnist), ("cifar10", cifar)):
        quick = quick_profile("torch", ds)
        assert (row.train_samples, row.test_samples) == (quick["train_subset"], quick["test_subset"])
    libraries = {ds: json.loads(rows.loc[ds, "libraries"]) for ds in rows.index}
    assert libraries["mnist"]["tensor_type"] == "torch.FloatTensor"      # the MNIST script's own choice
    assert libraries["cifar10"]["tensor_type"] == "torch.DoubleTensor"   # CIFAR-10's never set: float64
    # the script's own totals: its one training pass, and one test pass (one epoch)
    assert mnist.paper_train_time_s == pytest.approx(mnist.train_time_s, rel=0.2)
    assert mnist.paper_test_time_s == pytest.approx(mnist.test_time_s, rel=0.3, abs=0.5)
    threads = json.loads(mnist.threads_framework)["torch.getnumthreads"]
    assert threads == (mnist.threads if pd.notna(mnist.threads) and mnist.threads else 4)


def test_two_epochs_test_after_each_and_the_paper_test_time_is_the_last_pass(
        built, sources_root, data_root, tmp_path):
    results = tmp_path / "results"
    dlbench("run", "--frameworks", "torch", "--datasets", "mnist", "--profile", "quick",
            "--set", "epochs=2", *SMALL, "--results", results,
            "--data-dir", data_root, "--sources", sources_root, check=True, timeout=3600)
    row = pd.read_parquet(results / "runs").iloc[0]
    result = json.load(open(results / "_jobs" / row.run_id / "result.json"))
    assert [e["epoch"] for e in result["epochs"]] == [1, 2]
    assert all(0 < e["test_accuracy"] <= 1 for e in result["epochs"])
    assert result["train_excluded_s"] > 0          # epoch 1's test pass, not training
    assert result["epochs"][-1]["test_accuracy"] == row.accuracy
    # the paper span is the script's last test pass, timed by its own clock: the runner's pass;
    # the script's whole test time (both passes) stays in result.json
    assert row.paper_test_time_s == pytest.approx(row.test_time_s, rel=0.1)
    periodic = result["periodic"]
    assert periodic["test_passes"] == 2
    assert periodic["test_time_sum_s"] > 1.5 * row.paper_test_time_s


# -- the CIFAR-10 script on a GPU: SpatialConvolutionMap as a masked full convolution ----------
MASKED_MAP_CHECK = r"""
require 'nn'
local cjson = require 'cjson'
package.path = '/opt/dlbench/framework/?.lua;' .. package.path
local maps = require 'dlbench_maps'
local found = {}
-- the script's two Maps, at the shapes they see (one CIFAR-10 image, then stage 2's input)
for _, case in ipairs({{3, 16, 1, 32}, {16, 256, 4, 14}}) do
   local nin, nout, nto, size = unpack(case)
   torch.manualSeed(11)
   local map = nn.SpatialConvolutionMap(nn.tables.random(nin, nout, nto), 5, 5)
   local after_map = torch.uniform()          -- the random stream after the script's Map
   torch.manualSeed(11)
   local conv = maps.masked(nn.SpatialConvolutionMap(nn.tables.random(nin, nout, nto), 5, 5))
   local after_masked = torch.uniform()
   local input = torch.randn(nin, size, size)
   local out_map, out_conv = map:forward(input), conv:forward(input)
   local gradOutput = torch.randn(out_map:size())
   map:zeroGradParameters(); conv:zeroGradParameters()
   local gin_map = map:backward(input, gradOutput):clone()
   local gin_conv = conv:backward(input, gradOutput):clone()
   -- the Map's kernel k is the full convolution's kernel [output][input] of table row k
   local kernel_diff, inside = 0, 0
   for k = 1, map.connTable:size(1) do
      local i, o = map.connTable[k][1], map.connTable[k][2]
      kernel_diff = math.max(kernel_diff, (map.gradWeight[k] - conv.gradWeight[o][i]):abs():max())
      inside = inside + conv.gradWeight[o][i]:abs():sum()
   end
   local outside = conv.gradWeight:clone():cmul(1 - conv.mask):abs():sum()
   -- without the mask the full convolution's gradient reaches kernels outside the table
   local plain = nn.SpatialConvolution(nin, nout, 5, 5)
   plain.weight:copy(conv.weight); plain.bias:copy(conv.bias); plain:zeroGradParameters()
   plain:forward(input); plain:backward(input, gradOutput)
   local plain_outside = plain.gradWeight:clone():cmul(1 - conv.mask):abs():sum()
   conv:updateParameters(0.5)                 -- an SGD step keeps the zeros at zero
   found[#found + 1] = {
      output = (out_map - out_conv):abs():max(), output_scale = out_map:abs():max(),
      grad_input = (gin_map - gin_conv):abs():max(), grad_weight = kernel_diff,
      grad_bias = (map.gradBias - conv.gradBias):abs():max(), inside = inside,
      outside = outside, plain_outside = plain_outside,
      weight_outside = conv.weight:clone():cmul(1 - conv.mask):abs():max(),
      same_stream = after_map == after_masked,
      trainable = maps.trainable(conv), map_parameters = map.weight:nElement() + map.bias:nElement(),
      type = torch.type(conv)}
end
-- what the harness does on a GPU: the script's constructor gives the masked twin
local made = {}
maps.replace(made)
local model = nn.Sequential():add(nn.SpatialConvolutionMap(nn.tables.random(3, 16, 1), 5, 5))
found[#found + 1] = {made = #made, first = torch.type(model:get(1))}
print(cjson.encode(found))
"""


def test_a_masked_full_convolution_computes_the_scripts_spatial_convolution_map(built, tmp_path):
    """The reconstruction of the CIFAR-10 script for the GPU (cunn has no SpatialConvolutionMap)
    checked on the CPU, in float64 as the script trains: for the same weights and input, the
    masked full convolution gives the Map's output, input gradient, kernel and bias gradients;
    its gradient outside the table is zero (a plain full convolution's is not), so an update
    keeps those kernels at zero; it has the Map's trainable parameters and leaves the script's
    random stream as the Map left it."""
    (tmp_path / "check.lua").write_text(MASKED_MAP_CHECK)
    out = docker.from_env().containers.run(
        "dlbench/torch:cpu", entrypoint=["th", "/check/check.lua"], remove=True, network_mode="none",
        volumes={str(tmp_path): {"bind": "/check", "mode": "ro"}}).decode()
    *cases, replaced = json.loads(out.strip().splitlines()[-1])
    for case in cases:
        assert case["type"] == "nn.DlbenchMaskedConvolution"
        assert case["output"] <= 1e-12 * case["output_scale"], case
        assert case["grad_input"] < 1e-10 and case["grad_weight"] < 1e-10 and case["grad_bias"] < 1e-12
        assert case["inside"] > 0 and case["outside"] == 0 and case["plain_outside"] > 0
        assert case["weight_outside"] == 0
        assert case["trainable"] == case["map_parameters"]
        assert case["same_stream"] is True
    assert [c["trainable"] for c in cases] == [16 * 25 + 16, 1024 * 25 + 256]   # CIFAR_PARAMS' convolutions
    assert replaced == {"made": 1, "first": "nn.DlbenchMaskedConvolution"}
