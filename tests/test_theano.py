"""The theano image end to end: built (or found up to date), then the quick
profile of the deeplearning.net LeNet5 tutorial on MNIST and of the Reslab
tutorial's colour convnet on CIFAR-10 run through the CLI on the real data sets,
and the paper profile cut to one epoch (the originals' validation and test
passes inside the loop, and the spans GTDLBench's method timed); the tutorial's
early stopping and the refusal of a Theano that would not compile C code are
checked in the image.  Without Docker: the reconstructed CIFAR-10 model's
shapes, Theano's numeric type as GTDLBench ran it (float64), and the paper's
Theano CIFAR-10 cell held only against that model."""

from __future__ import annotations

import json
import math
import textwrap

import pandas as pd
import pytest

from conftest import (NO_CHECKS, REPO, assert_migration, assert_model_size, assert_robustness, dlbench,
                      make_plan, quick_profile)
from dlbench_runner.runner import adapter_module
from orchestrator import catalog, store
from orchestrator.report import paper
from orchestrator.collect import Outcome, collect
from orchestrator.errors import UsageError

docker = pytest.mark.docker

FRAMEWORK = "theano"

IMAGE = "dlbench/theano:cpu"
RESLAB = "theano-reslab-convnet-cifar10"
# conv 20*1*25+20, conv 50*20*25+50, hidden (50*4*4)*500+500, logistic 500*10+10
MNIST_PARAMS = 520 + 25050 + 400500 + 5010
# 6_convnet_color.py: conv 4*3*9+4, conv 8*4*9+8, hidden (8*4*4)*100+100, output 100*10+10
RESLAB_PARAMS = 112 + 296 + 12900 + 1010
# 6_convnet.py (grey input): the first convolution has one input map, 4*1*9+4
RESLAB_GREY_PARAMS = 40 + 296 + 12900 + 1010


def theano_adapter():
    """images/theano/adapter.py as a module (it imports Theano only in setup())."""
    return adapter_module(REPO / "images" / "theano")


@pytest.fixture(scope="module")
def documents(quick_results, quick_run) -> dict:
    """The runner's result.json of each quick run, by data set (it holds Theano's own facts)."""
    results = quick_run(FRAMEWORK)
    return {name: json.loads((results / "_jobs" / row.run_id / "result.json").read_text())
            for name, row in quick_results.items()}


# The paper profile cut short: one epoch each; LeNet5 on the first 35,000 training images
# (25,000 train: 50 minibatches of 500) with patience 50, so that it validates every 25
# iterations (twice in its epoch) and tests at each new best.
PAPER_SETTINGS = {"mnist": ("epochs=1", "patience=50", "train_subset=35000") + NO_CHECKS,
                  "cifar10": ("epochs=1",) + NO_CHECKS}


@pytest.fixture(scope="module")
def paper_jobs(built, data_root, tmp_path_factory) -> dict:
    """By data set: the stored row, the runner's result.json and the job's log of a
    paper-profile job cut short on the real data."""
    results = tmp_path_factory.mktemp("theano-paper")
    for dataset, settings in PAPER_SETTINGS.items():
        dlbench("run", "--frameworks", FRAMEWORK, "--datasets", dataset, "--profile", "paper",
                *[arg for setting in settings for arg in ("--set", setting)],
                "--results", results, "--data-dir", data_root, check=True)
    jobs = {}
    for row in pd.read_parquet(results / "runs").itertuples():
        job = results / "_jobs" / row.run_id
        jobs[row.dataset] = (row, json.loads((job / "result.json").read_text()),
                             (job / "log.txt").read_text())
    return jobs


def run_in_image(script: str) -> str:
    """A Python script in the image, as the job runs: no network, read-only root
    file system, an unprivileged user, HOME and a tmpfs on /tmp."""
    import docker
    return docker.from_env().containers.run(
        IMAGE, entrypoint=["python3", "-c", textwrap.dedent(script)], remove=True,
        network_mode="none", read_only=True, user="nobody", environment={"HOME": "/tmp"},
        tmpfs={"/tmp": "rw,exec,nosuid,size=512m"}, stderr=True).decode()


