"""The mxnet image end to end: built (or found up to date), then the quick
profile of MXNet's image-classification defaults (LeNet on MNIST, ResNet-110
on CIFAR-10) run through the CLI on the real data sets; the networks and the
data pipeline are also checked piece by piece, on the host (pure Python and
numpy) and inside the image (with MXNet itself)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from conftest import REPO, assert_migration, assert_model_size, assert_robustness, dlbench
from dlbench_runner.runner import adapter_module

FRAMEWORK = "mxnet"
# LeNet: conv 1->20 5x5 (500+20), conv 20->50 5x5 (25000+50),
# fc 800->500 (400000+500), fc 500->10 (5000+10)
LENET_PARAMS = 520 + 25050 + 400500 + 5010
# ResNet-110 (CIFAR): bn_data gamma+beta 3+3; conv0 3->16 3x3 no bias 432;
# a basic unit with C_in -> C: bn1 2*C_in + conv1 9*C_in*C + bn2 2*C + conv2 9*C*C,
# plus a 1x1 shortcut C_in*C in the first unit of every stage (stage 1 included);
# 18 units per stage of 16, 32, 64 filters; bn1 2*64; fc 64*10+10.
STAGE1 = 18 * (32 + 2304 + 32 + 2304) + 16 * 16                         # 84352
STAGE2 = (32 + 4608 + 64 + 9216 + 512) + 17 * (64 + 9216 + 64 + 9216)    # 329952
STAGE3 = (64 + 18432 + 128 + 36864 + 2048) + 17 * (128 + 36864 + 128 + 36864)  # 1315264
RESNET110_PARAMS = 6 + 432 + STAGE1 + STAGE2 + STAGE3 + 128 + 650


def mxnet_adapter_module():
    return adapter_module(REPO / "images" / "mxnet")   # mxnet itself: only inside the container


def quick_profiles():
    with open(REPO / "images" / "mxnet" / "models.json") as f:
        models = json.load(f)["models"]
    return {name: entry["profiles"]["quick"] for name, entry in models.items()}


# -- host: the pure parts of the adapter ------------------------------------------------
def test_resnet_config_follows_resnet_py():
    module = mxnet_adapter_module()
    assert module.resnet_config(110, (3, 28, 28)) == ([18, 18, 18], [16, 16, 32, 64], False)
    assert module.resnet_config(20, (3, 28, 28)) == ([3, 3, 3], [16, 16, 32, 64], False)
    assert module.resnet_config(164, (3, 28, 28)) == ([18, 18, 18], [16, 64, 128, 256], True)
    with pytest.raises(ValueError):
        module.resnet_config(100, (3, 28, 28))
    with pytest.raises(ValueError):
        module.resnet_config(110, (3, 32, 32))     # the ImageNet branch of get_symbol()


def test_learning_rate_steps_are_counted_as_fit_py_counts_them():
    module = mxnet_adapter_module()
    assert module.epoch_size(60000, 64) == 938            # ceil(937.5)
    assert module.epoch_size(50000, 128) == 391           # ceil(390.625)
    assert module.lr_steps("10", 938) == [9380]
    assert module.lr_steps("200,250", 391) == [78200, 97750]


def test_an_epoch_is_whole_batches_padded_from_its_start():
    module = mxnet_adapter_module()
    batches = module.epoch_order(np.random.RandomState(3), 10, 4)
    assert [len(b) for b in batches] == [4, 4, 4]
    flat = [int(i) for b in batches for i in b]
    assert sorted(flat[:10]) == list(range(10)) and flat[10:] == flat[:2]


def test_hls_conversion_matches_opencv_on_known_colours():
    module = mxnet_adapter_module()
    rgb = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255], [0, 0, 0],
                    [128, 128, 128], [255, 255, 0]], dtype=np.uint8)
    hls = module.rgb_to_hls_u8(np, rgb)
    # OpenCV 8-bit HLS: H in degrees / 2, L and S scaled to 255
    assert hls.tolist() == [[0, 128, 255], [60, 128, 255], [120, 128, 255], [0, 255, 0],
                            [0, 0, 0], [0, 128, 0], [30, 128, 255]]
    # and back: L 128 is 0.502, so the low channels come back as 2L - 1 = 1/255
    assert module.hls_to_rgb_u8(np, hls).tolist() == [[255, 1, 1], [1, 255, 1], [1, 1, 255],
                                                     [255, 255, 255], [0, 0, 0],
                                                     [128, 128, 128], [255, 255, 1]]
    rng = np.random.RandomState(0)
    colours = rng.randint(0, 256, (5000, 3)).astype(np.uint8)
    back = module.hls_to_rgb_u8(np, module.rgb_to_hls_u8(np, colours)).astype(int)
    error = np.abs(back - colours)   # 8-bit HLS is lossy: hue in 2-degree steps (up to 255/60 per degree)
    assert error.max() <= 8 and error.mean() < 1


def test_augmentation_pads_crops_and_subtracts_the_mean():
    module = mxnet_adapter_module()
    hp = {"image_shape": "3,28,28", "pad_size": 4, "fill_value": 127, "random_crop": 1,
          "random_mirror": 0, "max_random_h": 0, "max_random_s": 0, "max_random_l": 0,
          "rgb_mean": "123.68,116.779,103.939"}
    images = np.random.RandomState(1).randint(0, 256, (64, 3, 32, 32)).astype(np.uint8)
    out = module.augment(np, np.random.RandomState(2), images, hp)
    assert out.shape == (64, 3, 28, 28) and out.dtype == np.float32
    mean = np.array([123.68, 116.779, 103.939], dtype=np.float32)[None, :, None, None]
    padded = np.pad(images, ((0, 0), (0, 0), (4, 4), (4, 4)), constant_values=127)
    restored = (out + mean).round().astype(int)
    for k in range(len(images)):              # each output is one 28x28 window of its padded image
        windows = [(y, x) for y in range(13) for x in range(13)
                   if (padded[k, :, y:y + 28, x:x + 28] == restored[k]).all()]
        assert windows, k
    centre = module.centre(np, images, hp)
    assert np.allclose(centre + mean, images[:, :, 2:30, 2:30])
    jittered = module.augment(np, np.random.RandomState(2), images,
                              dict(hp, random_mirror=1, max_random_h=36, max_random_s=50,
                                   max_random_l=50))
    assert jittered.shape == (64, 3, 28, 28) and not np.allclose(jittered, out)


NO_AUGMENTATION = {"image_shape": "3,4,4", "pad_size": 0, "fill_value": 127, "random_crop": 0,
                   "random_mirror": 0, "max_random_h": 0, "max_random_s": 0, "max_random_l": 0,
                   "rgb_mean": "0,0,0"}


def record_epochs(module, n, chunk, batch, epochs, limit=0, hp=None, seed=0):
    """RecordIter's batches over tiny images whose labels are their indices: per epoch,
    the list of label arrays."""
    hp = dict(hp or NO_AUGMENTATION, batch_size=batch)
    shape = module.parse_shape(hp["image_shape"])
    images = np.zeros((n, 3, shape[1], shape[2]), dtype=np.uint8)
    labels = np.arange(n, dtype=np.float32)
    it = module.RecordIter(np, np.random.RandomState(seed), images, labels, hp, chunk)
    out = {}
    for epoch, i, count, x, y in it.stream(epochs, limit):
        assert len(y) == len(x) == batch and x.dtype == np.float32
        out.setdefault(epoch, []).append(y.astype(int))
        assert len(out[epoch]) == i + 1 and i < count
    return out


def test_the_record_iterator_shuffles_within_chunks_and_rounds_the_last_batch():
    """ImageRecordIter (MXNet 1.0, shuffle=True, round_batch): file order by chunks, each
    chunk shuffled within itself; the file's end filled from its start, whose chunk's rest
    opens the next epoch."""
    module = mxnet_adapter_module()
    epochs = record_epochs(module, n=10, chunk=4, batch=4, epochs=3)
    assert [len(epochs[e]) for e in (1, 2, 3)] == [3, 2, 3]
    first = np.concatenate(epochs[1])
    assert sorted(first[:4]) == [0, 1, 2, 3] and sorted(first[4:8]) == [4, 5, 6, 7]
    assert sorted(first[8:10]) == [8, 9] and set(first[10:]) <= {0, 1, 2, 3}
    second = np.concatenate(epochs[2])
    # the rest of the re-read first chunk, then the file from its second chunk on
    assert sorted(list(second[:2]) + list(first[10:])) == [0, 1, 2, 3]
    assert sorted(second[2:6]) == [4, 5, 6, 7] and sorted(second[6:]) == [8, 9]
    third = np.concatenate(epochs[3])         # epoch 2 ended on a batch boundary: a fresh start
    assert sorted(third[:4]) == [0, 1, 2, 3] and sorted(third[8:10]) == [8, 9]
    # shuffled, differently each time a chunk is read
    assert list(first[:4]) != [0, 1, 2, 3] or list(third[:4]) != [0, 1, 2, 3]
    # an epoch cut short (max_batches) starts the next one at the file's start
    cut = record_epochs(module, n=10, chunk=4, batch=4, epochs=2, limit=2)
    assert [len(cut[e]) for e in (1, 2)] == [2, 2] and sorted(cut[2][0]) == [0, 1, 2, 3]
    # chunk 0: the whole set is one chunk, shuffled as a whole
    whole = np.concatenate(record_epochs(module, n=10, chunk=0, batch=5, epochs=1)[1])
    assert sorted(whole) == list(range(10)) and list(whole) != list(range(10))


def test_cifar10_epochs_have_390_or_391_batches():
    module = mxnet_adapter_module()
    epochs = record_epochs(module, n=50000, chunk=5405, batch=128, epochs=4)
    counts = [len(epochs[e]) for e in (1, 2, 3, 4)]
    assert counts == [391, 391, 390, 391]
    images = np.concatenate([np.concatenate(epochs[e]) for e in (1, 2, 3, 4)])
    assert len(images) == 128 * sum(counts)
    # the stream never skips or repeats an image within a pass over the file
    assert sorted(images[:50000]) == list(range(50000))


def test_the_mnist_iterator_is_permuted_once():
    """NDArrayIter(shuffle=True) in MXNet 1.0: one permutation, made with the iterator, the
    same every epoch; the last batch padded from the order's start."""
    module = mxnet_adapter_module()
    images = np.arange(10, dtype=np.float32)[:, None]
    stream = list(module.ndarray_iter(np, np.random.RandomState(5), images, images[:, 0], 4, 3))
    assert [(e, i, c) for e, i, c, _, _ in stream] == [(e, i, 3) for e in (1, 2, 3)
                                                      for i in range(3)]
    orders = [np.concatenate([y for e, _, _, _, y in stream if e == epoch]) for epoch in (1, 2, 3)]
    assert (orders[0] == orders[1]).all() and (orders[1] == orders[2]).all()
    assert sorted(orders[0][:10]) == list(range(10)) and list(orders[0][:10]) != list(range(10))
    assert list(orders[0][10:]) == list(orders[0][:2])


