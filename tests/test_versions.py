"""A framework's releases as an axis (``--versions``): one image each, the same jobs in
each, the release in every row; and ``compare --by framework_version`` across them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from orchestrator import campaign, catalog, options
from orchestrator.errors import UsageError
from orchestrator.options import Axes
from orchestrator.plan import expand


def _plan(**given):
    return expand(Axes(frameworks=["tensorflow"], datasets=["mnist"], profiles=["quick"], **given), 2)


def test_each_release_is_a_job_of_its_own_in_an_image_of_its_own():
    table = options.RunOptions.from_command_line(versions=["tensorflow=2.15,2.20"]).versions
    assert table == {"tensorflow": ("2.15.1", None)}         # the default release is the plain image
    older, default = _plan(versions=table).jobs
    assert (older.version, older.variant, older.images) == ("2.15.1", "cpu-2.15.1",
                                                             [("tensorflow", "cpu-2.15.1")])
    assert (default.version, default.variant) == (None, "cpu")
    # the default release's job keeps the id it has without the axis; the other's differs
    plain, = _plan().jobs
    assert default.job_id("i", "d") == plain.job_id("i", "d") != older.job_id("i", "d")
    info = catalog.variant_info("tensorflow", "cpu-2.15.1")
    assert info["version"] == "2.15.1" and info["build_args"] == {"REQUIREMENTS": "requirements-2.15.1.txt"}
    assert (catalog.framework_dir("tensorflow") / info["build_args"]["REQUIREMENTS"]).is_file()
    assert catalog.dockerfile("tensorflow", "cpu-2.15.1") == catalog.dockerfile("tensorflow", "cpu")


def test_a_release_on_another_debian_suite_is_built_on_that_suite_s_base():
    """pytorch2's 2.14.1 is Debian sid's python3-torch: its image's base is sid's, its
    Debian package version the build argument, its tag the release (no ``+`` in a tag)."""
    import types

    from orchestrator import build

    table = options.RunOptions.from_command_line(versions=["pytorch2=2.6,2.14"]).versions
    assert table == {"pytorch2": (None, "2.14.1")}
    assert (catalog.suite("pytorch2", "cpu-2.14.1"), catalog.suite("pytorch2")) == ("sid", "trixie")
    asked = []

    class Builder(build.Builder):
        def base(self, rebuild=False, suite=None):
            asked.append(suite)
            return types.SimpleNamespace(id=f"sha256:{suite}")

        def _build(self, tag, files, args, labels, rebuild, pinned=()):
            return tag, args, labels

    builder = Builder.__new__(Builder)
    builder.suite = build.SUITE
    tag, args, labels = builder.framework("pytorch2", variant="cpu-2.14.1")
    assert asked == ["sid"] and tag == "dlbench/pytorch2:cpu-2.14.1"
    assert args["FRAMEWORK_VERSION"] == "2.14.1+dfsg-1" and args["BASE_IMAGE"] == "sha256:sid"
    assert labels["org.dlbench.debian-suite"] == "sid"
    assert "sid" in build.ROLLING_SUITES and "trixie" not in build.ROLLING_SUITES


def test_a_campaign_file_gives_releases_as_a_table(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('name = "r"\nframeworks = ["tensorflow"]\ndatasets = ["mnist"]\nprofiles = ["quick"]\n'
                    'versions = {tensorflow = ["2.15.1", "2.20.0"]}\n')
    jobs = campaign.read(path, options.RunOptions(), host_cpus=2).plan.jobs
    assert [j.version for j in jobs] == ["2.15.1", None]


@pytest.mark.parametrize("given, message", [
    (["tensorflow=2.14"], r"--versions: tensorflow has no image of release '2.14' \(releases: 2.20.0, 2.15.1"),
    (["tensorflow"], r"--versions: 'tensorflow': give FRAMEWORK=RELEASE"),
    (["tensorflw=2.15"], r"--versions: unknown framework 'tensorflw' \(did you mean tensorflow\?"),
    (["tensorflow=2.15", "tensorflow=2.20"], r"--versions: tensorflow's releases are given twice"),
    (["tensorflow=,"], r"--versions: tensorflow: give its releases")])
def test_a_bad_release_is_a_one_line_usage_error(given, message):
    with pytest.raises(UsageError, match=message):
        options.RunOptions.from_command_line(versions=given)


def test_releases_of_a_framework_the_run_leaves_out_are_refused():
    with pytest.raises(UsageError, match=r"releases of tensorflow are given, but it is not one of the "
                                         r"run's frameworks \(caffe\)"):
        expand(Axes(frameworks=["caffe"], datasets=["mnist"], profiles=["quick"],
                    versions={"tensorflow": ("2.15.1",)}), 2)


def test_a_release_has_a_cpu_image_only_and_the_native_runtime_runs_none():
    gpu, = _plan(versions={"tensorflow": ("2.15.1",)}, devices=[0]).jobs
    assert gpu.variant == "gpu-2.15.1" and gpu.unsupported == "tensorflow 2.15.1 has a CPU image only"
    from orchestrator.runtimes.native import NativeRuntime
    target = NativeRuntime(sys.executable).target("tensorflow", "cpu-2.15.1")
    assert target.reason is not None and "--runtime docker" in target.reason


# framework: (its two releases as given, a setting that shortens the quick MNIST job, and
# each release's framework_version: (image, Python))
TWO_RELEASES = {
    # TensorFlow 2.15.1 (Keras 2) beside the default 2.20.0 (Keras 3), both on bullseye's Python
    "tensorflow": (("2.15", "2.20"), "max_steps=100", {"2.15.1": ("dlbench/tensorflow:cpu-2.15.1", "3.9"),
                                                       "2.20.0": ("dlbench/tensorflow:cpu", "3.9")}),
    # PyTorch 2.6 (Debian trixie) beside 2.14 (sid): two suites, two Pythons
    "pytorch2": (("2.6", "2.14"), "train_subset=2000", {"2.6.0+debian": ("dlbench/pytorch2:cpu", "3.13"),
                                                        "2.14.1+debian": ("dlbench/pytorch2:cpu-2.14.1", "3.14")}),
}


# pytorch2's second release builds Debian sid's root and base and its PyTorch (about 8 minutes
# on 2 cores, 340 MB fetched): with DLBENCH_SUITE_IMAGES=1 only, as the GPU images are built
# (CI holds TensorFlow's, a release on the study's suite; the plan test above holds sid's base)
SUITE_IMAGES = os.environ.get("DLBENCH_SUITE_IMAGES") == "1"


@pytest.mark.docker
@pytest.mark.training
@pytest.mark.parametrize("framework", [
    "tensorflow",
    pytest.param("pytorch2", marks=pytest.mark.skipif(
        not SUITE_IMAGES, reason="builds Debian sid's root and PyTorch: DLBENCH_SUITE_IMAGES=1"))])
def test_two_releases_train_in_their_own_images_and_compare_pairs_them(framework, data_root, tmp_path):
    """The same quick MNIST job in each release's image, the same adapter, every check after
    training done in both, the release in the row; ``compare --by framework_version`` pairs the
    two groups (one run a side: too few to judge) and the report keeps them apart."""
    from conftest import dlbench
    import pandas as pd

    (older, newer), shorter, expected = TWO_RELEASES[framework]
    dlbench("run", "--frameworks", framework, "--datasets", "mnist", "--profile", "quick",
            "--versions", f"{framework}={older},{newer}", "--set", shorter, "--set", "robust_images=20",
            "--results", tmp_path, "--data-dir", data_root, check=True)
    rows = pd.read_parquet(tmp_path / "runs").set_index("framework_version")
    assert sorted(rows.index) == sorted(expected)
    for release, (image, python) in expected.items():
        row = rows.loc[release]
        assert row.status == "ok", (release, row.error)
        assert (row.image, row.python_version.rsplit(".", 1)[0]) == (image, python)
        assert row.accuracy > 0.8, (release, row.accuracy)
        assert row.migration_mismatches == 0 and row.robustness_time_s > 0
    assert rows["job_id"].nunique() == 2
    shown = dlbench("compare", older, newer, "--by", "framework_version", "--results", tmp_path,
                    "--format", "json", check=True).stdout
    pair, = json.loads(shown)["groups"]
    assert (pair["verdict"], pair["a_framework_version"], pair["b_framework_version"]) == (
        "too few runs", *expected)
    # the report keeps the releases apart: a group each, the release in its settings
    document = json.loads(dlbench("report", "--results", tmp_path, "--format", "json", check=True).stdout)
    labels = sorted(g["settings"] for g in document["groups"])
    assert [label.rpartition("; release ")[2] for label in labels] == sorted(expected)


def test_the_report_keeps_two_releases_apart_and_one_release_as_before(tmp_path):
    """The committed rows of TensorFlow 2.15.1 and 2.20.0 (five runs each, both data sets):
    four groups, each of one release; the default release's held against the reference rows,
    the other not (another release); the 2.20.0 rows alone keep their plain labels."""
    from conftest import dlbench

    measured = Path(__file__).parents[1] / "docs" / "measurements" / "2026-12-04-tensorflow-releases"
    document = json.loads(dlbench("report", "--results", measured, "--format", "json", check=True).stdout)
    groups = {(g["dataset"], g["settings"]): g for g in document["groups"]}
    assert sorted(groups) == [(d, f"own defaults; release {r}") for d in ("cifar10", "mnist")
                              for r in ("2.15.1", "2.20.0")]
    assert all(g["ok"] == 5 and g["framework_versions"] == [s.split()[-1]]
               for (_, s), g in groups.items())
    label = {g["group"]: (g["dataset"], g["settings"]) for g in document["groups"]}
    verdicts = {label[r["group"]]: r["reference_verdict"] for r in document["reference_rows"]["groups"]}
    assert verdicts[("mnist", "own defaults; release 2.15.1")] == (
        "not comparable: 2.15.1 here, 2.20.0 in the reference rows")
    assert verdicts[("mnist", "own defaults; release 2.20.0")] == "trains as expected"
    import pandas as pd
    (tmp_path / "runs").mkdir()
    rows = pd.read_parquet(measured / "runs")
    rows[rows["framework_version"] == "2.20.0"].to_parquet(tmp_path / "runs" / "only.parquet")
    document = json.loads(dlbench("report", "--results", tmp_path, "--format", "json", check=True).stdout)
    assert sorted(g["settings"] for g in document["groups"]) == ["own defaults"] * 2