def setup_in_image(device: str, error: str, before: str = "") -> str:
    """The adapter's setup() for a quick MNIST job on ``device`` in the image, after the
    statements ``before``; prints "refused: MESSAGE" where it raises ``error``."""
    return run_in_image("import os, sys\n"
                        "sys.path[:0] = ['/opt/dlbench', '/opt/dlbench/framework']\n"
                        + textwrap.dedent(before) + textwrap.dedent(f"""
        import adapter
        from dlbench_runner import runner, spec as specs
        spec = specs.complete({{"framework": "theano", "dataset": "mnist", "profile": "quick",
                               "device": "{device}", "threads": 1}},
                              specs.load_catalog("/opt/dlbench/framework"))
        try:
            adapter.Adapter(runner.Context(spec, "/data")).setup()
        except {error} as exc:
            print("refused:", exc)
    """))


@docker
def test_both_quick_runs_are_stored_as_ok(quick_results, documents):
    assert set(quick_results) == {"mnist", "cifar10"}
    for name, row in quick_results.items():
        assert (row.framework, row.profile, row.status) == ("theano", "quick", "ok"), row.error
        assert row.image == IMAGE
        assert row.train_time_s > 0 and row.test_time_s > 0 and row.test_samples == 10000
        assert row.framework_version == "1.0.5"
        assert row.blas_loaded == "openblas-pthread" and pd.isna(row.blas)
        libraries = json.loads(row.libraries)
        assert libraries["numpy"].startswith("1.19") and libraries["cxx"].startswith("/usr/bin/g++")
        framework_threads = json.loads(row.threads_framework)
        assert framework_threads["theano.config.blas.ldflags"] == "-lopenblas"
        assert framework_threads["theano.config.openmp"] == (row.threads > 1)
        assert framework_threads["openblas_get_num_threads"] == row.threads
        theano = documents[name]["theano"]
        assert theano["floatX"] == "float64"        # Theano's default, as GTDLBench ran it
        assert theano["warm_modules"] > 0           # the image's modules, compiled when it was built
        # the convolutions and their gradients ran as Theano's GEMM-based C ops
        assert theano["conv_ops"] == ["CorrMM", "CorrMM_gradInputs", "CorrMM_gradWeights"]
        hp = json.loads(row.hyperparameters)
        assert hp["epochs"] == 1 and hp["dtype"] == "float64"
        assert len(row.epoch_loss) == 1
        # quick does none of the originals' test passes, so it has no paper spans
        assert pd.isna(row.paper_train_time_s) and pd.isna(row.paper_test_time_s)
        assert documents[name]["periodic_passes"]["test"] == 0


@docker
def test_lenet5_on_mnist(quick_results, documents, quick_run):
    row = quick_results["mnist"]
    assert_robustness(quick_run("theano"), row)    # by T.grad
    assert_migration(quick_run("theano"), row)     # flipped kernels, float64 weights in float32
    assert row.model == "theano-lenet5"
    assert row.param_count == MNIST_PARAMS == 431080
    assert_model_size(row, element_sizes=(8,), at_most=1.01)    # float64, pickled
    assert row.accuracy >= 0.80         # 50 steps: 86% (the whole epoch's 100: 90.5%)
    # of the first 35,000 training images (the quick profile's train_subset), the first
    # 25,000 train and the last 10,000 validate, as mnist.pkl.gz splits the whole 60,000
    hp = json.loads(row.hyperparameters)
    assert hp["train_subset"] == quick_profile("theano", "mnist")["train_subset"] == 35000
    assert row.train_samples == 25000
    assert 0.0 < row.epoch_accuracy[0] <= 1.0
    assert (hp["batch_size"], hp["learning_rate"]) == (500, 0.1)
    # one epoch of 50 whole minibatches of 500, one validation pass at its end, no early stop
    stop = documents["mnist"]["early_stopping"]
    assert stop["epochs_run"] == 1 and stop["stopped_early"] is False
    assert stop["iterations"] == stop["best_iteration"] == stop["validation_frequency"] == 50
    assert 0.0 < stop["best_validation_error"] < 0.9
    # early stopping's validation pass runs in every profile, outside the training time
    passes = documents["mnist"]["periodic_passes"]
    assert passes["validation"] == 1 and passes["passes"][0]["iteration"] == 50
    assert documents["mnist"]["train_excluded_s"] >= passes["validation_s"] > 0


