"""The caffe image end to end: built (or found up to date), then the quick
profile of both BVLC example models (LeNet on MNIST, cifar10_quick on
CIFAR-10) run through the CLI on the real data sets."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.docker

FRAMEWORK = "caffe"


def test_both_quick_runs_are_stored_as_ok(quick_results):
    assert set(quick_results) == {"mnist", "cifar10"}
    for row in quick_results.values():
        assert (row.framework, row.profile, row.status) == ("caffe", "quick", "ok"), row.error
        assert row.image == "dlbench/caffe:cpu"
        assert row.train_time_s > 0 and row.test_time_s > 0 and row.test_samples == 10000
        assert row.framework_version == "1.0.0"
        assert "openblas" in row.blas
        libraries = json.loads(row.libraries)
        assert libraries["numpy"].startswith("1.19") and libraries["protobuf"].startswith("3.12")
        assert json.loads(row.threads_framework)["openblas_get_num_threads"] == row.threads


def test_lenet_on_mnist(quick_results):
    row = quick_results["mnist"]
    assert row.model == "caffe-lenet"
    assert row.param_count == 431080     # 520 + 25050 + 400500 + 5010
    assert row.accuracy >= 0.90
    hp = json.loads(row.hyperparameters)
    assert (hp["batch_size"], hp["lr_policy"], hp["max_iter"]) == (64, "inv", 500)
    # 500 iterations of 64 = 32000 images: one partial epoch, reported as such
    assert len(row.epoch_loss) == 1 and row.train_samples == 60000
    assert 0.0 < row.epoch_accuracy[0] <= 1.0


def test_cifar10_quick_on_cifar10(quick_results):
    row = quick_results["cifar10"]
    assert row.model == "caffe-cifar10-quick"
    assert row.param_count == 145578     # 2432 + 25632 + 51264 + 65600 + 650
    assert row.accuracy >= 0.20          # twice chance
    assert row.train_samples == 50000 and len(row.epoch_loss) == 1


def test_the_image_carries_its_labels(built):
    import docker
    labels = docker.from_env().images.get("dlbench/caffe:cpu").labels
    assert labels["org.dlbench.framework"] == "caffe"
    assert labels["org.dlbench.framework-version"] == "1.0.0+git20180821.99bd997-8+b2"


def test_prototxt_follows_the_bvlc_examples(built):
    """The generated nets parse with caffe's own protobuf and hold the example's layers."""
    import docker
    script = (
        "import sys; sys.path.insert(0, '/opt/dlbench/framework'); import adapter\n"
        "from caffe.proto import caffe_pb2; from google.protobuf import text_format\n"
        "for build in (adapter.lenet, adapter.cifar10_quick):\n"
        "    net = text_format.Parse(build(100, 'TRAIN'), caffe_pb2.NetParameter())\n"
        "    print(net.name, ' '.join(l.type for l in net.layer))\n")
    out = docker.from_env().containers.run(
        "dlbench/caffe:cpu", entrypoint=["python3", "-c", script], remove=True,
        network_mode="none").decode().split("\n")
    assert out[0] == ("LeNet Input Convolution Pooling Convolution Pooling InnerProduct ReLU "
                      "InnerProduct SoftmaxWithLoss")
    assert out[1] == ("CIFAR10_quick Input Convolution Pooling ReLU Convolution ReLU Pooling "
                      "Convolution ReLU Pooling InnerProduct InnerProduct SoftmaxWithLoss")
