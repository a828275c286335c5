"""The after-training stage (orchestrator/checks): a check is one module and one name in the
list, its columns reach the stored row; and the rows the stage makes are those made before
it, column by column."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, native_framework
from orchestrator import checks, schema

# A quick row of each framework, stored by the dlbench before the checks were one stage
BEFORE = REPO / "docs" / "measurements" / "2026-11-29-first-run" / "runs"

TOY = '''"""A toy check: what the job's result says it saw, and whether the job left its result."""

from .base import Check, Found


class ToyCheck(Check):
    name = "toy"
    row_fields = {"toy_images_seen": (int | None, None), "toy_result_left": (bool | None, None)}

    def take(self, after, stop, before):
        return (after.job_dir / "out" / "result.json").is_file()

    def found(self, after, result, taken):
        return Found({"toy_images_seen": result.train_samples + result.test_samples,
                      "toy_result_left": taken})


CHECK = ToyCheck()
'''


def test_every_check_declares_its_columns_and_the_row_holds_them_in_its_order():
    fields = list(schema.COLUMNS)
    declared = list(checks.row_fields())
    assert declared and fields[fields.index(declared[0]):][:len(declared)] == declared
    assert [check.name for check in checks.CHECKS] == list(checks.NAMES)


@pytest.fixture()
def softmax(tmp_path) -> Path:
    """The test adapter (a numpy softmax regression) as a framework run natively."""
    return native_framework(tmp_path / "frameworks" / "softmax", "softmax").parent


def test_a_check_added_as_one_module_and_one_line_reaches_the_stored_row(softmax, data_root, tmp_path):
    house = tmp_path / "house"
    shutil.copytree(REPO / "orchestrator", house / "orchestrator",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (house / "orchestrator" / "checks" / "toy.py").write_text(TOY)
    listing = house / "orchestrator" / "checks" / "__init__.py"
    text = listing.read_text()
    assert text.count('    "fair",\n') == 1
    listing.write_text(text.replace('    "fair",\n', '    "fair",\n    "toy",\n'))       # the one line
    results = tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(house), os.environ.get("PYTHONPATH", "")]),
           "DLBENCH_FRAMEWORKS_PATH": str(softmax), "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    # run from the house (``python -m`` looks in the working directory first)
    run = subprocess.run([sys.executable, "-m", "orchestrator", "run", "--runtime", "native", "--python",
                          sys.executable, "--frameworks", "softmax", "--datasets", "mnist", "--profile",
                          "quick", "--cpus", "1", "--set", "robust_images=0", "--results", str(results),
                          "--data-dir", str(data_root)], cwd=house, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    row, = pd.read_parquet(results / "runs").itertuples()
    assert row.status == "ok"
    assert row.toy_images_seen == row.train_samples + row.test_samples > 0
    assert row.toy_result_left is True or row.toy_result_left == True  # noqa: E712 (numpy's bool)
    # the other checks still did their part
    assert pd.isna(row.migration_reason) and row.migration_mismatches == 0


@pytest.mark.docker
def test_a_quick_row_has_the_columns_and_the_filled_fields_of_one_stored_before(quick_run):
    """A quick PyTorch MNIST row of today beside the one stored by the dlbench before the
    checks were one stage: the same columns of the same types (but for the columns the
    schema's later versions added, schema.ADDED_IN), the job's definition and its counts the same, and every
    field that was filled then filled now (measurements differ, their presence does not)."""
    old = pd.read_parquet(BEFORE)
    old = old[(old.framework == "pytorch") & (old.dataset == "mnist")]
    new = pd.read_parquet(quick_run("pytorch", "mnist") / "runs")
    assert len(old) == len(new) == 1
    added = set(new.columns) - set(old.columns)
    since = {c for version, cs in schema.ADDED_IN.items() if version > int(old.schema_version.iloc[0])
             for c in cs}
    assert since and set(old.columns) <= set(new.columns) and added == since, added ^ since
    for column in old.columns:
        assert old[column].dtype == new[column].dtype, column
    old, new = old.iloc[0], new.iloc[0]
    for field in ("status", "framework", "dataset", "model", "profile", "hyperparameters", "settings_from",
                  "blas", "onednn", "batch_size", "learning_rate", "device", "gpu", "seed", "repeat",
                  "param_count", "param_bytes", "train_samples", "test_samples", "migration_reason",
                  "migration_mismatches", "transfer_reason", "fair_weights_sha256", "runtime",
                  "framework_version", "blas_loaded"):
        assert (not filled(old[field]) and not filled(new[field])) or old[field] == new[field], field
    # where a machine's facts are (its GPU, cpufreq, turbo, isolated CPUs, a Slurm node) is
    # the machine's; every other field filled then is filled now, and the other way round
    machine = {"gpu_name", "gpu_driver", "gpu_memory_total_bytes", "host_cpu_governor", "host_turbo",
               "host_isolated_cpus", "node", "slurm_job_id", "slurm_array_task_id", "memory_peak_bytes",
               "memory_peak_cgroup_bytes", "other_cpu_s", "other_cpu_share", "builds_alongside"}
    for field in sorted(set(old.index) - machine):
        assert filled(old[field]) == filled(new[field]), field


def filled(value) -> bool:
    """A stored value is there: not None, NaN, NA or NaT (a list is, even empty)."""
    try:
        return not bool(pd.isna(value))
    except (TypeError, ValueError):     # an array's isna is an array
        return True