@docker
def test_reslab_convnet_on_cifar10(quick_results, documents, quick_run):
    row = quick_results["cifar10"]
    assert_robustness(quick_run("theano"), row)
    assert_migration(quick_run("theano"), row)
    assert row.model == RESLAB
    assert row.param_count == RESLAB_PARAMS == 14318
    assert_model_size(row, element_sizes=(8,), at_most=1.1)
    assert row.accuracy >= 0.20          # twice chance
    # all 50,000 training images, one epoch of 1,000 minibatches of 50, no validation split
    assert row.train_samples == 50000 and 0.0 < row.epoch_accuracy[0] <= 1.0
    hp = json.loads(row.hyperparameters)
    assert (hp["batch_size"], hp["learning_rate"], hp["momentum"], hp["grayscale"]) == \
        (50, 0.01, 0.9, False)
    assert documents["cifar10"]["early_stopping"] is None


@docker
def test_paper_lenet5_validates_and_tests_inside_its_timed_loop(paper_jobs):
    """The tutorial's loop: a validation pass every 25 iterations (patience 50), a test pass (and its
    print) at each new best; the span around it all is paper_train_time_s, the training
    steps alone train_time_s, and the last test pass -- the best model's, the runner's
    test -- paper_test_time_s."""
    row, result, log = paper_jobs["mnist"]
    assert (row.profile, row.status) == ("paper", "ok"), row.error
    assert json.loads(row.hyperparameters)["patience"] == 50
    periodic = result["periodic_passes"]
    passes = periodic["passes"]
    assert [p["iteration"] for p in passes] == [25, 50] and periodic["validation"] == 2
    # tested exactly where validation reached a new best (the first always does)
    best, tested = float("inf"), []
    for p in passes:
        tested.append(p["validation_error"] < best)
        best = min(best, p["validation_error"])
        assert (p["test_error"] is not None) == tested[-1]
    assert periodic["test"] == sum(tested) >= 1
    # the best validation model is restored: the runner's test scores what the loop last tested
    last_tested = [p for p in passes if p["test_error"] is not None][-1]
    assert row.accuracy == pytest.approx(1.0 - last_tested["test_error"], abs=1e-9)
    # the spans: the loop holds the training steps and every pass; the passes are not training
    assert row.paper_train_time_s >= row.train_time_s > 0
    assert row.paper_train_time_s >= row.train_time_s + periodic["validation_s"] + periodic["test_s"] - 0.05
    assert result["train_excluded_s"] >= periodic["validation_s"] + periodic["test_s"]
    assert 0 < row.paper_test_time_s <= periodic["test_s"]
    assert sum(row.epoch_time_s) <= row.train_time_s + 0.05       # an epoch's passes are not in it
    # the tutorial's prints
    assert "... training\ntraining @ iter =  0\n" in log
    assert "epoch 1, minibatch 25/50, validation error" in log
    assert log.count("test error of best model") == periodic["test"]
    assert "Optimization complete." in log
    assert "The code for file convolutional_mlp.py ran for %.2fm" % (row.paper_train_time_s / 60) in log


@docker
def test_paper_reslab_convnet_tests_after_every_epoch_inside_its_timed_loop(paper_jobs):
    row, result, log = paper_jobs["cifar10"]
    assert (row.profile, row.status, row.model) == ("paper", "ok", RESLAB), row.error
    periodic = result["periodic_passes"]
    assert (periodic["validation"], periodic["test"]) == (0, 1)
    # the script's per-epoch test (predict, one call) and the runner's test agree
    assert result["epochs"][0]["test_accuracy"] == row.accuracy
    assert "iteration 1\n" in log and "accuracy: %.5f\n" % row.accuracy in log
    assert row.paper_train_time_s >= row.train_time_s + periodic["test_s"] - 0.05
    assert row.train_time_s > 0 and result["train_excluded_s"] >= periodic["test_s"]
    assert row.paper_test_time_s == pytest.approx(periodic["test_s"])      # one pass


