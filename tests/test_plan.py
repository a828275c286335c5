"""The plan is a plain value: options in, jobs out, no Docker touched."""

from __future__ import annotations

import json

import pytest

from conftest import make_plan
from dlbench_runner import contract
from orchestrator import options, plan
from orchestrator.errors import UsageError


def test_default_plan_is_every_available_model_on_the_paper_profile():
    the_plan = make_plan(host_cpus=4)
    torch_jobs = [j for j in the_plan.jobs if j.framework == "pytorch"]
    assert [j.dataset for j in torch_jobs][:1] == ["mnist"]
    job = torch_jobs[0]
    assert job.profile == "paper" and job.hyperparameters["epochs"] == 20
    assert job.hyperparameters["batch_size"] == 10 and job.hyperparameters["learning_rate"] == 0.05
    assert job.threads == 4 and job.cpus is None and job.device == "cpu"


def test_quick_profile_cpus_overrides_and_repeats():
    the_plan = make_plan(["pytorch"], ["mnist"], "quick", cpus=2, overrides={"batch_size": 32},
                              repeats=3, seed=7, host_cpus=4)
    assert len(the_plan.jobs) == 3
    assert [j.seed for j in the_plan.jobs] == [7, 8, 9]
    assert [j.repeat for j in the_plan.jobs] == [0, 1, 2]
    assert all(j.hyperparameters["epochs"] == 1 and j.hyperparameters["batch_size"] == 32
               for j in the_plan.jobs)
    assert all(j.threads == 2 and j.cpus == 2 for j in the_plan.jobs)


def test_job_id_is_stable_and_changes_with_what_defines_the_job():
    a, = make_plan(["pytorch"], ["mnist"], "quick", host_cpus=2).jobs
    b, = make_plan(["pytorch"], ["mnist"], "quick", host_cpus=2).jobs
    assert a.job_id("img1", "data1") == b.job_id("img1", "data1")
    c, = make_plan(["pytorch"], ["mnist"], "quick", overrides={"epochs": 2}, host_cpus=2).jobs
    assert len({a.job_id("img1", "data1"), a.job_id("img2", "data1"), a.job_id("img1", "data2"),
                c.job_id("img1", "data1")}) == 4


@pytest.mark.parametrize("kwargs, message", [
    (dict(frameworks=["tensorflw"]), "unknown framework 'tensorflw'"),
    (dict(datasets=["imagenet"]), "unknown data set 'imagenet'"),
    (dict(profile="full"), "unknown profile 'full'"),
    (dict(cpus=9), "--cpus/--threads 9: this host has 4 CPUs"),
    (dict(gpu=-1), "a GPU index is 0 or more"),
    (dict(repeats=0), "at least 1"),
    (dict(frameworks=["pytorch"], overrides={"batch": 5}), "no hyper-parameter 'batch'"),
    (dict(frameworks=["pytorch"], overrides={"epochs": "many"}), "must be int"),
])
def test_bad_options_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message):
        make_plan(host_cpus=4, **kwargs)


def test_overrides_parse_as_json_values():
    assert options.parse_overrides(["epochs=3", "learning_rate=0.1", "name=x"]) == \
        {"epochs": 3, "learning_rate": 0.1, "name": "x"}
    with pytest.raises(UsageError, match="KEY=VALUE"):
        options.parse_overrides(["epochs"])


# -- cross-settings: another framework's defaults ------------------------------------------
def cross(source, framework, dataset, profile="paper", **kwargs):
    axes = options.Axes(frameworks=[framework], datasets=[dataset], profiles=[profile],
                     settings_from=[source], **kwargs)
    job, = plan.expand(axes, host_cpus=2).jobs
    return job


