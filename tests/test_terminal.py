"""Every command's text at 80 columns.

`report`, `results`, `compare` (a folder against itself), `doctor` and `run --dry-run` as a
terminal COLUMNS=80 wide shows them, for every results folder under docs/measurements/: no
line wider than 80, no word split across two lines (a line that ends in letters whose last
word, joined to the next line's first, is a word of the same text drawn 400 columns wide).

`dlbench results` and `dlbench report` in a real 80-column terminal (a tmux pane) too: every
line fits, no number is cut, and the numbers shown are the stored ones, rounded as
docs/reports.md says (times 2 decimals in results, a median of 100 s or more 1 decimal in
the report; accuracy in percent, 2 decimals)."""

from __future__ import annotations

import contextlib
import importlib
import io
import pkgutil
import re
import shutil
import subprocess
import sys
import time

import pytest
import typer
from rich.console import Console

from conftest import REPO
from orchestrator import cli, store
from orchestrator.errors import DlbenchError
from orchestrator.report import paper, summary

MEASUREMENTS = REPO / "docs" / "measurements"
FOLDERS = sorted(path.parent for path in MEASUREMENTS.rglob("runs") if path.is_dir())
TORCH7 = MEASUREMENTS / "2026-11-25-torch7-test-pass"
WIDTH = 80
WIDE = 400

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (scripts/setup --dev installs it)")


CLI_MODULES = [cli] + [importlib.import_module(f"{cli.__name__}.{found.name}")
                      for found in pkgutil.iter_modules(cli.__path__)]


@pytest.fixture
def terminal(monkeypatch, tmp_path):
    """``terminal(columns, *args)``: what `dlbench ARGS` prints, stdout and stderr, in a
    terminal COLUMNS wide, and its exit status (the CLI's own consoles, made as a terminal
    of that width; no data sets, so no fair reference training is computed)."""
    monkeypatch.setenv("DLBENCH_DATA_DIR", str(tmp_path / "no-data"))

    def run(columns: int, *args) -> tuple[str, int]:
        monkeypatch.setenv("COLUMNS", str(columns))
        monkeypatch.delenv("LINES", raising=False)
        buffer = io.StringIO()
        console = Console(file=buffer, force_terminal=True, color_system=None, soft_wrap=True)
        assert console.width == columns
        for module in CLI_MODULES:      # each command module holds the consoles it prints to
            for name in ("out", "err"):
                if hasattr(module, name):
                    monkeypatch.setattr(module, name, console)
        code = 0
        with contextlib.redirect_stdout(buffer):
            try:
                cli.app([str(a) for a in args], standalone_mode=False)
            except typer.Exit as exc:
                code = exc.exit_code
            except DlbenchError as exc:
                console.print(f"dlbench: error: {exc}", markup=False, soft_wrap=True)
                code = exc.exit_code
        return buffer.getvalue(), code
    return run


def split_words(lines: list[str], wide: str) -> list[str]:
    """The places where a word is split across two lines: a line ending in letters whose
    last word joined to the next line's first word is a word of the ``wide`` text, where
    the two parts are not both words of it themselves."""
    words = set(wide.split())
    found = []
    for line, after in zip(lines, lines[1:]):
        if not re.search(r"[A-Za-z]$", line) or not after.split():
            continue
        last, first = line.split()[-1], after.split()[0]
        if last + first in words and not (last in words and first in words):
            found.append(f"{line!r} / {after!r}")
    return found


def test_a_word_split_across_lines_is_found():
    wide = "speed: --frameworks caffe --datasets mnist into the image; goes in to it"
    assert split_words(["--frameworks caffe --datasets mn", "ist"], wide) == [
        "'--frameworks caffe --datasets mn' / 'ist'"]
    assert split_words(["caffe --datasets", "mnist"], wide) == []       # between words
    assert split_words(["goes in", "to the image"], wide) == []         # two words of their own


def fits_80(terminal, *args) -> list[str]:
    """`dlbench ARGS` at 80 columns: no line wider, no word split; its lines."""
    text, _ = terminal(WIDTH, *args)
    lines = [line.rstrip() for line in text.splitlines()]
    too_wide = [line for line in lines if len(line) > WIDTH]
    assert not too_wide, "\n".join(too_wide)
    wide, _ = terminal(WIDE, *args)
    split = split_words(lines, wide)
    assert not split, "\n".join(split)
    return lines


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda path: str(path.relative_to(MEASUREMENTS)))
def test_every_measurement_folder_fits_80_columns(terminal, folder):
    report = fits_80(terminal, "report", "--results", folder)
    assert report[0].startswith("dlbench report:") and "dlbench report --explain" in report[-1]
    results = fits_80(terminal, "results", "--results", folder)
    assert len([line for line in results if line.strip()]) >= len(store.load(folder)) + 2
    fits_80(terminal, "compare", folder, folder)
    fits_80(terminal, "run", "--dry-run", "--results", folder)


