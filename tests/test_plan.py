"""The plan is a plain value: options in, jobs out, no Docker touched."""

from __future__ import annotations

import pytest

from orchestrator import plan
from orchestrator.errors import UsageError


def test_default_plan_is_every_available_model_on_the_paper_profile():
    the_plan = plan.make_plan(host_cpus=4)
    torch_jobs = [j for j in the_plan.jobs if j.framework == "torch"]
    assert [j.dataset for j in torch_jobs][:1] == ["mnist"]
    job = torch_jobs[0]
    assert job.profile == "paper" and job.hyperparameters["epochs"] == 20
    assert job.hyperparameters["batch_size"] == 10 and job.hyperparameters["learning_rate"] == 0.05
    assert job.threads == 4 and job.cpus is None and job.device == "cpu"


def test_quick_profile_cpus_overrides_and_repeats():
    the_plan = plan.make_plan(["torch"], ["mnist"], "quick", cpus=2, overrides={"batch_size": 32},
                              repeats=3, seed=7, host_cpus=4)
    assert len(the_plan.jobs) == 3
    assert [j.seed for j in the_plan.jobs] == [7, 8, 9]
    assert [j.repeat for j in the_plan.jobs] == [0, 1, 2]
    assert all(j.hyperparameters["epochs"] == 1 and j.hyperparameters["batch_size"] == 32
               for j in the_plan.jobs)
    assert all(j.threads == 2 and j.cpus == 2 for j in the_plan.jobs)


def test_job_id_is_stable_and_changes_with_what_defines_the_job():
    a, = plan.make_plan(["torch"], ["mnist"], "quick", host_cpus=2).jobs
    b, = plan.make_plan(["torch"], ["mnist"], "quick", host_cpus=2).jobs
    assert a.job_id("img1", "data1") == b.job_id("img1", "data1")
    c, = plan.make_plan(["torch"], ["mnist"], "quick", overrides={"epochs": 2}, host_cpus=2).jobs
    assert len({a.job_id("img1", "data1"), a.job_id("img2", "data1"), a.job_id("img1", "data2"),
                c.job_id("img1", "data1")}) == 4


@pytest.mark.parametrize("kwargs, message", [
    (dict(frameworks=["tensorflw"]), "unknown framework 'tensorflw'"),
    (dict(datasets=["imagenet"]), "unknown data set 'imagenet'"),
    (dict(profile="full"), "unknown profile 'full'"),
    (dict(cpus=9), "--cpus/--threads 9: this host has 4 CPUs"),
    (dict(gpu=-1), "a GPU index is 0 or more"),
    (dict(repeats=0), "at least 1"),
    (dict(frameworks=["torch"], overrides={"batch": 5}), "no hyper-parameter 'batch'"),
    (dict(frameworks=["torch"], overrides={"epochs": "many"}), "must be int"),
])
def test_bad_options_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message):
        plan.make_plan(host_cpus=4, **kwargs)


def test_overrides_parse_as_json_values():
    assert plan.parse_overrides(["epochs=3", "learning_rate=0.1", "name=x"]) == \
        {"epochs": 3, "learning_rate": 0.1, "name": "x"}
    with pytest.raises(UsageError, match="KEY=VALUE"):
        plan.parse_overrides(["epochs"])
