"""The tensorflow image end to end: built (or found up to date), then the quick
profile of both TF tutorial models (Deep MNIST, the CIFAR-10 tutorial) and the
paper profile cut short (a few steps, small intervals) run through the CLI on
the real data sets, and the adapter's own machinery (the warm-up that must
leave the initial state, the CIFAR input pipeline, the refusal of CUDA, the
files GTDLBench's scripts wrote) checked inside the real image."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from conftest import NO_CHECKS, assert_migration, assert_model_size, assert_robustness, dlbench

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
    "def make(dataset, profile='quick', **overrides):\n"
    "    job = spec.complete({'framework': 'tensorflow', 'dataset': dataset, 'profile': profile,\n"
    "                         'threads': 2, 'seed': 7, 'overrides': overrides}, catalog)\n"
    "    return adapter.Adapter(runner.Context(job, '/data'))\n"
)


NN_INSTRUCTIONS = {"avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


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
        # TF's own answer, which depends on the CPU (DefaultOneDnnPolicy in TF's
        # core/util/port.cc): on by default in Linux where it has neural-network
        # instructions, off on an AVX2-only EPYC
        assert framework_threads["TF_ENABLE_ONEDNN_OPTS"] is None
        assert framework_threads["onednn_enabled"] is bool(NN_INSTRUCTIONS & cpu_flags())


def test_deep_mnist(quick_results, quick_run):
    row = quick_results["mnist"]
    assert_robustness(quick_run("tensorflow"), row)    # by GradientTape
    assert_migration(quick_run("tensorflow"), row)     # its layer list: NHWC weights as NCHW
    assert row.model == "tf-mnist-deep"
    # conv1 5*5*1*32 + 32 = 832; conv2 5*5*32*64 + 64 = 51264;
    # fc1 3136*1024 + 1024 = 3212288; fc2 1024*10 + 10 = 10250
    assert row.param_count == 3274634
    assert_model_size(row, at_most=1.01)    # the weights and the step
    assert row.accuracy >= 0.90
    hp = json.loads(row.hyperparameters)
    assert (hp["batch_size"], hp["learning_rate"], hp["max_steps"]) == (50, 1e-4, 300)
    assert (hp["epsilon"], hp["keep_prob"], hp["test_batch_size"]) == (1e-8, 0.5, 10000)
    # read_data_sets keeps the first 5,000 images for validation: 55,000 trained on;
    # 300 steps of 50 = 15,000 images, one partial epoch
    assert row.train_samples == 55000 and len(row.epoch_loss) == 1
    assert row.train_images_per_s * row.train_time_s == pytest.approx(300 * 50)
    assert 0.0 < row.epoch_accuracy[0] <= 1.0


def test_cifar10_tutorial(quick_results, quick_run):
    row = quick_results["cifar10"]
    assert_robustness(quick_run("tensorflow"), row)    # through the crop and standardisation
    assert_migration(quick_run("tensorflow"), row)     # the moving averages; crop, standardize, lrn
    assert row.model == "tf-cifar10-tutorial"
    # conv1 5*5*3*64 + 64 = 4864; conv2 5*5*64*64 + 64 = 102464;
    # local3 (6*6*64)*384 + 384 = 885120; local4 384*192 + 192 = 73920;
    # softmax_linear 192*10 + 10 = 1930
    assert row.param_count == 1068298
    assert_model_size(row, at_most=2.01)    # the weights and their moving averages
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


# The paper profile cut short: few steps, the periodic work at small intervals.
PAPER_CUTS = {
    "mnist": ("max_steps=30", "accuracy_every=10"),
    "cifar10": ("max_steps=20", "summary_every=5", "log_every=5", "checkpoint_every=10"),
}


@pytest.fixture(scope="module")
def paper_results(built, data_root, tmp_path_factory):
    """Each data set's paper-profile row, its result.json and its log."""
    found = {}
    for dataset, cuts in PAPER_CUTS.items():
        results = tmp_path_factory.mktemp(f"tensorflow-paper-{dataset}")
        sets = [arg for cut in cuts + NO_CHECKS for arg in ("--set", cut)]
        dlbench("run", "--frameworks", FRAMEWORK, "--datasets", dataset, "--profile", "paper", *sets,
                "--results", results, "--data-dir", data_root, check=True)
        row = pd.read_parquet(results / "runs").iloc[0]
        job = results / "_jobs" / row.run_id
        found[dataset] = (row, json.loads((job / "result.json").read_text()),
                          (job / "log.txt").read_text())
    return found