def test_doctor_and_the_plan_fit_80_columns(terminal, tmp_path):
    doctor = fits_80(terminal, "doctor", "--results", tmp_path)
    assert doctor[-1].strip() == "dlbench doctor --verbose shows every check and its whole detail"
    assert len(doctor) < 30
    verbose = fits_80(terminal, "doctor", "--results", tmp_path, "--verbose")
    assert len(verbose) > len(doctor)
    plan = fits_80(terminal, "run", "--dry-run", "--profile", "quick,paper", "--threads", "1,2",
                   "--sweep", "learning_rate=0.006750312521595928,0.01")
    assert any(line.startswith("96 job(s)") for line in plan)
    assert "learning_rate=0.00675" in "\n".join(plan) and "0.0067503" not in "\n".join(plan)
    assert plan[-1].startswith("estimated time:") or plan[-2].startswith("estimated time:")


def test_the_rules_are_printed_with_explain_only(terminal):
    short, _ = terminal(WIDTH, "report", "--results", TORCH7)
    explained, _ = terminal(WIDTH, "report", "--results", TORCH7, "--explain")
    rule = "Statistics: median [min–max] over a group's ok runs"
    assert rule not in " ".join(short.split()) and rule in " ".join(explained.split())
    assert "dlbench report --explain" in short and "dlbench report --explain" not in explained


def test_a_repeated_reason_is_a_footnote(terminal):
    shown, _ = terminal(WIDTH, "report", "--results", MEASUREMENTS / "2026-11-26-quick")
    reason = "quick profile (it trains for other lengths than the paper did)"
    text = " ".join(shown.split())
    assert text.count(f"[1] {reason}") == 2         # once under each of the two verdict tables
    assert text.count(reason) == 2 and "not comparable [1]" in text


def test_a_run_shows_job_k_of_n_and_the_time_left_within_80_columns():
    from orchestrator import execute, options
    from orchestrator.display import RichDisplay
    from orchestrator.report import estimate

    request = execute.Request(options=options.RunOptions.from_command_line(
        frameworks="caffe,tensorflow", datasets="mnist", profile="quick",
        sweep=["learning_rate=0.01,0.006750312521595928"]))
    jobs = execute.plan(request).plan.jobs
    known = estimate.machine_speeds(None)          # the reference rows' speeds
    seconds = [estimate.of_job(job, known) for job in jobs]
    assert all(s is not None and s > 0 for s in seconds)
    console = Console(file=io.StringIO(), width=WIDTH, force_terminal=True, color_system=None)
    display = RichDisplay(console, estimate=(jobs, lambda job: estimate.of_job(job, known)))
    display.progress.live.auto_refresh = False
    display.start(len(jobs))
    assert display.left.text() == f"about {estimate.duration(sum(seconds))} left"
    display.job_started(2, jobs[1])
    display.event({"event": "progress", "epoch": 1, "fraction": 0.5, "loss": 0.25})
    left = sum(seconds) - seconds[1] / 2           # job 1 not started here: still ahead
    assert display.left.text() == f"about {estimate.duration(left)} left"
    drawn = Console(file=io.StringIO(), width=WIDTH, force_terminal=True, color_system=None)
    drawn.print(display.progress.make_tasks_table(display.progress.tasks))
    display.stop()
    lines = [line.rstrip() for line in drawn.file.getvalue().splitlines()]
    assert max(len(line) for line in lines) <= WIDTH
    text = " ".join(" ".join(lines).split())
    assert f"job 2/{len(jobs)} caffe/mnist/quick" in text and f"about {estimate.duration(left)} left" in text


def test_no_paper_command_is_suggested_when_no_quick_job_the_paper_judges_trained():
    frame = store.load(MEASUREMENTS / "2026-11-26-quick")
    trained = paper.build(frame)
    command = summary._paper_command(trained, None)[-1]
    assert isinstance(command, summary.Command) and command.strip().startswith("dlbench run")
    # the six's quick rows: the command (and its time) holds the four the paper has numbers of
    assert set(trained.groups["framework"]) > {"mxnet", "pytorch"}
    assert command.strip() == "dlbench run --frameworks caffe,tensorflow,torch,theano"
    mxnet = paper.build(frame[frame["framework"] == "mxnet"])
    assert summary._paper_command(mxnet, None) == []
    failed = paper.build(frame.assign(status="failed", accuracy=float("nan")))
    assert summary._paper_command(failed, None) == []
    assert summary.paper_command(failed.groups.iloc[:0], failed.rows.iloc[:0]) == "dlbench run"


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


@needs_tmux
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


@needs_tmux
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


@needs_tmux
def test_wide_and_chosen_columns():
    wide = pane("results", "--results", str(TORCH7), "--wide")
    assert max(len(line) for line in wide) > WIDTH and "left out" not in "\n".join(wide)
    chosen = pane("results", "--results", str(TORCH7), "--columns", "run_id,train_time_s,host_load_avg")
    fits(chosen)
    assert re.split(r"\s{2,}", next(l for l in chosen if l.startswith("run")).strip()) == [
        "run", "train s", "load"]
