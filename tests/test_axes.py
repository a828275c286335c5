"""The axes, each declared once (orchestrator/axes.py): one compute setting checked against
each framework in one place, and a toy axis added as one Axis that the command line, a
campaign file, tune's search space and a framework's adapter all take."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import types

import pytest

from conftest import REPO
from dlbench_runner import spec as runner_spec
from orchestrator import catalog

EXAMPLE = REPO / "examples" / "frameworks" / "sklearn"

# The toy axis, added before any module makes its models from axes.AXES: a precision that
# a framework lists in its models.json, as it lists its BLAS libraries.
ADD_AXIS = """\
import sys
from orchestrator import axes
axes.AXES.append(axes.Axis("precision", default=[None], matrix=True, unique=True, setting=True,
                           search="asked", what="precisions, e.g. fp32,fp16",
                           help="Precisions to sweep, e.g. fp32,fp16."))
"""
CLI = ADD_AXIS + "sys.argv[0] = 'dlbench'\nfrom orchestrator.entry import main\nmain()\n"
TUNE = ADD_AXIS + """\
import json
from orchestrator import tune
request = tune.TuneRequest("toyfw", "mnist", space=("precision", "threads"))
space = tune.space_of(request, 2)
print(json.dumps({"space": space, "default": tune.default_point(request, space, 2),
                  "all": tune.SPACE}))
"""

# The toy framework's adapter: it reads the setting from the spec the runner hands it.
ADAPTER = '''\
class Adapter:
    DTYPES = {None: "float32", "fp32": "float32", "fp16": "float16"}

    def __init__(self, ctx):
        self.ctx = ctx
        self.dtype = self.DTYPES[ctx.spec["precision"]]
'''


@pytest.fixture
def toy(tmp_path):
    """A framework folder, toyfw, that offers the precisions fp32 and fp16."""
    folder = tmp_path / "toyfw"
    shutil.copytree(EXAMPLE, folder)
    info = json.loads((folder / "models.json").read_text())
    info.update(framework="toyfw", precision=["fp32", "fp16"])
    (folder / "models.json").write_text(json.dumps(info))
    (folder / "adapter.py").write_text(ADAPTER)
    return folder


def toy_dlbench(toy, script, *args):
    env = {**__import__("os").environ, "DLBENCH_FRAMEWORKS_PATH": str(toy)}
    for name in ("DLBENCH_RESULTS_DIR", "DLBENCH_DATA_DIR"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=300)


def planned(proc) -> list[dict]:
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_a_setting_is_held_against_a_framework_in_one_place():
    assert catalog.check_setting("caffe", "blas", None) is None
    assert catalog.check_setting("caffe", "blas", "atlas") is None
    refused = catalog.check_setting("caffe", "blas", "mkl")
    assert refused.usage and refused.why.startswith("--blas mkl: caffe's image does not hold it")
    cannot = catalog.check_setting("tensorflow", "blas", "atlas")
    assert not cannot.usage and cannot.why.startswith("tensorflow cannot switch its BLAS library: ")
    assert catalog.check_setting("caffe", "blas", "atlas", "gpu") == catalog.Refusal(
        "caffe's GPU image holds one BLAS library (its CPU image holds several)", usage=False)
    assert catalog.check_setting("tensorflow", "onednn", "off") is None
    assert not catalog.check_setting("caffe", "onednn", "off").usage


def test_a_toy_axis_on_the_command_line(toy, tmp_path):
    jobs = planned(toy_dlbench(toy, CLI, "run", "--dry-run", "--format", "json", "--frameworks",
                               "toyfw,caffe", "--datasets", "mnist", "--profile", "quick",
                               "--precision", "fp16,default", "--results", tmp_path / "results"))
    assert [(j["framework"], j["precision"]) for j in jobs] == [
        ("toyfw", "fp16"), ("toyfw", None), ("caffe", "fp16"), ("caffe", None)]
    assert jobs[0]["unsupported"] is None and jobs[1]["unsupported"] is None
    assert jobs[2]["unsupported"] == "caffe has no precision setting: its models.json offers no precision"
    help_text = toy_dlbench(toy, CLI, "run", "--help").stdout
    assert "--precision" in help_text and "Precisions to sweep" in help_text
    refused = toy_dlbench(toy, CLI, "run", "--dry-run", "--frameworks", "toyfw", "--precision", "bf16",
                          "--results", tmp_path / "results")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "dlbench: error: --precision bf16: toyfw does not offer it (it offers fp32, fp16)"]


def test_a_toy_axis_in_a_campaign_file(toy, tmp_path):
    path = tmp_path / "toy.toml"
    path.write_text('name = "toy"\nframeworks = ["toyfw"]\ndatasets = ["mnist"]\nprofiles = ["quick"]\n'
                    'precision = ["fp16", "fp16"]\n\n[[matrix]]\nlabel = "full"\nprecision = ["fp32"]\n\n'
                    '[[matrix]]\nlabel = "half"\n')
    jobs = planned(toy_dlbench(toy, CLI, "run", "--dry-run", "--format", "json", "--campaign", path,
                               "--results", tmp_path / "results"))
    assert [(j["campaign"], j["precision"]) for j in jobs] == [("toy", "fp32"), ("toy", "fp16")]


def test_a_toy_axis_in_tunes_search_space(toy):
    proc = toy_dlbench(toy, TUNE)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["space"] == {"precision": ["fp32", "fp16"], "threads": [1, 2]}
    assert found["default"] == {"precision": "fp32", "threads": 2}
    assert found["all"][:3] == ["blas", "precision", "threads"]


def test_the_toy_adapter_gets_the_value_through_the_runners_spec(toy):
    """The spec a planned job hands the runner, completed as the runner completes it,
    is what the adapter reads its setting from."""
    job = {"framework": "toyfw", "dataset": "mnist", "profile": "quick", "overrides": {},
           "threads": 1, "device": "cpu", "seed": 1, "blas": None, "onednn": None, "precision": "fp16"}
    catalog_json = json.loads((toy / "models.json").read_text())
    completed = runner_spec.complete(job, catalog_json)
    loader = importlib.util.spec_from_file_location("toy_adapter", toy / "adapter.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    assert module.Adapter(types.SimpleNamespace(spec=completed)).dtype == "float16"