def test_quick_runs_do_no_periodic_work_and_leave_the_paper_spans_empty(quick_results):
    for row in quick_results.values():
        assert pd.isna(row.paper_train_time_s) and pd.isna(row.paper_test_time_s)
    hp = json.loads(quick_results["mnist"].hyperparameters)
    assert hp["accuracy_every"] == 0
    hp = json.loads(quick_results["cifar10"].hyperparameters)
    assert [hp[k] for k in ("summary_every", "log_every", "checkpoint_secs", "checkpoint_every",
                            "evaluations")] == [0, 0, 0.0, 0, 0]


def test_paper_mnist_times_the_scripts_spans(paper_results):
    row, result, log = paper_results["mnist"]
    assert (row.profile, row.status) == ("paper", "ok"), row.error
    assert json.loads(row.hyperparameters)["accuracy_every"] == 10
    # the batch's accuracy before steps 0, 10 and 20, printed as mnist_deep.py prints it
    assert result["paper_work"] == {"batch_accuracy_evaluations": 3}
    printed = [line.split(",")[0] for line in log.splitlines() if line.startswith("step ")]
    assert printed == ["step 0", "step 10", "step 20"]
    assert "Training time: " in log and "test accuracy " in log and "Testing time: " in log
    # the train timer holds the steps, the initialisation and the evaluations;
    # train_time_s the steps alone; the span lies inside the runner's train()
    assert result["train_excluded_s"] > 0
    assert row.train_time_s < row.paper_train_time_s <= row.train_time_s + result["train_excluded_s"]
    # the test timer: the pass over 10,000 images in one batch and its print, in test()
    assert 0 < row.paper_test_time_s <= row.test_time_s
    assert row.test_samples == 10000


def test_paper_cifar10_does_the_sessions_and_hooks_work(paper_results):
    row, result, log = paper_results["cifar10"]
    assert (row.profile, row.status) == ("paper", "ok"), row.error
    work = result["paper_work"]
    # 20 steps: summaries at steps 0, 5, 10, 15; the loss printed at 0, 5, 10, 15 and
    # the last; the hook's checkpoint and Epoch Duration after steps 9 and 19; the
    # session's checkpoints after the first step and at the end (600 s never pass)
    assert (work["summaries"], work["loss_prints"], work["hook_checkpoints"],
            work["epoch_durations"], work["timed_checkpoints"]) == (4, 5, 2, 2, 2)
    assert len([line for line in log.splitlines() if ": step " in line and "loss = " in line]) == 5
    durations = [float(line.split("Epoch Duration: ")[1].split()[0])
                 for line in log.splitlines() if line.startswith("Step: ")]
    assert len(durations) == 2
    # paper_train_time_s: the printed durations, summed; they hold the steps and the
    # summaries, checkpoints and prints between the hook's saves
    assert row.paper_train_time_s == pytest.approx(sum(durations), abs=1e-3)
    assert row.paper_train_time_s > row.train_time_s
    assert work["train_log_span_s"] > row.paper_train_time_s
    assert row.paper_train_time_s <= row.train_time_s + result["train_excluded_s"]


