"""Frameworks found from outside dlbench: the built-in six through the same entry points as an
installed package's, directories on DLBENCH_FRAMEWORKS_PATH, and every way a directory can fail
to be a framework, each one line naming the path.  The worked example (examples/frameworks/
sklearn) is planned, built and trained through `dlbench run` in test_added_framework.py."""

from __future__ import annotations

import json
import shutil
import types

import pytest

from conftest import REPO, dlbench
from orchestrator import build, campaign, catalog
from orchestrator.errors import FrameworkError, UsageError
from orchestrator.options import RunOptions

EXAMPLES = REPO / "examples" / "frameworks"
SKLEARN = EXAMPLES / "sklearn"
NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def copy_example(to, name=None, **changes):
    """A copy of the example framework at ``to``, its models.json's framework renamed and
    top-level keys changed (a value None removes the key)."""
    shutil.copytree(SKLEARN, to)
    info = json.loads((to / "models.json").read_text())
    info["framework"] = name or info["framework"]
    for key, value in changes.items():
        if value is None:
            info.pop(key)
        else:
            info[key] = value
    (to / "models.json").write_text(json.dumps(info))
    return to


def with_path(monkeypatch, *entries):
    monkeypatch.setenv(catalog.PATH_VARIABLE, ":".join(map(str, entries)))


def one_line_error(proc, code: int, *parts: str):
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("dlbench: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for part in parts:
        assert part in proc.stderr, proc.stderr


# -- where frameworks come from ---------------------------------------------------------------

def test_the_built_in_ones_come_through_the_entry_points_the_study_s_first(monkeypatch):
    monkeypatch.delenv(catalog.PATH_VARIABLE, raising=False)
    found = catalog.frameworks()
    assert list(found) == [*catalog.STUDY_ORDER, *catalog.TODAY_ORDER] == list(catalog.BUILT_IN)
    # a run that names none trains the study's: today's run when named
    assert catalog.default_names() == list(catalog.STUDY_ORDER)
    for name, framework in found.items():
        assert framework.directory == REPO / "images" / name
        assert framework.origin == f"entry point {name} = dlbench_images:{name}"
        assert framework.models["framework"] == name


def test_a_folder_of_frameworks_or_one_framework_directory_on_the_path(monkeypatch, tmp_path):
    with_path(monkeypatch, EXAMPLES)
    assert catalog.names() == [*catalog.BUILT_IN, "sklearn"]
    assert catalog.framework_dir("sklearn") == SKLEARN
    with_path(monkeypatch, SKLEARN)             # the framework's own directory
    assert catalog.names()[-1] == "sklearn" and catalog.framework_dir("sklearn") == SKLEARN
    # added frameworks follow the study's, sorted by name; empty entries, dot and underscore
    # folders are passed over; one directory named twice is one framework
    copy_example(tmp_path / "more" / "b", "zeta")
    copy_example(tmp_path / "more" / "a", "alpha")
    (tmp_path / "more" / "_notes").mkdir()
    (tmp_path / "more" / ".git").mkdir()
    monkeypatch.setenv(catalog.PATH_VARIABLE, f"{tmp_path / 'more'}::{SKLEARN}:{EXAMPLES}:")
    assert catalog.names() == [*catalog.BUILT_IN, "alpha", "sklearn", "zeta"]
    assert catalog.framework_dir("zeta") == tmp_path / "more" / "b"


def test_an_added_framework_is_checked_and_planned_as_the_study_s_are(monkeypatch, tmp_path):
    with_path(monkeypatch, EXAMPLES)
    assert catalog.check_frameworks(["sklearn", "caffe"]) == ["sklearn", "caffe"]
    assert catalog.variant_unsupported("sklearn", "gpu") == \
        "sklearn has no GPU image: scikit-learn trains on the CPU only"
    assert catalog.native_module("sklearn") == ("sklearn", None)
    # a campaign file's tables for it, and another framework's settings carried over to it
    path = tmp_path / "campaign.toml"
    path.write_text('name = "added"\nframeworks = ["sklearn"]\ndatasets = ["mnist"]\n'
                    'profiles = ["quick"]\nsettings_from = ["own", "caffe"]\n'
                    '[hyperparameters.sklearn]\nhidden_units = [50, 100]\n'
                    '[limits.sklearn]\ntimeout = 60\n')
    jobs = campaign.read(path, RunOptions(), host_cpus=2).plan.jobs
    assert [(j.settings_from, j.hyperparameters["hidden_units"]) for j in jobs] == \
        [(None, 50), (None, 100), ("caffe", 50), ("caffe", 100)]
    assert {j.timeout for j in jobs} == {60}
    assert jobs[2].hyperparameters["batch_size"] == 64        # Caffe LeNet's batch
    monkeypatch.delenv(catalog.PATH_VARIABLE)
    with pytest.raises(UsageError, match="unknown framework 'sklearn'"):
        catalog.check_frameworks(["sklearn"])
    with pytest.raises(UsageError) as caught:
        campaign.read(path, RunOptions(), host_cpus=2)
    lines = [line.split(": ", 1)[1] for line in str(caught.value).splitlines()]
    assert lines == ["frameworks: unknown framework 'sklearn' (choose from caffe, tensorflow, torch, "
                     "pytorch, mxnet, theano, pytorch2, jax) (and 2 more problems)",
                     "hyperparameters.sklearn: a table here must be named after a framework (caffe, "
                     "tensorflow, torch, pytorch, mxnet, theano, pytorch2, jax)",
                     "limits.sklearn: unknown key"]


def test_the_build_context_of_an_added_framework_is_its_own_directory(monkeypatch):
    with_path(monkeypatch, EXAMPLES)
    builder = build.Builder(client=None)
    tag, files, args, labels = builder._framework_inputs("sklearn", "cpu", types.SimpleNamespace(id="sha256:0"))
    assert tag == "dlbench/sklearn:cpu"
    assert files["Dockerfile"] == SKLEARN / "Dockerfile"
    assert files["sklearn/adapter.py"] == SKLEARN / "adapter.py"
    assert files["sklearn/models.json"] == SKLEARN / "models.json"
    assert files["runner/dlbench_runner/runner.py"] == REPO / "images" / "runner" / "dlbench_runner" / "runner.py"
    assert args["FRAMEWORK_VERSION"] == "0.23.2-5" and labels["org.dlbench.framework"] == "sklearn"


def test_a_framework_that_names_a_debian_suite_is_built_on_that_suite_s_base(monkeypatch, tmp_path):
    """``suite`` in models.json: its image's base is that suite's (made, like a tool's, when
    first wanted) and its label says so; without it, the study's suite."""
    copy_example(tmp_path / "newer", "newer", suite="trixie")
    with_path(monkeypatch, EXAMPLES, tmp_path / "newer")
    assert (catalog.suite("newer"), catalog.suite("sklearn"), catalog.suite("web")) == \
        ("trixie", catalog.SUITE, "trixie")

    class Builder(build.Builder):
        def base(self, rebuild=False, suite=None):
            asked.append(suite)
            return types.SimpleNamespace(id=f"sha256:{suite}")

        def _build(self, tag, files, buildargs, labels, rebuild, sources=()):
            return buildargs, labels

    asked = []
    args, labels = Builder(client=None).framework("newer")
    assert asked == ["trixie"] and args["BASE_IMAGE"] == "sha256:trixie"
    assert labels["org.dlbench.debian-suite"] == "trixie"
    args, labels = Builder(client=None).framework("sklearn")
    assert asked[-1] == catalog.SUITE == labels["org.dlbench.debian-suite"]


def test_an_entry_point_of_an_installed_package_adds_a_framework(monkeypatch, tmp_path):
    """A package installed with an entry point in the group: its own folder is the framework's
    directory (``sklearn = package``) or a folder inside it (``package:folder``)."""
    site = tmp_path / "site"
    copy_example(site / "dlbench_mlp")
    (site / "dlbench_mlp" / "__init__.py").write_text("")
    copy_example(site / "dlbench_more" / "frameworks" / "other", "other")
    (site / "dlbench_more" / "__init__.py").write_text("")
    for dist, entries in (("dlbench_mlp", "sklearn = dlbench_mlp"),
                          ("dlbench_more", "other = dlbench_more:frameworks.other")):
        info = site / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[{catalog.ENTRY_POINTS}]\n{entries}\n")
    monkeypatch.delenv(catalog.PATH_VARIABLE, raising=False)
    monkeypatch.syspath_prepend(str(site))
    found = catalog.frameworks()
    assert list(found) == [*catalog.BUILT_IN, "other", "sklearn"]
    assert found["sklearn"].directory == site / "dlbench_mlp"
    assert found["other"].directory == site / "dlbench_more" / "frameworks" / "other"
    # as a user's dlbench finds it
    plan = dlbench("run", "--frameworks", "sklearn,other", "--datasets", "mnist", "--profile", "quick",
                   "--dry-run", "--format", "json", env={**NO_DOCKER, "PYTHONPATH": str(site)}, check=True)
    assert [json.loads(line)["framework"] for line in plan.stdout.splitlines()[:2]] == ["sklearn", "other"]
    # the same name from the path too: a clash naming both
    with_path(monkeypatch, SKLEARN)
    with pytest.raises(FrameworkError) as caught:
        catalog.frameworks()
    assert str(caught.value) == (
        f"framework 'sklearn' is found twice: {site / 'dlbench_mlp'} (entry point sklearn = "
        f"dlbench_mlp) and {SKLEARN} ({catalog.PATH_VARIABLE} entry {SKLEARN})")


# -- what is not a framework: one line naming the path ----------------------------------------

def test_a_name_found_twice_is_a_clash_naming_both_directories(tmp_path):
    shutil.copytree(REPO / "images" / "caffe", tmp_path / "caffe")
    proc = dlbench("run", "--frameworks", "caffe", "--dry-run",
                   env={**NO_DOCKER, catalog.PATH_VARIABLE: str(tmp_path)})
    one_line_error(proc, 1, f"framework 'caffe' is found twice: {REPO / 'images' / 'caffe'} (entry point "
                            f"caffe = dlbench_images:caffe) and {tmp_path / 'caffe'} "
                            f"({catalog.PATH_VARIABLE} entry {tmp_path})")
    copy_example(tmp_path / "two" / "a")
    copy_example(tmp_path / "two" / "b")
    proc = dlbench("run", "--dry-run", env={**NO_DOCKER, catalog.PATH_VARIABLE: str(tmp_path / "two")})
    one_line_error(proc, 1, f"framework 'sklearn' is found twice: {tmp_path / 'two' / 'a'}",
                   f"and {tmp_path / 'two' / 'b'}")


@pytest.mark.parametrize("missing", ["Dockerfile", "adapter.py", "models.json"])
def test_a_directory_without_one_of_its_files_is_refused(monkeypatch, tmp_path, missing):
    (copy_example(tmp_path / "frameworks" / "mlp") / missing).unlink()
    with_path(monkeypatch, tmp_path / "frameworks")
    with pytest.raises(FrameworkError) as caught:
        catalog.names()
    assert str(caught.value) == (f"{tmp_path / 'frameworks' / 'mlp'}: not a framework directory, "
                                 f"{missing} is missing ({catalog.PATH_VARIABLE} entry "
                                 f"{tmp_path / 'frameworks'})")


def test_a_path_entry_that_is_not_a_directory_is_refused(tmp_path):
    proc = dlbench("run", "--dry-run", env={**NO_DOCKER, catalog.PATH_VARIABLE: str(tmp_path / "nowhere")})
    one_line_error(proc, 1, f"{tmp_path / 'nowhere'}: no such directory ({catalog.PATH_VARIABLE})")


def model(**changes):
    entry = json.loads((SKLEARN / "models.json").read_text())["models"]["mnist"]
    for key, value in changes.items():
        if value is None:
            entry.pop(key)
        else:
            entry[key] = value
    return {"mnist": entry}


@pytest.mark.parametrize("changes, problem", [
    ({"framework": "Sk-Learn"}, "framework 'Sk-Learn': a name is a lower-case letter, then up to 39 "
                                "lower-case letters, digits or underscores"),
    ({"framework": "base"}, "framework 'base': the name is taken (base, root, runner, deploy, web are dlbench's own)"),
    ({"version": None}, "version: give the framework's version as a string"),
    ({"variants": []}, "variants: must be a JSON object"),
    ({"native": {"module": 1}}, "native: module and unsupported are strings"),
    ({"run_by_default": "no"}, "run_by_default: true or false (false: its jobs run only when it is named)"),
    ({"suite": "Trixie/../x"}, "suite: the Debian suite its images are built on, e.g. trixie (default: bullseye)"),
    ({"models": {}}, "models: give at least one data set's model"),
    ({"models": {"imagenet": {}}}, "models.imagenet: unknown data set (choose from mnist, cifar10)"),
    ({"models": model(model=None)}, "models.mnist: model: give the model's name as a string"),
    ({"models": model(hyperparameters={"epochs": 1})},
     "models.mnist: hyperparameters: a JSON object with batch_size at least"),
    ({"models": model(profiles={"fast": {}})},
     "models.mnist: profiles: unknown profile 'fast' (choose from paper, quick)"),
    ({"models": model(settings=None)},
     "models.mnist: settings: a JSON object of length, learning_rate and train_images"),
    ({"models": model(settings={"length": ["steps"], "learning_rate": ["learning_rate"], "train_images": 1})},
     "models.mnist: settings.length: a list of the hyper-parameters that hold it"),
    ({"models": model(settings={"length": ["epochs"], "learning_rate": ["learning_rate"]})},
     "models.mnist: settings.train_images: the number of images a pass over the training set takes"),
    ({"models": model(profiles={"quick": {"learning_rate": -1.0}})},
     "models.mnist: the quick profile (cpu): hyper-parameter 'learning_rate' must be more than 0, not -1.0"),
])
def test_a_models_json_that_breaks_the_contract_is_refused(monkeypatch, tmp_path, changes, problem):
    copy_example(tmp_path / "mlp", **changes)
    with_path(monkeypatch, tmp_path / "mlp")
    with pytest.raises(FrameworkError) as caught:
        catalog.names()
    assert str(caught.value) == f"{tmp_path / 'mlp' / 'models.json'}: {problem}"


def test_a_models_json_that_is_not_json_is_one_line_on_the_command_line(tmp_path):
    copy_example(tmp_path / "mlp")
    (tmp_path / "mlp" / "models.json").write_text('{"framework": "sklearn",')
    proc = dlbench("run", "--dry-run", env={**NO_DOCKER, catalog.PATH_VARIABLE: str(tmp_path)})
    one_line_error(proc, 1, f"{tmp_path / 'mlp' / 'models.json'}: not valid JSON: Expecting")
