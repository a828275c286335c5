"""scripts/setup installs what ``dlbench run`` needs and nothing more; ``--dev`` adds the
tools of the tests and the docs.  The script runs for real, in a copy of the repository's
layout, against stand-ins for the system's tools that record what they were asked
(apt-get, sudo, docker, python3, and the virtual environment's Python)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import REPO

RECORDER = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
"""


@pytest.fixture
def setup(tmp_path):
    """Run scripts/setup with these arguments; returns (exit status, stderr, what it asked)."""
    root, bin_, log = tmp_path / "repo", tmp_path / "bin", tmp_path / "asked.log"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup", root / "scripts" / "setup")
    bin_.mkdir()
    for tool in ("apt-get", "sudo", "docker", "python3", "id"):
        (bin_ / tool).write_text(RECORDER.format(log=log)
                                 + ('echo 1000\n' if tool == "id" else "exit 0\n"))
    for tool in ("bash", "sed", "dirname", "basename"):       # the few real ones it uses
        os.symlink(shutil.which(tool), bin_ / tool)
    (root / ".venv" / "bin").mkdir(parents=True)
    venv_python = root / ".venv" / "bin" / "python"
    venv_python.write_text(RECORDER.format(log=log).replace("$(basename \"$0\")", "venv-python"))
    for path in list(bin_.iterdir()) + [venv_python]:
        path.chmod(0o755)

    def run(*args):
        proc = subprocess.run([str(bin_ / "bash"), str(root / "scripts" / "setup"), *args],
                              capture_output=True, text=True, timeout=60,
                              env={"PATH": str(bin_), "HOME": str(tmp_path)})
        asked = log.read_text() if log.exists() else ""
        log.unlink(missing_ok=True)
        return proc.returncode, proc.stderr, asked
    return run


def test_setup_installs_no_browser_and_no_test_or_docs_tool(setup):
    code, stderr, asked = setup()
    assert code == 0, stderr
    installs = [line for line in asked.splitlines() if " install " in line]
    assert not any(tool in line for line in installs
                   for tool in ("chromium", "tmux", "[test", "docs]", "pytest", "selenium"))
    assert "venv-python -m pip install -q -e ." in asked.splitlines()


def test_setup_dev_adds_the_tools_of_the_tests_and_the_docs(setup):
    code, stderr, asked = setup("--dev")
    assert code == 0, stderr
    apt = " ".join(line for line in asked.splitlines() if line.startswith("sudo apt-get install"))
    for package in ("tmux", "chromium", "chromium-driver"):
        assert f" {package}" in apt, asked
    assert "venv-python -m pip install -q -e .[test,docs]" in asked.splitlines()


def test_setup_refuses_an_unknown_option_in_one_line(setup):
    code, stderr, asked = setup("--everything")
    assert code == 2 and stderr == "setup: unknown option --everything (give --dev or nothing)\n"
    assert asked == ""