def test_prefetching_gives_the_batches_of_the_synchronous_path():
    """The same seed, the same batches in the same order, with or without the prefetch thread
    (full augmentation, several chunks and epochs, one cut short)."""
    module = mxnet_adapter_module()
    hp = {"image_shape": "3,28,28", "pad_size": 4, "fill_value": 127, "random_crop": 1,
          "random_mirror": 1, "max_random_h": 36, "max_random_s": 50, "max_random_l": 50,
          "rgb_mean": "123.68,116.779,103.939", "batch_size": 32}
    images = np.random.RandomState(1).randint(0, 256, (300, 3, 32, 32)).astype(np.uint8)
    labels = np.random.RandomState(2).randint(0, 10, 300).astype(np.float32)

    def stream(limit):
        records = module.RecordIter(np, np.random.RandomState(7), images, labels, hp, 70)
        return records.stream(3, limit)

    for limit in (0, 5):
        synchronous = list(stream(limit))
        prefetcher = module.Prefetcher(stream(limit), 3)
        prefetched = list(prefetcher)
        prefetcher.close()
        # 300 images in batches of 32: 10, 9 (the first chunk's rest opens it) and 10 batches
        assert len(prefetched) == len(synchronous) == (3 * 5 if limit else 10 + 9 + 10)
        for (e1, i1, c1, x1, y1), (e2, i2, c2, x2, y2) in zip(synchronous, prefetched):
            assert (e1, i1, c1) == (e2, i2, c2)
            assert x1.tobytes() == x2.tobytes() and (y1 == y2).all()


def test_the_prefetch_thread_hands_on_errors_and_stops_when_closed():
    module = mxnet_adapter_module()

    def failing():
        yield 1
        raise ValueError("bad record")
    prefetcher = module.Prefetcher(failing(), 2)
    assert next(prefetcher) == 1
    with pytest.raises(ValueError, match="bad record"):
        next(prefetcher)

    def endless():
        while True:
            yield 0
    prefetcher = module.Prefetcher(endless(), 2)
    assert next(prefetcher) == 0
    prefetcher.close()
    assert not prefetcher._thread.is_alive()


# -- the image ---------------------------------------------------------------------------
@pytest.mark.docker
def test_both_quick_runs_are_stored_as_ok(quick_results):
    assert set(quick_results) == {"mnist", "cifar10"}
    for row in quick_results.values():
        assert (row.framework, row.profile, row.status) == ("mxnet", "quick", "ok"), row.error
        assert row.image == "dlbench/mxnet:cpu"
        assert row.framework_version == "1.9.1"
        assert row.train_time_s > 0 and row.test_time_s > 0
        assert row.test_samples == quick_profiles()[row.dataset].get("test_subset", 10000)
        assert "openblas" in row.blas_loaded
        libraries = json.loads(row.libraries)
        assert libraries["numpy"].startswith("1.19")
        assert "MKLDNN" in libraries["mxnet_features"].split(",")
        framework_threads = json.loads(row.threads_framework)
        assert framework_threads["MXNET_CPU_WORKER_NTHREADS"] == "1"
        assert framework_threads["omp_get_max_threads"] == row.threads