def test_settings_from_carries_batch_size_rate_and_passes_over_the_data():
    # Caffe's LeNet: 10,000 iterations of 64 images at 0.01 = 10.67 passes over 60,000 images.
    job = cross("caffe", "pytorch", "mnist")
    assert job.settings_from == "caffe"
    assert {k: job.hyperparameters[k] for k in ("batch_size", "learning_rate", "epochs")} == {
        "batch_size": 64, "learning_rate": 0.01, "epochs": 11}
    assert job.hyperparameters["test_batch_size"] == 10          # the rest stays torch's own
    # TensorFlow counts steps over its 55,000 training images: 10.67 passes of 64.
    job = cross("caffe", "tensorflow", "mnist")
    assert job.hyperparameters["max_steps"] == 9167 and job.hyperparameters["batch_size"] == 64
    # Torch's 20 epochs of 10 images, as Caffe iterations of 10.
    job = cross("pytorch", "caffe", "mnist")
    assert job.hyperparameters["max_iter"] == 120_000 and job.hyperparameters["learning_rate"] == 0.05


def test_settings_from_keeps_caffes_second_phase_in_proportion():
    # cifar10_quick: 4,000 iterations at 0.001, then to 5,000 at 0.0001 (batch 100).
    # MXNet's ResNet: 300 epochs of 128 at 0.05 = 117,188 iterations in all.
    job = cross("mxnet", "caffe", "cifar10")
    hp = job.hyperparameters
    assert hp["batch_size"] == 128 and hp["max_iter_lr1"] == 117_188 and hp["max_iter"] == 93_750
    assert hp["learning_rate"] == 0.05 and hp["learning_rate_lr1"] == pytest.approx(0.005)


def test_own_settings_stay_own_and_the_users_overrides_win():
    job = cross("pytorch", "pytorch", "mnist")
    assert job.settings_from is None and job.overrides == {}
    job = cross("caffe", "pytorch", "mnist", hyperparameters={"epochs": [2]})
    assert job.hyperparameters["epochs"] == 2 and job.hyperparameters["batch_size"] == 64
    axes = options.Axes(frameworks=["caffe", "pytorch"], datasets=["mnist"], settings_from=[None, "caffe"])
    jobs = plan.expand(axes, host_cpus=2).jobs
    assert [(j.framework, j.settings_from) for j in jobs] == [
        ("caffe", None), ("pytorch", None), ("pytorch", "caffe")]
    assert len({j.job_id("img", "data") for j in jobs}) == 3


def test_settings_from_on_the_quick_profile_uses_the_sources_quick_settings():
    # 500 iterations of 64 = 0.533 passes over 60,000 images = 459 steps over 55,000.
    job = cross("caffe", "tensorflow", "mnist", "quick")
    assert job.hyperparameters["max_steps"] == 459 and job.profile == "quick"


# -- what the originals ran, per device and seed ------------------------------------------------
def test_theano_plans_float64_on_the_cpu_and_float32_on_a_gpu_unless_told():
    """GTDLBench's Theano ran floatX=float64 on the CPU (Theano's default there) and, by its
    GPU times, float32 on the GPU (Theano's GPU setting); --set dtype= still chooses."""
    cpu, gpu = make_plan(["theano"], ["mnist"], host_cpus=2).jobs + \
        make_plan(["theano"], ["mnist"], gpu=0, host_cpus=2).jobs
    assert (cpu.hyperparameters["dtype"], gpu.hyperparameters["dtype"]) == ("float64", "float32")
    told, = make_plan(["theano"], ["cifar10"], gpu=0, overrides={"dtype": "float64"}, host_cpus=2).jobs
    assert told.hyperparameters["dtype"] == "float64" and told.overrides == {"dtype": "float64"}


def test_a_model_keeps_its_originals_seed_unless_one_is_given():
    """The Theano tutorial's LeNet5 draws its weights from RandomState(23455): its default
    seed, and its repeats' seeds follow it; every other model starts at 1."""
    jobs = make_plan(["caffe", "theano"], ["mnist"], "quick", repeats=2, host_cpus=2).jobs
    assert [(j.framework, j.seed) for j in jobs] == [("caffe", 1), ("theano", 23455),
                                                     ("caffe", 2), ("theano", 23456)]
    given = make_plan(["theano"], ["mnist"], "quick", seed=5, host_cpus=2).jobs
    assert [j.seed for j in given] == [5]


