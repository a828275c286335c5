"""Shared fixtures: the real data sets, a results directory, the CLI as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def shared_datasets() -> Path:
    """The real MNIST and CIFAR-10, in the canonical layout (never downloaded by tests)."""
    path = Path(os.environ.get("DLBENCH_TEST_DATA_DIR", REPO.parent / "shared" / "datasets"))
    if not (path / "mnist").is_dir():
        pytest.fail(f"test data sets not found at {path}; set DLBENCH_TEST_DATA_DIR")
    return path


@pytest.fixture(scope="session")
def data_root() -> Path:
    return shared_datasets()


def shared_sources() -> Path:
    """The pinned source archives' local mirror (tests never fetch from GitHub)."""
    path = Path(os.environ.get("DLBENCH_TEST_SOURCES_DIR", REPO.parent / "shared" / "sources"))
    if not (path / "torch7").is_dir():
        pytest.fail(f"source archives not found at {path}; set DLBENCH_TEST_SOURCES_DIR")
    return path


@pytest.fixture(scope="session")
def sources_root() -> Path:
    return shared_sources()


def dlbench(*args, env=None, check=False, timeout=1800) -> subprocess.CompletedProcess:
    """Run the installed CLI in a subprocess, as a user would."""
    full_env = dict(os.environ)
    full_env.pop("DLBENCH_DATA_DIR", None)
    full_env.pop("DLBENCH_RESULTS_DIR", None)
    full_env.pop("DLBENCH_SOURCES_DIR", None)
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "orchestrator", *map(str, args)],
                          capture_output=True, text=True, env=full_env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"dlbench {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc
