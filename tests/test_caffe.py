"""The caffe image end to end: built (or found up to date), then the quick
profile of both BVLC example models (LeNet on MNIST, cifar10_quick on
CIFAR-10) run through the CLI on the real data sets."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import NO_CHECKS, assert_migration, assert_model_size, assert_robustness, dlbench, quick_profile

pytestmark = pytest.mark.docker

FRAMEWORK = "caffe"


def test_both_quick_runs_are_stored_as_ok(quick_results):
    assert set(quick_results) == {"mnist", "cifar10"}
    for row in quick_results.values():
        assert (row.framework, row.profile, row.status) == ("caffe", "quick", "ok"), row.error
        assert row.image == "dlbench/caffe:cpu"
        assert row.train_time_s > 0 and row.test_time_s > 0
        # the quick profile's test subset where it has one (the first N test images)
        assert row.test_samples == quick_profile("caffe", row.dataset).get("test_subset", 10000)
        assert row.framework_version == "1.0.0"
        assert row.blas_loaded == "openblas-pthread" and pd.isna(row.blas)
        libraries = json.loads(row.libraries)
        assert libraries["numpy"].startswith("1.19") and libraries["protobuf"].startswith("3.12")
        assert json.loads(row.threads_framework)["openblas_get_num_threads"] == row.threads


def test_lenet_on_mnist(quick_results, quick_run):
    row = quick_results["mnist"]
    assert_robustness(quick_run("caffe"), row)     # by Caffe's backward to the pixels
    assert_migration(quick_run("caffe"), row)      # the host's graph of its layer list (float32)
    assert row.model == "caffe-lenet"
    assert row.param_count == 431080     # 520 + 25050 + 400500 + 5010
    assert_model_size(row, at_most=1.01)    # the .caffemodel: float32 weights and the net's names
    assert row.accuracy >= 0.90
    hp = json.loads(row.hyperparameters)
    assert (hp["batch_size"], hp["lr_policy"], hp["max_iter"]) == (64, "inv", 500)
    # 500 iterations of 64 = 32000 images: one partial epoch, reported as such
    assert len(row.epoch_loss) == 1 and row.train_samples == 60000
    assert 0.0 < row.epoch_accuracy[0] <= 1.0


def test_cifar10_quick_on_cifar10(quick_results, quick_run):
    row = quick_results["cifar10"]
    assert_robustness(quick_run("caffe"), row)     # through the mean image's Bias layer
    assert_migration(quick_run("caffe"), row)      # the mean image and ceil-mode pooling in the graph
    assert row.model == "caffe-cifar10-quick"
    assert row.param_count == 145578     # 2432 + 25632 + 51264 + 65600 + 650
    assert_model_size(row, at_most=1.01)
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


# -- the solvers' periodic work (paper profile) ------------------------------------------------
def test_the_paper_schedule_is_the_original_solvers(built):
    """lenet_solver: 21 test passes (0, every 500, after 10,000) and snapshots at 5,000 and
    10,000; train_quick.sh: 9 passes in its first run and 3 in the resumed one (4,000 twice),
    snapshots at 4,000 and 5,000.  quick: none."""
    import docker
    script = (
        "import json, sys; sys.path.insert(0, '/opt/dlbench/framework'); import adapter\n"
        "from dlbench_runner.contract import load_catalog, resolve_hyperparameters\n"
        "catalog = load_catalog('/opt/dlbench/framework')\n"
        "out = {}\n"
        "for dataset in ('mnist', 'cifar10'):\n"
        "    for profile in ('paper', 'quick'):\n"
        "        before, after = adapter.schedule(resolve_hyperparameters(catalog, dataset, profile))\n"
        "        work = sorted((i, w) for side in (before, after) for i, ws in side.items() for w in ws)\n"
        "        out[dataset + '/' + profile] = work\n"
        "print(json.dumps(out))\n")
    out = json.loads(docker.from_env().containers.run(
        "dlbench/caffe:cpu", entrypoint=["python3", "-c", script], remove=True,
        network_mode="none"))

    def of(key, kind):
        return [i for i, w in out[key] if w == kind]
    assert of("mnist/paper", "test") == list(range(0, 10001, 500))
    assert of("mnist/paper", "snapshot") == [5000, 10000]
    assert of("cifar10/paper", "test") == [0, 500, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4000,
                                           4500, 5000]
    assert of("cifar10/paper", "snapshot") == [4000, 5000]
    assert out["mnist/quick"] == out["cifar10/quick"] == []


def run_short_paper_job(data_root, results, dataset, *settings):
    dlbench("run", "--frameworks", "caffe", "--datasets", dataset, "--profile", "paper",
            *[arg for s in settings + NO_CHECKS for arg in ("--set", s)],
            "--results", results, "--data-dir", data_root, check=True)
    row = pd.read_parquet(results / "runs").iloc[0]
    assert (row.profile, row.status) == ("paper", "ok"), row.error
    return row, json.loads((results / "_jobs" / row.run_id / "result.json").read_text())


@pytest.fixture(scope="module")
def short_paper_mnist(built, data_root, tmp_path_factory):
    """LeNet cut to 300 iterations, testing every 100, a snapshot every 200."""
    return run_short_paper_job(data_root, tmp_path_factory.mktemp("caffe-paper"), "mnist",
                               "max_iter=300", "test_interval=100", "snapshot=200")


def test_a_short_paper_run_makes_the_solvers_test_passes_and_snapshots(short_paper_mnist):
    row, result = short_paper_mnist
    passes, snapshots = result["periodic"]["test_passes"], result["periodic"]["snapshots"]
    # before iterations 0, 100, 200, and after the last; every 200 and after training
    assert [p["iteration"] for p in passes] == [0, 100, 200, 300]
    assert {p["first_record"] for p in passes} == {0}      # 100 batches of 100: the whole set
    assert [s["iteration"] for s in snapshots] == [200, 300]
    for s in snapshots:    # Caffe's own files: 431,080 float weights (and as much history)
        files = s["files"]
        assert sorted(files) == [f"mnist_lenet_iter_{s['iteration']}.{ext}"
                                 for ext in ("caffemodel", "solverstate")]
        assert all(size > 431080 * 4 for size in files.values())
    # the passes score the real test set: chance before training, then the final model,
    # which the runner's own pass over the same 10,000 images scores alike
    assert passes[0]["accuracy"] < 0.2 and passes[-1]["accuracy"] > 0.9
    assert passes[-1]["accuracy"] == pytest.approx(row.accuracy, abs=1e-6)
    assert passes[-1]["loss"] == pytest.approx(row.test_loss, rel=1e-4)


def test_paper_times_hold_the_periodic_work_and_train_time_does_not(short_paper_mnist):
    row, result = short_paper_mnist
    periodic = result["periodic"]["test_passes"] + result["periodic"]["snapshots"]
    excluded = sum(p["time_s"] for p in periodic)
    assert result["train_excluded_s"] == pytest.approx(excluded)
    assert row.paper_train_time_s > row.train_time_s + excluded * 0.99
    assert row.paper_train_time_s == pytest.approx(row.train_time_s + excluded, abs=0.25)
    assert row.paper_test_time_s == result["periodic"]["test_passes"][-1]["time_s"] > 0
    assert sum(row.epoch_time_s) == pytest.approx(row.train_time_s, abs=0.25)


def test_cifar10_two_runs_test_the_resume_point_twice(built, data_root, tmp_path):
    """train_quick.sh's schedule cut short: run 1 to 20 (snapshot every 20), run 2 to 30."""
    row, result = run_short_paper_job(
        data_root, tmp_path / "results", "cifar10", "max_iter=20", "max_iter_lr1=30",
        "test_interval=10", "test_iter=5", "snapshot=20", "snapshot_lr1=30")
    passes = result["periodic"]["test_passes"]
    assert [p["iteration"] for p in passes] == [0, 10, 20, 20, 30]
    # 5 batches of 100 a pass, read on from where the last stopped; the second run's Data
    # layer opens the test set at its first record again
    assert [p["first_record"] for p in passes] == [0, 500, 1000, 0, 500]
    assert [s["iteration"] for s in result["periodic"]["snapshots"]] == [20, 30]
    assert row.paper_train_time_s > row.train_time_s


def test_quick_runs_do_no_periodic_work_and_have_no_paper_times(quick_results, quick_run):
    for row in quick_results.values():
        assert pd.isna(row.paper_train_time_s) and pd.isna(row.paper_test_time_s)
        result = json.loads((quick_run("caffe") / "_jobs" / row.run_id / "result.json").read_text())
        assert result["periodic"] == {"test_passes": [], "snapshots": []}
        assert "train_excluded_s" not in result
