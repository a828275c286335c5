"""The tensorflow image end to end: built (or found up to date), then the quick
profile of both TF tutorial models (Deep MNIST, the CIFAR-10 tutorial) run
through the CLI on the real data sets, and the adapter's own machinery (the
warm-up that must leave the initial state, the CIFAR input pipeline, the
refusal of CUDA) checked inside the real image."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.docker

FRAMEWORK = "tensorflow"

IMAGE = "dlbench/tensorflow:cpu"


def in_image(script, data_root, out=None, args=None):
    """Run python3 (a script, or the runner with ``args``) in the image as a job
    runs: no network, read-only root, a tmpfs /tmp, the data read-only."""
    import docker
    volumes = {str(data_root): {"bind": "/data", "mode": "ro"}}
    if out is not None:
        volumes[str(out)] = {"bind": "/out", "mode": "rw"}
    kwargs = dict(volumes=volumes, network_mode="none", read_only=True, tmpfs={"/tmp": ""},
                  environment={"HOME": "/tmp"}, user="%d:%d" % (os.getuid(), os.getgid()))
    client = docker.from_env()
    if args is not None:
        container = client.containers.run(IMAGE, command=args, detach=True, **kwargs)
    else:
        container = client.containers.run(IMAGE, entrypoint=["python3", "-c", script],
                                          detach=True, **kwargs)
    try:
        code = container.wait()["StatusCode"]
        logs = container.logs().decode()
    finally:
        container.remove(force=True)
    return code, logs


PRELUDE = (
    "import sys, json\n"
    "sys.path[:0] = ['/opt/dlbench', '/opt/dlbench/framework']\n"
    "import numpy as np, adapter\n"
    "from dlbench_runner import spec, runner\n"
    "catalog = spec.load_catalog('/opt/dlbench/framework')\n"
    "def make(dataset, **overrides):\n"
    "    job = spec.complete({'framework': 'tensorflow', 'dataset': dataset, 'profile': 'quick',\n"
    "                         'threads': 2, 'seed': 7, 'overrides': overrides}, catalog)\n"
    "    return adapter.Adapter(runner.Context(job, '/data'))\n"
)


def test_both_quick_runs_are_stored_as_ok(quick_results):
    assert set(quick_results) == {"mnist", "cifar10"}
    for row in quick_results.values():
        assert (row.framework, row.profile, row.status) == ("tensorflow", "quick", "ok"), row.error
        assert row.image == IMAGE
        assert row.train_time_s > 0 and row.test_time_s > 0 and row.test_samples == 10000
        assert row.framework_version == "2.20.0"
        libraries = json.loads(row.libraries)
        assert (libraries["numpy"], libraries["keras"]) == ("2.0.2", "3.10.0")
        assert libraries["tensorflow_build"] == "cpu" and libraries["cuda"] is None
        framework_threads = json.loads(row.threads_framework)
        assert framework_threads["intra_op_parallelism_threads"] == row.threads
        assert framework_threads["inter_op_parallelism_threads"] == row.threads
        assert framework_threads["onednn_enabled"] is True


def test_deep_mnist(quick_results):
    row = quick_results["mnist"]
    assert row.model == "tf-mnist-deep"
    # conv1 5*5*1*32 + 32 = 832; conv2 5*5*32*64 + 64 = 51264;
    # fc1 3136*1024 + 1024 = 3212288; fc2 1024*10 + 10 = 10250
    assert row.param_count == 3274634
    assert row.accuracy >= 0.90
    hp = json.loads(row.hyperparameters)
    assert (hp["batch_size"], hp["learning_rate"], hp["max_steps"]) == (50, 1e-4, 300)
    assert (hp["epsilon"], hp["keep_prob"], hp["test_batch_size"]) == (1e-8, 0.5, 10000)
    # read_data_sets keeps the first 5,000 images for validation: 55,000 trained on;
    # 300 steps of 50 = 15,000 images, one partial epoch
    assert row.train_samples == 55000 and len(row.epoch_loss) == 1
    assert row.train_images_per_s * row.train_time_s == pytest.approx(300 * 50)
    assert 0.0 < row.epoch_accuracy[0] <= 1.0


def test_cifar10_tutorial(quick_results):
    row = quick_results["cifar10"]
    assert row.model == "tf-cifar10-tutorial"
    # conv1 5*5*3*64 + 64 = 4864; conv2 5*5*64*64 + 64 = 102464;
    # local3 (6*6*64)*384 + 384 = 885120; local4 384*192 + 192 = 73920;
    # softmax_linear 192*10 + 10 = 1930
    assert row.param_count == 1068298
    assert row.accuracy >= 0.20           # twice chance
    hp = json.loads(row.hyperparameters)
    assert (hp["batch_size"], hp["learning_rate"], hp["max_steps"]) == (128, 0.1, 50)
    assert (hp["moving_average_decay"], hp["weight_decay"]) == (0.9999, 0.004)
    assert row.train_samples == 50000 and len(row.epoch_loss) == 1
    assert row.train_images_per_s * row.train_time_s == pytest.approx(50 * 128)
    # the logged loss includes the weight decay of local3 and local4, about 2.4 at
    # the start (the tutorial's first logged loss is 4.68)
    assert row.epoch_loss[0] > 3.0


def test_the_image_carries_its_labels(built):
    import docker
    labels = docker.from_env().images.get(IMAGE).labels
    assert labels["org.dlbench.framework"] == "tensorflow"
    assert labels["org.dlbench.framework-version"] == "2.20.0"
    assert labels["org.dlbench.cuda"] == "none"


def test_warm_up_leaves_the_initial_state(built, data_root):
    """setup() runs one real step to build the graphs and must then restore every
    variable: an adapter set up with the warm-up equals one set up without it,
    before training and after three steps of it."""
    script = PRELUDE + (
        "def state(a):\n"
        "    return [np.array(v.numpy()) for v in a._state()]\n"
        "for dataset in ('mnist', 'cifar10'):\n"
        "    warm = make(dataset, max_steps=3); warm.setup()\n"
        "    cold = make(dataset, max_steps=3); cold._warm_up = lambda: None; cold.setup()\n"
        "    assert int(warm.global_step.numpy()) == 0\n"
        "    assert int(warm.optimizer.iterations.numpy()) == 0\n"
        "    before = all(np.array_equal(a, b) for a, b in zip(state(warm), state(cold)))\n"
        "    warm.train(); cold.train()\n"
        "    after = all(np.array_equal(a, b) for a, b in zip(state(warm), state(cold)))\n"
        "    print(dataset, before, after, int(warm.global_step.numpy()))\n")
    code, logs = in_image(script, data_root)
    assert code == 0, logs
    lines = [line.split() for line in logs.splitlines() if line.startswith(("mnist", "cifar10"))]
    assert lines == [["mnist", "True", "True", "3"], ["cifar10", "True", "True", "3"]]


def test_cifar_inputs_follow_the_tutorial(built, data_root):
    """Training inputs: 24x24x3, each image standardised; test inputs: exactly
    TF's own resize_with_crop_or_pad + per_image_standardization."""
    script = PRELUDE + (
        "a = make('cifar10'); a.setup(); tf = a.tf\n"
        "x = a._distort(a.train_x[:256]).numpy()\n"
        "print('shape', *x.shape)\n"
        "print('mean', float(np.abs(x.mean(axis=(1, 2, 3))).max()))\n"
        "print('std', float(np.abs(x.std(axis=(1, 2, 3)) - 1).max()))\n"
        "raw = tf.cast(a.test_x[:64], tf.float32)\n"
        "ref = tf.image.per_image_standardization(tf.image.resize_with_crop_or_pad(raw, 24, 24))\n"
        "print('central', float(np.abs(a._central(a.test_x[:64]).numpy() - ref.numpy()).max()))\n"
        "# the crops are windows of the image: a flip or not, brightness and contrast\n"
        "# are affine per channel, so one window is perfectly correlated with it\n"
        "img = a.train_x[:1]\n"
        "y = a._distort(tf.repeat(img, 64, axis=0)).numpy()\n"
        "src = img.numpy()[0].astype(np.float64)\n"
        "def best(out):\n"
        "    scores = []\n"
        "    for flip in (False, True):\n"
        "        s = src[:, ::-1] if flip else src\n"
        "        for r in range(9):\n"
        "            for c in range(9):\n"
        "                w = s[r:r + 24, c:c + 24, 0].ravel()\n"
        "                scores.append(np.corrcoef(w, out[:, :, 0].ravel())[0, 1])\n"
        "    return max(scores)\n"
        "print('window', min(best(out) for out in y))\n")
    code, logs = in_image(script, data_root)
    assert code == 0, logs
    values = dict(line.split(" ", 1) for line in logs.splitlines()
                  if line.split(" ", 1)[0] in ("shape", "mean", "std", "central", "window"))
    assert values["shape"] == "256 24 24 3"
    assert float(values["mean"]) < 1e-4 and float(values["std"]) < 1e-3
    assert float(values["central"]) < 1e-5
    assert float(values["window"]) > 0.9999


def test_cuda_is_refused_by_the_cpu_build(built, data_root, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    code, logs = in_image(None, data_root, out=out,
                          args=["--dataset", "mnist", "--profile", "quick", "--device", "cuda"])
    assert code == 1, logs
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "failed"
    assert result["error"].startswith("ValueError during setup")
    assert "CPU-only build" in result["error"]
