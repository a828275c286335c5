"""Runtimes and schedulers: found by name, used only through their protocols (no Docker,
no Slurm needed)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, make_plan
from orchestrator import catalog, execute, runtimes, schedulers
from orchestrator.errors import UsageError
from orchestrator.runtimes import Target

ORCHESTRATOR = REPO / "orchestrator"


def test_each_runtime_and_scheduler_is_found_by_name():
    assert list(runtimes.RUNTIMES) == ["docker", "native"]
    assert tuple(schedulers.SCHEDULERS) == catalog.SCHEDULERS    # the options' choices
    for name in schedulers.SCHEDULERS:
        assert schedulers.make(name).name == name
    assert schedulers.DEFAULT in schedulers.SCHEDULERS
    with pytest.raises(UsageError, match="no runtime 'podman': one of docker, native"):
        runtimes.make("podman")
    with pytest.raises(UsageError, match="no scheduler 'pbs': one of local, slurm"):
        schedulers.make("pbs")


def _outside(pattern: str, allowed: tuple[Path, ...]) -> list[str]:
    found = []
    for path in sorted(ORCHESTRATOR.rglob("*.py")):
        if any(path.is_relative_to(a) for a in allowed):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    return found


def test_nothing_outside_the_registries_asks_which_runtime_or_scheduler_it_has():
    assert _outside(r"runtime\.name ==", (ORCHESTRATOR / "runtimes",)) == []
    assert _outside(r'== "(docker|native|slurm|local)"',
                    (ORCHESTRATOR / "runtimes" / "__init__.py",
                     ORCHESTRATOR / "schedulers" / "__init__.py")) == []


def test_the_native_runtime_has_no_image_ships_nothing_and_checks_its_python_on_the_node(tmp_path):
    from orchestrator.runtimes.native import NativeRuntime

    runtime = runtimes.make("native", sys.executable)
    assert isinstance(runtime, NativeRuntime)
    job, = make_plan(["tensorflow"], ["mnist"]).jobs
    assert runtime.planned_image(job) is None
    runtime.prepare([("tensorflow", "cpu")])
    submitted = runtime.target("tensorflow", "cpu")
    assert runtime.export(submitted, tmp_path, print) is None and list(tmp_path.iterdir()) == []
    given = Target(submitted.name, "native:from-the-submitter")
    assert runtime.load("tensorflow", "cpu", given, None, print) == submitted


class Recorded:
    """A runtime and a scheduler that write down what is asked of them, in order."""

    name, default_memory, gpus = "recorded", None, None

    def __init__(self, calls: list):
        self.calls = calls

    def check(self, plan):
        self.calls.append(("check", len(plan.jobs)))

    def prepare(self, images):
        self.calls.append(("prepare", list(images)))

    def load(self, framework, variant, target, archive, say):
        self.calls.append(("load", framework, variant, target, archive))
        return Target(target.name, target.id, "loaded")

    def run(self, campaign, results, runtime, request, display, say):
        self.calls.append(("run", runtime is not self, request.data_dir))
        return schedulers.Executed(results, [])


def test_execute_checks_makes_the_runtime_prepares_then_runs_the_scheduler_it_found(
        tmp_path, monkeypatch):
    calls = []
    monkeypatch.setitem(schedulers.SCHEDULERS, "local", lambda: Recorded(calls))

    def runtime(python, display, build):
        calls.append(("runtime", python))
        return Recorded(calls)

    monkeypatch.setitem(runtimes.RUNTIMES, "docker", runtime)
    the_plan = make_plan(["tensorflow"], ["mnist"])
    campaign = SimpleNamespace(plan=the_plan, scheduler=None, slurm=None)
    done = execute.execute(execute.Request(results=tmp_path / "r", data_dir=tmp_path / "d"),
                           campaign=campaign)
    assert done.records == [] and done.results == tmp_path / "r"
    # the paper profile's job: its framework's image, then the tool images of its platforms
    assert calls == [("check", 1), ("runtime", None),
                     ("prepare", [("tensorflow", "cpu"), ("deploy", "cpu"), ("web", "cpu")]),
                     ("run", True, tmp_path / "d")]


def test_a_slurm_task_runs_on_the_targets_its_runtime_loads_from_the_submitters(tmp_path, monkeypatch):
    from orchestrator.schedulers import slurm

    calls, ran = [], {}
    monkeypatch.setattr(slurm, "make", lambda name, python, display: Recorded(calls))
    monkeypatch.setattr(slurm, "run_plan", lambda plan, results, runtime, data_dir, **kwargs:
                        ran.update(kwargs) or [])
    job, = make_plan(["tensorflow"], ["mnist"], "quick").jobs     # deployed nowhere: one image
    array = slurm.ArrayFile(submission="s", tasks=[slurm.Task(job=job, job_id="0" * 16)], images={
        "tensorflow:cpu": slurm.Image(tag="dlbench/tensorflow:cpu", id="sha256:1",
                                      archive="_slurm/images/sha256-1.tar")})
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(array.model_dump_json())
    assert slurm.run_task(plan_file, 0, tmp_path) == []
    submitted = Target("dlbench/tensorflow:cpu", "sha256:1")
    assert calls == [("load", "tensorflow", "cpu", submitted, tmp_path / "_slurm/images/sha256-1.tar")]
    assert ran["targets"] == {("tensorflow", "cpu"): Target("dlbench/tensorflow:cpu", "sha256:1", "loaded")}