def test_paper_cifar10_evaluates_three_times_as_cifar10_eval_did(paper_results):
    row, result, log = paper_results["cifar10"]
    work = result["paper_work"]
    # three evaluations of 79 batches of 128, each restoring the last checkpoint's averages
    assert (work["evaluations"], work["eval_batches"]) == (3, 3 * 79)
    assert log.count("precision @ 1 = ") == 3
    first = work["eval_precisions"][0]
    assert work["eval_precisions"] == [first] * 3
    # the same weights as dlbench's test, on 10,112 images (112 twice) against 10,000
    assert abs(first - row.accuracy) <= 112 / 10112
    assert row.test_samples == 10000
    assert row.paper_test_time_s == pytest.approx(work["eval_times_s"][0])
    assert all(0 < span < cycle for span, cycle in zip(work["eval_times_s"], work["eval_cycles_s"]))


def test_paper_work_writes_the_tutorials_files(built, data_root):
    """The event files hold cifar10.py's summaries at the summary steps, the
    checkpoint folders the saves (the hook's thinned to checkpoint_keep), the
    eval event file the evaluation's summary with its precision."""
    script = PRELUDE + (
        "import os, glob, collections, tensorflow as tf\n"
        "os.environ['DLBENCH_TF_SCRATCH'] = '/tmp'\n"
        "a = make('cifar10', 'paper', max_steps=6, summary_every=3, log_every=3, checkpoint_every=2,\n"
        "         checkpoint_keep=2, evaluations=1, eval_examples=256)\n"
        "a.setup(); a.train()\n"
        "root, = glob.glob('/tmp/dlbench-tf-*')\n"
        "for folder in ('cifar10_train', 'cifar10_ckpt', 'cifar10_eval'):\n"
        "    names = os.listdir(os.path.join(root, folder))\n"
        "    print('files', folder, *sorted(n for n in names if not n.startswith('events')))\n"
        "    tags = collections.defaultdict(list)\n"
        "    for path in glob.glob(os.path.join(root, folder, 'events*')):\n"
        "        for event in tf.compat.v1.train.summary_iterator(path):\n"
        "            tags[event.step] += [v.tag for v in event.summary.value]\n"
        "    print('tags', folder, json.dumps({s: sorted(t) for s, t in tags.items() if t}))\n")
    code, logs = in_image(script, data_root)
    assert code == 0, logs
    files, tags = {}, {}
    for line in logs.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "files":
            folder, *names = rest.split()
            files[folder] = names
        elif kind == "tags":
            folder, _, found = rest.partition(" ")
            tags[folder] = json.loads(found)
    assert files["cifar10_eval"] == []              # its event file only

    def checkpoints(*steps):
        return sorted(["checkpoint"] + [f"model.ckpt-{s}.{ext}" for s in steps
                                        for ext in ("data-00000-of-00001", "index")])
    # the session's saves after the first step and at the end, and its graph
    assert files["cifar10_train"] == sorted(checkpoints(1, 6) + ["graph.pbtxt"])
    # the hook's after steps 1, 3 and 5, the newest two kept
    assert files["cifar10_ckpt"] == checkpoints(3, 5)
    assert sorted(tags["cifar10_train"]) == ["0", "3"]
    layers = ("conv1", "conv2", "local3", "local4", "softmax_linear")
    expected = {"images/image/0", "images/image/1", "images/image/2", "learning_rate"}
    for layer in layers:
        expected |= {f"{layer}/activations", f"{layer}/sparsity", f"{layer}/weights",
                     f"{layer}/biases", f"{layer}/weights/gradients", f"{layer}/biases/gradients",
                     f"{layer}/weight_loss", f"{layer}/weight_loss (raw)"}
    expected |= {"cross_entropy", "cross_entropy (raw)", "total_loss", "total_loss (raw)"}
    for step in ("0", "3"):
        assert set(tags["cifar10_train"][step]) == expected
    evaluation = {"Precision @ 1", "images/image/0", "images/image/1", "images/image/2"}
    evaluation |= {f"{layer}/{kind}" for layer in layers for kind in ("activations", "sparsity")}
    assert tags["cifar10_eval"] == {"6": sorted(evaluation)}