@docker
def test_the_image_carries_its_labels(built):
    import docker
    labels = docker.from_env().images.get(IMAGE).labels
    assert labels["org.dlbench.framework"] == "theano"
    assert labels["org.dlbench.framework-version"] == "1.0.5+dfsg-2"


@docker
@pytest.mark.parametrize("profile", ["paper", "quick"])
def test_early_stopping_follows_the_tutorial(built, profile):
    """The training loop with stand-in functions: 10 minibatches an epoch, patience
    10, so validation every 5 iterations.  Validation errors 0.5 (it 4, patience
    -> max(10, 8)), 0.4 (it 9, patience -> 18), 0.45 (it 14, no better), and the
    loop stops at iteration 18 (patience <= iter), in epoch 2 after 9 minibatches,
    before the validation due at iteration 19; the parameters of iteration 9 (the
    best validation) are restored.  The paper profile tests at the two new bests
    (2 minibatches of 100 of its 250 test images: the tutorial drops the partial
    one) and prints as the tutorial does; quick tests nowhere in the loop."""
    out = run_in_image("""
        import json, sys
        sys.path[:0] = ["/opt/dlbench", "/opt/dlbench/framework"]
        import numpy, adapter
        from dlbench_runner import runner
        hp = {"epochs": 200, "batch_size": 100, "learning_rate": 0.1, "patience": 10,
              "patience_increase": 2, "improvement_threshold": 0.995, "validation_images": 100}
        spec = {"hyperparameters": hp, "dataset": "mnist", "device": "cpu", "seed": 1, "threads": 1,
                "profile": "%s"}
        ctx = runner.Context(spec, "/data")
        a = adapter.LeNet5(ctx, numpy, None)
        a.n_train, a.n_valid, a.n_test = 1000, 100, 250
        state = {"it": -1, "tested": []}
        class Param:
            def get_value(self, borrow=False): return state["it"]
            def set_value(self, value, borrow=False): state["restored"] = value
        a.params = [Param()]
        def train_fn(i):
            state["it"] += 1
            return numpy.float32(1.0), numpy.float32(0.25)
        def test_model(i):
            state["tested"].append((state["it"], i))
            return numpy.float64(0.125 * (i + 1))
        errors = {4: 0.5, 9: 0.4, 14: 0.45, 19: 0.1}
        a.train_fn, a.validate_fn = train_fn, lambda i: errors[state["it"]]
        a.test_model = test_model
        a.train()
        print(json.dumps({"stop": a.early_stopping, "restored": state["restored"],
                          "tested": state["tested"], "periodic": a.periodic_passes,
                          "paper": [a.paper_train_time_s, a.paper_test_time_s],
                          "excluded": ctx.train_excluded_s,
                          "epochs": [(e["epoch"], e["samples"], e["accuracy"]) for e in ctx.epochs]}))
    """ % profile)
    # the last line of stdout; stderr's lines may come after it
    result = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert result["restored"] == 9
    assert result["epochs"] == [[1, 1000, 0.75], [2, 900, 0.75]]
    stop = result["stop"]
    assert stop["stopped_early"] is True and stop["stopped_at_iteration"] == 19
    assert stop["final_patience"] == 18 and stop["best_iteration"] == 10
    assert stop["best_validation_error"] == 0.4 and stop["validation_frequency"] == 5
    periodic = result["periodic"]
    assert [(p["iteration"], p["validation_error"]) for p in periodic["passes"]] == \
        [(5, 0.5), (10, 0.4), (15, 0.45)]
    assert periodic["validation"] == 3 and result["excluded"] >= periodic["validation_s"] > 0
    if profile == "quick":
        assert result["tested"] == [] and periodic["test"] == 0
        assert result["paper"] == [None, None]
        assert "training @ iter" not in out
        return
    assert result["tested"] == [[4, 0], [4, 1], [9, 0], [9, 1]]
    assert [p["test_error"] for p in periodic["passes"]] == [0.1875, 0.1875, None]
    assert periodic["test"] == 2
    paper_train, paper_test = result["paper"]
    assert 0 < paper_test <= periodic["test_s"] and paper_train >= periodic["validation_s"] + periodic["test_s"]
    assert result["excluded"] >= periodic["validation_s"] + periodic["test_s"]
    for line in ("... training", "training @ iter =  0",
                 "epoch 1, minibatch 5/10, validation error 50.000000 %",
                 "     epoch 1, minibatch 10/10, test error of best model 18.750000 %",
                 "epoch 2, minibatch 5/10, validation error 45.000000 %",
                 "Optimization complete.",
                 "Best validation score of 40.000000 % obtained at iteration 10, "
                 "with test performance 18.750000 %",
                 "The code for file convolutional_mlp.py ran for 0.00m"):
        assert line + "\n" in out
    assert out.count("test error of best model") == 2


@docker
def test_a_theano_without_cpp_compiler_is_refused(built):
    """Theano silently runs Python code when it finds no compiler; the adapter refuses."""
    out = setup_in_image("cpu", "RuntimeError", before="""
        with open("/tmp/theanorc", "w") as f:
            f.write("[global]\\ncxx =\\n")
        os.environ["THEANORC"] = "/tmp/theanorc"
    """)
    assert "refused: Theano found no C++ compiler" in out


@docker
def test_cuda_is_a_clear_error(built):
    out = setup_in_image("cuda", "ValueError")
    assert "refused: this theano image is a CPU build" in out


# -- without Docker ---------------------------------------------------------------------------
def test_the_reslab_convnet_has_the_scripts_shapes():
    """6_convnet_color.py's parameters in its order: 32x32 -> conv 3x3 30x30 -> pool 3 10x10
    -> conv 3x3 8x8 -> pool 2 4x4, so 8*4*4 = 128 inputs to the 100-unit layer."""
    shapes = theano_adapter().reslab_shapes
    assert shapes(3) == [("w_c1", (4, 3, 3, 3)), ("b_c1", (4,)), ("w_c2", (8, 4, 3, 3)), ("b_c2", (8,)),
                         ("w_h3", (128, 100)), ("b_h3", (100,)), ("w_o", (100, 10)), ("b_o", (10,))]
    assert sum(math.prod(shape) for _, shape in shapes(3)) == RESLAB_PARAMS
    assert sum(math.prod(shape) for _, shape in shapes(1)) == RESLAB_GREY_PARAMS == 14246


def test_theano_computes_in_float64_as_gtdlbench_ran_it_unless_told_float32():
    assert catalog.models("theano")["models"]["cifar10"]["model"] == RESLAB
    for dataset in ("mnist", "cifar10"):
        for profile in ("paper", "quick"):
            job, = make_plan(["theano"], [dataset], profile, host_cpus=2).jobs
            assert job.hyperparameters["dtype"] == "float64"
        single, = make_plan(["theano"], [dataset], overrides={"dtype": "float32"}, host_cpus=2).jobs
        # a change of the model's own settings: stored as such, never judged against the paper
        own = paper.defaults("theano", dataset, "paper")
        assert {k: v for k, v in single.hyperparameters.items() if own[k] != v} == {"dtype": "float32"}
        with pytest.raises(UsageError, match="'dtype' must be one of float64, float32, not 'float16'"):
            make_plan(["theano"], [dataset], overrides={"dtype": "float16"}, host_cpus=2)
    adapter = theano_adapter()
    assert "floatX=float64" in adapter.theano_flags(2, "/compile/x", "float64").split(",")
    assert "floatX=float32" in adapter.theano_flags(2, "/compile/x", "float32").split(",")
    job, = make_plan(["theano"], ["cifar10"], host_cpus=2).jobs
    assert {k: job.hyperparameters[k] for k in ("epochs", "batch_size", "learning_rate", "momentum",
                                                "grayscale")} == \
        {"epochs": 50, "batch_size": 50, "learning_rate": 0.01, "momentum": 0.9, "grayscale": False}


