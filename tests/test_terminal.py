"""`dlbench results` and `dlbench report` in a real 80-column terminal (a tmux pane): every
line fits, no number is cut, and the numbers shown are the stored ones, rounded as
docs/reports.md says (times 2 decimals in results, a median of 100 s or more 1 decimal in
the report; accuracy in percent, 2 decimals)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO
from orchestrator import store

TORCH7 = REPO / "docs" / "measurements" / "2026-11-25-torch7-test-pass"
WIDTH = 80

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (scripts/setup --dev installs it)")


def pane(*args: str) -> list[str]:
    """The lines a command leaves in a fresh 80-column tmux pane, wrapped lines joined."""
    session = f"dlbench-test-{time.monotonic_ns()}"
    command = " ".join([sys.executable, "-m", "orchestrator", *args]) + "; echo '<done>'; sleep 60"
    subprocess.run(["tmux", "-f", "/dev/null", "new-session", "-d", "-s", session, "-x", str(WIDTH),
                    "-y", "50", "-e", "COLUMNS=", "-e", "LINES=", command], check=True, cwd=REPO)
    try:
        subprocess.run(["tmux", "set-option", "-t", session, "history-limit", "10000"], check=True)
        for _ in range(1200):
            text = subprocess.run(["tmux", "capture-pane", "-p", "-J", "-S", "-", "-t", session],
                                  capture_output=True, text=True, check=True).stdout
            if "<done>" in text:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"dlbench {' '.join(args)} did not finish in the pane:\n{text}")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
    lines = text.splitlines()
    return [line.rstrip() for line in lines[:lines.index("<done>")]]


def fits(lines: list[str]) -> None:
    too_long = [line for line in lines if len(line) > WIDTH]
    assert not too_long, "\n".join(too_long)
    assert not any("…" in line for line in lines), "\n".join(lines)


def test_results_fit_80_columns_with_the_stored_numbers():
    lines = pane("results", "--results", str(TORCH7))
    fits(lines)
    head = next(i for i, line in enumerate(lines) if line.startswith("framework"))
    columns = re.split(r"\s{2,}", lines[head].strip())
    assert columns[:3] == ["framework", "data", "profile"]
    assert "train s" in " ".join(lines[head - 1:head + 1]) or "train" in columns
    shown = [line.split() for line in lines[head + 2:] if line.startswith("torch")]
    frame = store.load(TORCH7).sort_values("recorded_at")
    assert len(shown) == len(frame) == 2
    for cells, row in zip(shown, frame.itertuples()):
        assert f"{100 * row.accuracy:.2f}" in cells          # accuracy in percent
        assert f"{row.train_time_s:.2f}" in cells
        assert f"{row.test_time_s:.2f}" in cells
    assert any(line.startswith("left out to fit 80 columns:") for line in lines)


def test_report_fits_80_columns_with_the_stored_numbers():
    lines = pane("report", "--results", str(TORCH7))
    fits(lines)
    text = "\n".join(lines)
    frame = store.load(TORCH7)
    for row in frame.itertuples():            # one run a group: the median is the run's value
        assert re.search(rf"\b{row.train_time_s:.1f}\b", text)
        assert re.search(rf"\b{100 * row.accuracy:.2f}\b", text)
        assert f"load {row.host_load_avg:.2f} at start" in text
    assert "Disturbed runs" in text and "left out to fit 80 columns" in text


def test_wide_and_chosen_columns():
    wide = pane("results", "--results", str(TORCH7), "--wide")
    assert max(len(line) for line in wide) > WIDTH and "left out" not in "\n".join(wide)
    chosen = pane("results", "--results", str(TORCH7), "--columns", "run_id,train_time_s,host_load_avg")
    fits(chosen)
    assert re.split(r"\s{2,}", next(l for l in chosen if l.startswith("run")).strip()) == [
        "run", "train s", "load"]