def test_the_pytorch_port_of_cifar10_trains_without_decay_as_the_lua_run_did():
    """Under th, train-on-cifar-10.lua's config table never reached optim.sgd (Penlight's
    module took its name), so the Lua run had no learning-rate decay; MNIST's sgdState had it."""
    cifar, = make_plan(["pytorch"], ["cifar10"], host_cpus=2).jobs
    mnist, = make_plan(["pytorch"], ["mnist"], host_cpus=2).jobs
    assert cifar.hyperparameters["learning_rate_decay"] == 0.0
    assert mnist.hyperparameters["learning_rate_decay"] == 5e-7


def test_a_job_that_cannot_run_is_planned_unsupported_and_needs_no_image(monkeypatch):
    from orchestrator import catalog
    monkeypatch.setitem(catalog.models("caffe")["variants"], "gpu", {"unsupported": "no CUDA build"})
    the_plan = make_plan(["caffe", "pytorch"], ["mnist"], gpu=0, host_cpus=2)
    caffe, pytorch = the_plan.jobs
    assert caffe.unsupported == "caffe has no GPU image: no CUDA build" and pytorch.unsupported is None
    # the paper profile deploys its models on every platform: the tool images come after
    assert the_plan.images == [("pytorch", "gpu"), ("deploy", "cpu"), ("web", "cpu")]
    # not part of what defines the job: its id is the same either way
    assert caffe.job_id("i", "d") == caffe.model_copy(update={"unsupported": None}).job_id("i", "d")


def test_each_profile_has_its_platforms_and_a_job_needs_the_tool_images_of_those_asked_for():
    from orchestrator import axes, catalog
    from orchestrator.options import Axes
    from orchestrator.plan import expand

    by_profile = {p: make_plan(["caffe"], ["mnist"], p, host_cpus=2).jobs[0]
                  for p in ("paper", "quick", "fair")}
    assert by_profile["paper"].platforms == catalog.PLATFORMS
    assert by_profile["quick"].platforms == () and by_profile["fair"].platforms == ()
    assert make_plan(["caffe"], ["mnist"], "quick", host_cpus=2).images == [("caffe", "cpu")]
    job, = expand(Axes(frameworks=["caffe"], datasets=["mnist"], profiles=["quick"],
                       platforms=axes.platform_list(["onnx-int8", "mobile"])), 2).jobs
    assert job.platforms == ("mobile", "onnx-int8") and job.images == [("caffe", "cpu"), ("deploy", "cpu")]
    # where it is deployed is not what it trains: the job's id is the same
    assert job.job_id("i", "d") == by_profile["quick"].job_id("i", "d")


@pytest.mark.parametrize("given, expected", [
    ("all", ("mobile", "mobile-int8", "onnx-int8", "web")), ("none", ()), ("web,mobile", ("mobile", "web")),
    (["onnx-int8", "onnx-int8"], ("onnx-int8",))])
def test_platforms_read_alike_from_the_command_line_and_a_campaign_file(tmp_path, given, expected):
    from orchestrator import campaign

    text = given if isinstance(given, str) else ",".join(given)
    assert options.RunOptions.from_command_line(platforms=text).platforms == expected
    path = tmp_path / "c.toml"
    path.write_text(f"name = \"p\"\nframeworks = [\"caffe\"]\ndatasets = [\"mnist\"]\nplatforms = {json.dumps(given)}\n")
    job, = campaign.read(path, options.RunOptions(), host_cpus=2).plan.jobs
    assert job.platforms == expected


def test_an_unknown_platform_is_a_one_line_usage_error(tmp_path):
    from orchestrator import campaign

    with pytest.raises(UsageError, match=r"--platforms: unknown platform 'tflite' \(choose from mobile, "):
        options.RunOptions.from_command_line(platforms="mobile,tflite")
    path = tmp_path / "c.toml"
    path.write_text('name = "p"\nplatforms = ["tflite"]\n')
    with pytest.raises(UsageError, match="platforms.*unknown platform 'tflite'"):
        campaign.read(path, options.RunOptions(), host_cpus=2)


def test_a_job_written_before_memory_bytes_keeps_its_memory_limit():
    # a Slurm array file of an older dlbench holds the limit as written only
    job = make_plan(["caffe"], ["mnist"], "quick").jobs[0]
    older = json.loads(job.model_dump_json())
    older["memory"] = "4g"
    del older["memory_bytes"]
    assert plan.Job.model_validate(older).memory_bytes == 4 * 2**30
    assert plan.Job.model_validate(older).job_id("i", "d") == job.job_id("i", "d")   # no part of it