def test_a_gpu_job_sets_theanos_gpuarray_device_without_cudnn():
    adapter = theano_adapter()
    cpu = adapter.theano_flags(2, "/compile/x", "float64").split(",")
    assert "device=cpu" in cpu and not any(flag.startswith("dnn.") for flag in cpu)
    assert adapter.theano_flags(2, "/compile/x", "float64", None).split(",") == cpu
    gpu = adapter.theano_flags(2, "/compile/x", "float32", 0).split(",")
    assert "device=cuda0" in gpu and "dnn.enabled=False" in gpu and "floatX=float32" in gpu
    assert "device=cuda1" in adapter.theano_flags(2, "/compile/x", "float32", 1).split(",")


def test_gpu_sync_waits_on_each_updated_variables_current_array():
    """An update may store a new array in a shared variable: each sync looks them up again."""
    synced = []

    class Array:
        def __init__(self, name):
            self.name = name

        def sync(self):
            synced.append(self.name)

    class Shared:
        def __init__(self, name):
            self.value = Array(name)

        def get_value(self, borrow, return_internal_type):
            assert borrow and return_internal_type
            return self.value

    w, b = Shared("w"), Shared("b")
    sync = theano_adapter().gpu_sync([w, b])
    sync()
    w.value = Array("w2")
    sync()
    assert synced == ["w", "b", "w2", "b"]


def test_the_papers_theano_cifar10_cell_judges_the_reconstruction_and_never_lenet5(tmp_path):
    """One paper-profile row of each model with the same own settings: the reconstructed
    model is judged against 49.66%; dlbench's earlier LeNet5 on CIFAR-10 never is."""
    ref = paper.reference()
    assert ref.cell("theano", "cifar10", "cpu", RESLAB)["accuracy_pct"] == 49.66
    assert ref.cell("theano", "cifar10", "cpu", "theano-lenet5-cifar10") is None
    job, = make_plan(["theano"], ["cifar10"], host_cpus=2).jobs
    records = []
    for i, model in enumerate((RESLAB, "theano-lenet5-cifar10")):
        one = job.model_copy(update={"model": model})
        out = tmp_path / f"job{i}" / "out"
        out.mkdir(parents=True)
        (out / "result.json").write_text(json.dumps({
            "schema_version": 1, "status": "ok", "error": None, "framework": "theano",
            "dataset": "cifar10", "model": model, "profile": "paper",
            "hyperparameters": one.hyperparameters, "device": "cpu", "seed": 1,
            "setup_time_s": 40.0, "train_time_s": 600.0, "test_time_s": 1.0, "total_time_s": 641.0,
            "accuracy": 0.5, "param_count": 14318, "epochs": [],
            "started_at": "2026-01-01T00:00:00+00:00"}))
        records.append(collect(one, f"run{i}", f"job{i}", out.parent,
                               Outcome(exit_code=0, wall_time_s=650.0, log_tail=[]), {"image": IMAGE})[0])
    store.append(tmp_path / "results", records)
    groups = {g.model: g for g in paper.build(store.load(tmp_path / "results")).groups.itertuples()}
    judged, never = groups[RESLAB], groups["theano-lenet5-cifar10"]
    assert judged.settings == never.settings == "own defaults"
    assert judged.published_accuracy_pct == 49.66 and judged.accuracy_verdict == "reproduced"
    assert judged.accuracy_diff_points == pytest.approx(50.0 - 49.66)
    assert never.accuracy_verdict == f"not comparable: the paper's cell is {RESLAB}, not theano-lenet5-cifar10"
    assert pd.isna(never.published_accuracy_pct) and pd.isna(never.accuracy_diff_points)
