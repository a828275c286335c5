"""The worked example of docs/frameworks/adding.md, end to end: scikit-learn's MLPClassifier,
a framework directory outside dlbench (examples/frameworks/sklearn), found through
DLBENCH_FRAMEWORKS_PATH, built on the base image and trained on the real MNIST by `dlbench run`;
`dlbench results` and `dlbench report` show it, with no paper number to hold it against."""

from __future__ import annotations

import json
import sys

import docker
import pandas as pd
import pytest

from conftest import REPO, dlbench
from orchestrator.cache import root as cache_root

EXAMPLES = REPO / "examples" / "frameworks"
ADDED = {"DLBENCH_FRAMEWORKS_PATH": str(EXAMPLES)}
TAG = "dlbench/sklearn:cpu"


def quick_run(results, data_root, *options):
    return dlbench("run", "--frameworks", "sklearn", "--datasets", "mnist", "--profile", "quick",
                   "--results", results, "--data-dir", data_root, *options, env=ADDED, check=True)


@pytest.fixture(scope="module")
def image():
    """The example's image, removed afterwards if this test built it (a user's is kept)."""
    client = docker.from_env()
    before = {image.id for image in client.images.list(TAG)}
    yield
    for image in client.images.list(TAG):
        if image.id not in before:
            client.images.remove(image.id, force=True)


@pytest.mark.docker
def test_the_example_framework_is_built_and_trained_by_dlbench_run(image, data_root, tmp_path):
    results = tmp_path / "results"
    built = not docker.from_env().images.list(TAG)
    run = quick_run(results, data_root)
    if built:       # its packages came through the download cache, and stay there
        assert "download cache: " in run.stderr, run.stderr
        assert list((cache_root() / "downloads" / "deb.debian.org").rglob("python3-sklearn_*.deb"))
    row, = pd.read_parquet(results / "runs").itertuples()
    assert (row.framework, row.dataset, row.profile, row.status) == ("sklearn", "mnist", "quick", "ok")
    assert row.accuracy > 0.8                   # chance is 0.1; one epoch on 10,000 images
    assert row.model == "sklearn-mlp-100" and row.param_count == 784 * 100 + 100 + 100 * 10 + 10
    assert row.train_samples == 10000 and row.test_samples == 10000 and len(row.epoch_loss) == 1
    assert row.image == TAG and row.framework_version == "0.23.2" and "openblas" in row.blas_loaded
    assert row.runtime == "docker"

    shown = json.loads(dlbench("results", "--results", results, "--format", "json", check=True).stdout)
    assert [(r["framework"], r["status"]) for r in shown] == [("sklearn", "ok")]
    report = json.loads(dlbench("report", "--results", results, "--format", "json", env=ADDED,
                                check=True).stdout)
    group, = report["groups"]
    assert group["framework"] == "sklearn" and group["published_accuracy_pct"] is None
    assert group["accuracy_verdict"] == group["ratio_verdict"] == "not comparable: sklearn is not in the paper"
    page = dlbench("report", "--results", results, "--html", tmp_path / "page", env=ADDED, check=True)
    assert "sklearn" in (tmp_path / "page" / "index.html").read_text(), page.stdout


@pytest.mark.training
def test_the_example_framework_runs_natively(data_root, tmp_path):
    """The same directory's adapter in this Python, where scikit-learn is installed."""
    results = tmp_path / "results"
    quick_run(results, data_root, "--runtime", "native", "--python", sys.executable)
    row, = pd.read_parquet(results / "runs").itertuples()
    assert (row.framework, row.runtime, row.status) == ("sklearn", "native", "ok"), row.error
    assert row.accuracy > 0.8 and row.image == f"native:{sys.executable}"