def test_every_model_takes_the_robustness_settings_with_its_data_sets_defaults():
    jobs = {(j.framework, j.dataset): j for j in make_plan(["pytorch", "caffe"], host_cpus=4).jobs}
    mnist, cifar = jobs["pytorch", "mnist"].hyperparameters, jobs["caffe", "cifar10"].hyperparameters
    assert (mnist["robust_images"], mnist["epsilons"], mnist["pgd_epsilon"]) == (1000, "0.05,0.1,0.2,0.3", "0.1")
    assert (cifar["robust_images"], cifar["epsilons"], cifar["pgd_epsilon"]) == (1000, "1/255,2/255,4/255,8/255",
                                                                                 "4/255")
    quick = make_plan(["pytorch", "caffe"], profile="quick", host_cpus=4).jobs
    assert {j.hyperparameters["robust_images"] for j in quick} == {100}   # the quick profile's
    one, = make_plan(["pytorch"], ["mnist"], overrides={"robust_images": 0, "pgd_epsilon": 0.2,
                                                       "epsilons": "8/255,0.5"}, host_cpus=4).jobs
    assert (one.hyperparameters["robust_images"], one.hyperparameters["pgd_epsilon"]) == (0, "0.2")
    assert contract.epsilons(one.hyperparameters["epsilons"]) == [8 / 255, 0.5]


@pytest.mark.parametrize("overrides, message", [
    ({"epsilons": "0.1,1.5"}, r"'epsilons': epsilon 1.5: an epsilon is in the \[0, 1\] pixel scale"),
    ({"epsilons": "0.1,-0.1"}, r"epsilon -0.1: an epsilon is in the \[0, 1\]"),
    ({"epsilons": "0.1,,0.2"}, "epsilon '': give a number or a fraction such as 4/255"),
    ({"epsilons": "1/0"}, "epsilon '1/0': give a number or a fraction"),
    ({"pgd_epsilon": 2}, r"'pgd_epsilon': epsilon 2: an epsilon is in the \[0, 1\]"),
    ({"pgd_epsilon": "0.1,0.2"}, "'pgd_epsilon' is one epsilon"),
    ({"robust_images": -1}, "'robust_images' must be 0 or more, not -1"),
    ({"robust_images": 10001}, r"'robust_images' must be at most 10000 \(the test images of mnist\)"),
    ({"robust_images": 1.5}, "must be int"),
    ({"export_onnx": 2}, "'export_onnx' must be one of 0, 1, not 2"),
    ({"export_onnx": True}, "'export_onnx' must be int, not True"),
])
def test_bad_robustness_settings_are_refused_before_any_job(overrides, message):
    with pytest.raises(UsageError, match=message):
        make_plan(["pytorch"], ["mnist"], overrides=overrides, host_cpus=4)


def test_robust_images_takes_at_most_the_images_the_profile_tests_on():
    """The quick profile tests the PyTorch CIFAR-10 model on 1,000 images: no more are attacked;
    a larger test_subset given beside them lets more be."""
    with pytest.raises(UsageError, match="at most 1000 .the test images of cifar10 this profile tests on"):
        make_plan(["pytorch"], ["cifar10"], "quick", overrides={"robust_images": 3000}, host_cpus=4)
    job, = make_plan(["pytorch"], ["cifar10"], "quick", overrides={"robust_images": 3000, "test_subset": 3000},
                     host_cpus=4).jobs
    assert job.hyperparameters["robust_images"] == 3000
    with pytest.raises(UsageError, match="at most 2000"):
        make_plan(["pytorch"], ["cifar10"], "quick", overrides={"robust_images": 2500, "test_subset": 2000},
                  host_cpus=4)


def test_the_default_robust_images_follow_a_smaller_test_subset():
    job, = make_plan(["pytorch"], ["cifar10"], "quick", overrides={"test_subset": 60}, host_cpus=4).jobs
    assert job.hyperparameters["robust_images"] == 60