@pytest.mark.docker
def test_lenet_on_mnist(quick_results, quick_run):
    row = quick_results["mnist"]
    assert_robustness(quick_run("mxnet"), row)     # by autograd
    assert row.model == "mxnet-lenet"
    assert row.param_count == LENET_PARAMS == 431080
    assert_model_size(row, at_most=1.01)
    assert row.accuracy >= 0.90
    hp = json.loads(row.hyperparameters)
    assert (hp["batch_size"], hp["learning_rate"], hp["lr_step_epochs"]) == (64, 0.05, "10")
    batches = quick_profiles()["mnist"]["max_batches"]
    assert hp["max_batches"] == batches > 0
    # one epoch of max_batches whole batches of 64
    assert len(row.epoch_loss) == 1 and row.train_samples == 60000
    assert row.train_images_per_s * row.train_time_s == pytest.approx(64 * batches)


@pytest.mark.docker
def test_resnet110_on_cifar10(quick_results, quick_run):
    row = quick_results["cifar10"]
    assert_robustness(quick_run("mxnet"), row)     # BatchNorm in inference
    assert row.model == "mxnet-resnet110"
    assert row.param_count == RESNET110_PARAMS == 1730784
    assert_model_size(row, at_most=1.1)     # and BatchNorm's moving statistics
    # above chance (10%) by over 3 standard errors of 1,000 test images, after 60 batches
    # of 32 (the quick profile's smaller batch: 128 x 20 gave 8%, 32 x 60 20%, at a like cost)
    assert row.accuracy > 0.13
    hp = json.loads(row.hyperparameters)
    assert (hp["num_layers"], hp["image_shape"], hp["batch_size"]) == (110, "3,28,28", 32)
    assert row.train_samples == 50000 and len(row.epoch_loss) == 1
    batches = quick_profiles()["cifar10"]["max_batches"]
    assert row.train_images_per_s * row.train_time_s == pytest.approx(32 * batches)


@pytest.mark.docker
@pytest.mark.parametrize("dataset, batch_norms", [("mnist", 0), ("cifar10", 110)])
def test_the_quick_models_export_with_mxnets_onnx_exporter(quick_results, quick_run, dataset,
                                                           batch_norms):
    """mx.onnx.export_model's graph from pixels to logits agrees with MXNet: the logits within
    1e-4 relative, no image classified otherwise, the accuracy within 0.1 points; the pixels
    its one input, any number of them; ResNet-110's BatchNorm layers in it (bn_data's gamma
    the 1 MXNet computes with, which the exporter would lose)."""
    import onnx
    import onnx.numpy_helper

    from orchestrator import store

    results, row = quick_run(FRAMEWORK), quick_results[dataset]
    assert_migration(results, row)
    model = onnx.load(str(store.model_path(results, row.run_id)))
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 14)]
    [pixels] = model.graph.input
    dims = [d.dim_param or d.dim_value for d in pixels.type.tensor_type.shape.dim]
    assert dims == ["images"] + ([28, 28] if dataset == "mnist" else [3, 32, 32])
    assert sum(node.op_type == "BatchNormalization" for node in model.graph.node) == batch_norms
    if batch_norms:
        weights = {tensor.name: onnx.numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
        assert (weights["bn_data_gamma"] == 1).all()


def result_of(results, row) -> dict:
    return json.loads((results / "_jobs" / row.run_id / "result.json").read_text())


@pytest.mark.docker
def test_the_data_pipelines_are_the_examples_iterators(quick_run, quick_results):
    results = quick_run(FRAMEWORK)
    mnist = result_of(results, quick_results["mnist"])["data"]
    assert (mnist["iterator"], mnist["prefetch"], mnist["worker"]) == ("NDArrayIter", 0,
                                                                     "training thread")
    cifar = result_of(results, quick_results["cifar10"])
    hp = cifar["hyperparameters"]
    assert (hp["prefetch"], hp["shuffle_chunk_images"]) == (16, 5405)
    data = cifar["data"]
    assert (data["iterator"], data["prefetch"], data["worker"]) == ("ImageRecordIter", 16, "thread")
    assert data["first_batches"]["batches"] == 20 and len(data["first_batches"]["sha256"]) == 64
    assert 0 <= data["wait_s"] < cifar["train_time_s"]


@pytest.mark.docker
def test_prefetching_trains_on_the_batches_of_the_synchronous_path(quick_run, quick_results,
                                                                   data_root, tmp_path):
    """The quick CIFAR-10 job prefetches (16 batches ahead); the same job with ``--set
    prefetch=0`` makes its batches on the training thread: the same seed gives the same first
    20 batches, bit for bit, and the setting is stored as a change."""
    prefetched = result_of(quick_run(FRAMEWORK), quick_results["cifar10"])["data"]
    results = tmp_path / "results"
    dlbench("run", "--frameworks", FRAMEWORK, "--datasets", "cifar10", "--profile", "quick",
            "--set", "prefetch=0", "--set", "max_batches=20", "--results", results,
            "--data-dir", data_root, check=True)
    row = pd.read_parquet(results / "runs").iloc[0]
    assert row.status == "ok", row.error
    assert json.loads(row.hyperparameters)["prefetch"] == 0
    from orchestrator.report.paper import _settings
    assert _settings(row) == ("changed: max_batches=20, prefetch=0", "changed")
    assert _settings(quick_results["cifar10"]) == ("own defaults", "own")
    assert row.paper_train_time_s is None or pd.isna(row.paper_train_time_s)
    synchronous = result_of(results, row)["data"]
    assert (synchronous["prefetch"], synchronous["worker"]) == (0, "training thread")
    assert synchronous["first_batches"] == prefetched["first_batches"]


@pytest.mark.docker
def test_the_image_carries_its_labels(built):
    import docker
    labels = docker.from_env().images.get("dlbench/mxnet:cpu").labels
    assert labels["org.dlbench.framework"] == "mxnet"
    assert labels["org.dlbench.framework-version"] == "1.9.1"


CHECK_IN_IMAGE = r"""
import contextlib, io, json, re, sys
sys.path.insert(0, "/opt/dlbench/framework")
import mxnet as mx
import adapter
out = {}
for name, sym, shape in (("lenet", adapter.lenet_symbol(mx), (64, 1, 28, 28)),
                         ("resnet110", adapter.resnet_symbol(mx, 110, (3, 28, 28)), (128, 3, 28, 28))):
    arg_shapes, _, aux_shapes = sym.infer_shape(data=shape)
    names = sym.list_arguments()
    params = sum(int(__import__("numpy").prod(s)) for n, s in zip(names, arg_shapes)
                 if n not in ("data", "softmax_label"))
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        mx.viz.print_summary(sym, shape={"data": shape})
    summary = int(re.search(r"Total params: ([0-9]+)", text.getvalue()).group(1))
    ops = [n["op"] for n in json.loads(sym.tojson())["nodes"]]
    out[name] = {"params": params, "summary": summary, "aux": len(aux_shapes),
                 "convolutions": ops.count("Convolution"), "batchnorms": ops.count("BatchNorm"),
                 "fc": ops.count("FullyConnected"),
                 "shortcuts": sorted(n[:-10] for n in names if n.endswith("_sc_weight"))}
print(json.dumps(out))
"""


@pytest.mark.docker
def test_the_networks_follow_the_mxnet_example_symbols(built):
    """MXNet itself counts the parameters (print_summary) and the symbols have
    resnet.py's and lenet.py's operators."""
    import docker
    raw = docker.from_env().containers.run(
        "dlbench/mxnet:cpu", entrypoint=["python3", "-c", CHECK_IN_IMAGE], remove=True,
        network_mode="none", read_only=True, tmpfs={"/tmp": ""}, environment={"HOME": "/tmp"},
        user="nobody").decode()
    found = json.loads(raw.strip().splitlines()[-1])
    lenet, resnet = found["lenet"], found["resnet110"]
    assert lenet["params"] == lenet["summary"] == LENET_PARAMS
    assert (lenet["convolutions"], lenet["fc"], lenet["batchnorms"]) == (2, 2, 0)
    assert resnet["params"] == resnet["summary"] == RESNET110_PARAMS
    # conv0 + 2 per unit in 54 units + 3 shortcuts; bn_data + 2 per unit + bn1
    assert (resnet["convolutions"], resnet["batchnorms"], resnet["fc"]) == (1 + 108 + 3, 110, 1)
    assert resnet["aux"] == 2 * 110          # moving mean and variance, not counted
    assert resnet["shortcuts"] == ["stage1_unit1", "stage2_unit1", "stage3_unit1"]


@pytest.mark.docker
def test_a_cuda_device_is_refused_clearly(built, data_root, tmp_path):
    """The PyPI wheel is a CPU build: asking for CUDA fails the job with a clear reason."""
    import docker
    import docker.errors
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    with pytest.raises(docker.errors.ContainerError):       # the runner exits 1
        docker.from_env().containers.run(
            "dlbench/mxnet:cpu", ["--dataset", "mnist", "--profile", "quick", "--device", "cuda"],
            remove=True, network_mode="none", read_only=True, tmpfs={"/tmp": ""},
            environment={"HOME": "/tmp"}, user="nobody",
            volumes={str(data_root): {"bind": "/data", "mode": "ro"},
                     str(out): {"bind": "/out", "mode": "rw"}})
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "failed"
    assert "ValueError during setup" in result["error"] and "no CUDA" in result["error"]
