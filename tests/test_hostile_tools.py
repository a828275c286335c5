"""Hostile input to dlbench's own tools: a tune study's journal damaged or fought over by two
processes, a job run natively (the default results folder, a sparse file in out/, a line of
output with no end), and the stored strings of a job (its framework's name, its version,
its error) in the Markdown, CSV and chart outputs.

The study tests use real journals (made by Optuna, then damaged) and real processes; the
native jobs are a framework from outside (a directory on ``DLBENCH_FRAMEWORKS_PATH``) run by
this Python, which holds scikit-learn; the outputs are made by the CLI from stored rows and
read as their readers read them (Python-Markdown as MkDocs renders, markdown-it, pandas, a
real browser).
"""

from __future__ import annotations

import html
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import markdown
import optuna
import pandas as pd
import pytest
from markdown_it import MarkdownIt

from conftest import REPO, dlbench
from orchestrator import owners, store, tune
from orchestrator.records import RunRecord

training = pytest.mark.training
EXAMPLES = REPO / "examples" / "frameworks"


# -- tune: the study's journal -----------------------------------------------------------------

STUDY = "caffe-mnist-quick"
RESUME = ("tune", "--frameworks", "caffe", "--datasets", "mnist", "--resume")


def journal_of(results: Path, study: str = STUDY) -> Path:
    return results / "tune" / f"{study}.journal"


def study_journal(results: Path) -> Path:
    """A study's journal as Optuna writes it: the study, an attribute and one finished trial."""
    path = journal_of(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    study = optuna.create_study(study_name=STUDY, storage=storage, direction="minimize")
    study.set_user_attr("space", ["batch_size"])
    trial = study.ask()
    trial.suggest_categorical("batch_size", [16, 64])
    study.tell(trial, 12.5)
    return path


def one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("dlbench: error: "), lines
    return lines[0].removeprefix("dlbench: error: ")


DAMAGE = {
    # a process killed while it wrote its last entry
    "cut short": (lambda data: data[:-7],
                  "its last line (5) is an entry cut short (a process stopped while writing it): "
                  "remove that line to resume from the entries before it"),
    "binary": (lambda data: data + b"\x89PNG\r\n\x1a\n\x00\xff\xfe\xfd\n",
               "not a study journal Optuna can read (line 6 is not text)"),
    "overwritten": (lambda data: b"\n".join(data.split(b"\n")[:2] + [b'{"op_code": 4, "wor'] +
                                            data.split(b"\n")[3:]),
                    "not a study journal Optuna can read (line 3 is not JSON)"),
    "not an entry": (lambda data: data + b"[1, 2, 3]\n",
                     "not a study journal Optuna can read (line 6 is not an entry of Optuna's journal)"),
    "entries Optuna cannot replay": (lambda data: data + b'{"op_code": 5, "worker_id": "x"}\n',
                                     "not a study journal Optuna can read (Optuna could not replay it: "),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_journal_is_one_line_saying_what_to_do_and_is_left_as_it_is(tmp_path, damage):
    results = tmp_path / "results"
    path = study_journal(results)
    assert len(path.read_bytes().splitlines()) == 5
    make, message = DAMAGE[damage]
    path.write_bytes(make(path.read_bytes()))
    before = path.read_bytes()
    said = one_line(dlbench(*RESUME, "--results", results))
    assert said.startswith(f"{path}: ") and message in said
    if "not a study journal" in message:
        assert said.endswith(": move it away to start the study again (its trials' rows stay in the "
                             "results), or --study NAME starts another")
    assert path.read_bytes() == before
    assert not list((results / "tune").glob("*.journal.lock"))      # Optuna's own lock: never taken


def test_a_journal_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    results = tmp_path / "results"
    (results / "tune").mkdir(parents=True)
    os.mkfifo(journal_of(results))
    said = one_line(dlbench(*RESUME, "--results", results, timeout=120))
    assert said.startswith(f"{journal_of(results)}: not a study journal Optuna can read (it is not a "
                           "regular file)")


def holder(*code: str, env=None) -> subprocess.Popen:
    """A Python process that runs ``code`` (lines), prints "ready" and waits to be killed."""
    program = "\n".join(code + ("print('ready', flush=True)", "import time", "time.sleep(600)"))
    process = subprocess.Popen([sys.executable, "-c", program], cwd=REPO, stdout=subprocess.PIPE,
                               text=True, env={**os.environ, **(env or {})})
    assert process.stdout.readline().strip() == "ready"
    return process


def test_a_second_process_on_a_study_is_one_line_naming_the_first_and_changes_nothing(tmp_path):
    results = tmp_path / "results"
    path = study_journal(results)
    before = path.read_bytes()
    first = holder("from pathlib import Path", "from orchestrator import tune",
                   "request = tune.TuneRequest(framework='caffe', dataset='mnist')",
                   f"held = tune.own_study(request, Path({str(results)!r}), {STUDY!r})")
    try:
        said = one_line(dlbench(*RESUME, "--results", results))
        assert said == (f"study {STUDY} ({path}) is in use by process {first.pid} on "
                        f"{socket.gethostname()}: wait for it to end or stop it (nothing was changed), "
                        "or --study NAME starts another")
        assert path.read_bytes() == before
        with pytest.raises(owners.Held):
            owners.Hold(results / "tune" / f"{STUDY}.owner")
    finally:
        first.kill()
        first.wait()
    # its end, however it ended, frees the study
    tune.own_study(tune.TuneRequest(framework="caffe", dataset="mnist"), results, STUDY).release()


def test_a_running_trial_is_failed_only_once_its_owner_is_gone(tmp_path, monkeypatch):
    """A study in a database (SQLite here) that another process is running a trial of: not
    failed while that process lives, failed (and not counted) once it is killed."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))      # the owners folder
    url = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name=STUDY, storage=url, direction="minimize")
    first = holder("import optuna", "from orchestrator import owners",
                   f"study = optuna.load_study(study_name={STUDY!r}, storage={url!r})",
                   "trial = study.ask()", "trial.set_user_attr('owner', owners.current().token)",
                   env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    study = optuna.load_study(study_name=STUDY, storage=url)
    try:
        tune._fail_stale(study, sole=False)
        assert [t.state.name for t in study.get_trials()] == ["RUNNING"]
        assert tune._counted(study) == 0
    finally:
        first.kill()
        first.wait()
    tune._fail_stale(study, sole=False)
    assert [t.state.name for t in study.get_trials()] == ["FAIL"]
    assert tune._counted(study) == 0 and study.user_attrs == {"interrupted-0": True}


SKLEARN_TUNE = ("tune", "--runtime", "native", "--python", sys.executable, "--frameworks", "sklearn",
                "--datasets", "mnist", "--space", "batch_size")


@training
def test_two_tune_processes_on_one_study_never_share_a_trial(data_root, tmp_path):
    """The first runs two trials of scikit-learn natively; a second `--resume` while the first
    trains is one line and changes nothing; once the first has ended, the second resumes it
    to three trials: three rows, three finished trials, none failed."""
    results = tmp_path / "results"
    env = {**os.environ, "DLBENCH_FRAMEWORKS_PATH": str(EXAMPLES),
           "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    args = [*SKLEARN_TUNE, "--results", str(results), "--data-dir", str(data_root)]
    first = subprocess.Popen([sys.executable, "-m", "orchestrator", *args, "--trials", "2"], cwd=REPO,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = results / "tune" / "sklearn-mnist-quick.journal"
    deadline = time.monotonic() + 300
    while not list((results / store.JOBS).glob("*/job.json")):       # its first trial's job runs
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.2)
    before = journal.read_bytes()
    second = dlbench(*args, "--trials", "3", "--resume", env={"DLBENCH_FRAMEWORKS_PATH": str(EXAMPLES)})
    assert f"is in use by process {first.pid} on " in one_line(second)
    assert journal.read_bytes().startswith(before)       # the first went on; the second added nothing
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    dlbench(*args, "--trials", "3", "--resume", env={"DLBENCH_FRAMEWORKS_PATH": str(EXAMPLES)}, check=True)
    study = optuna.load_study(study_name="sklearn-mnist-quick", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal))))
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    frame = store.load(results)
    assert len(frame) == 3 and set(frame["status"]) == {"ok"}
    assert sorted(frame["run_id"]) == sorted(t.user_attrs["run_id"] for t in study.trials)


# -- the native runtime ----------------------------------------------------------------------

@training
def test_a_native_job_in_the_default_results_folder_stores_an_ok_row(data_root, tmp_path):
    """`dlbench run --runtime native` as the README offers it: no --results (the default
    folder, relative to where it is run) and a relative DLBENCH_FRAMEWORKS_PATH."""
    where = tmp_path / "work"
    where.mkdir()
    (where / "examples").symlink_to(REPO / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLBENCH_")}
    env |= {"DLBENCH_FRAMEWORKS_PATH": "examples/frameworks", "DLBENCH_DATA_DIR": str(data_root),
            "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "run", "--runtime", "native",
                           "--frameworks", "sklearn", "--datasets", "mnist", "--profile", "quick"],
                          cwd=where, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    row, = store.load(where / "dlbench-results").itertuples()
    assert (row.framework, row.runtime, row.status) == ("sklearn", "native", "ok"), row.error
    assert row.accuracy > 0.8


HOSTILE_SETUP = '''

_setup = Adapter.setup


def _hostile_setup(self):
    """Three MiB of output without a newline, then a sparse file of 1 GiB in out/ (the
    process starts in out/)."""
    import sys
    for _ in range(48):
        sys.stdout.write("x" * 65536)
    sys.stdout.write("\\n")
    sys.stdout.flush()
    with open("sparse.bin", "wb") as f:
        f.truncate(1 << 30)
    _setup(self)


Adapter.setup = _hostile_setup
'''


def hostile_framework(folder: Path) -> Path:
    """The scikit-learn example as a framework of another name, whose setup writes what a
    hostile job would; natively it imports scikit-learn."""
    folder.mkdir()
    models = json.loads((EXAMPLES / "sklearn" / "models.json").read_text())
    models |= {"framework": "hostile", "native": {"module": "sklearn"}}
    (folder / "models.json").write_text(json.dumps(models))
    (folder / "adapter.py").write_text((EXAMPLES / "sklearn" / "adapter.py").read_text() + HOSTILE_SETUP)
    shutil.copy(EXAMPLES / "sklearn" / "Dockerfile", folder / "Dockerfile")
    return folder


@training
def test_a_sparse_file_in_out_fails_the_job_and_a_line_without_end_is_split(data_root, tmp_path):
    results = tmp_path / "results"
    proc = dlbench("run", "--runtime", "native", "--python", sys.executable, "--frameworks", "hostile",
                   "--datasets", "mnist", "--profile", "quick", "--results", results,
                   "--data-dir", data_root, env={"DLBENCH_FRAMEWORKS_PATH": str(hostile_framework(
                       tmp_path / "hostile")), "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"})
    assert proc.returncode == 3, proc.stderr
    row, = store.load(results).itertuples()
    assert (row.framework, row.status) == ("hostile", "failed")
    assert row.error == "the job wrote more than 64 MiB into /out"
    log, = (results / store.JOBS).glob("*/log.txt")
    lengths = [len(line) for line in log.read_bytes().split(b"\n")]
    assert lengths.count(1 << 20) == 3 and max(lengths) == 1 << 20       # 3 MiB in three lines


def test_a_sparse_file_counts_its_apparent_size(tmp_path):
    from orchestrator import jobdir
    job = tmp_path / "job"
    (job / jobdir.OUT).mkdir(parents=True)
    with open(job / jobdir.OUT / "sparse", "wb") as f:
        f.truncate(1 << 40)                 # a TiB, no block of it on the disk
    assert os.stat(job / jobdir.OUT / "sparse").st_blocks == 0
    assert jobdir.out_usage(job).bytes == 1 << 40
    assert jobdir.over_limit(job) == "the job wrote more than 64 MiB into /out"


# -- what is shown: Markdown, CSV, charts -------------------------------------------------------

LINK = '<a href="https://example.com/steal">click</a>'
SCRIPT = "<script>document.title='owned'</script>"
HOSTILE = {"framework": f"evil{LINK}", "framework_version": f"=HYPERLINK(\"https://example.com\"){SCRIPT}",
           "device_name": "@SUM(1+1)", "model": "+cmd|' /C calc'!A0", "host_name": "-2+3",
           "error": None}
ERROR = f"-boom {LINK} https://example.com/x www.example.com"


@pytest.fixture(scope="module")
def hostile_rows(tmp_path_factory) -> Path:
    """The committed Lua Torch7 rows (two ok runs with epoch curves) with the strings a job
    controls made hostile, and a run whose error is a formula and a link."""
    from test_report import records as stored
    records = [RunRecord(**(row.model_dump() | HOSTILE))
               for row in stored(REPO / "docs" / "measurements" / "2026-11-25-torch7-test-pass")]
    failed = records[0].model_copy(update={"run_id": "f" * 16, "status": "failed", "accuracy": None,
                                           "error": ERROR})
    results = tmp_path_factory.mktemp("hostile") / "results"
    store.append(results, records + [failed])
    return results


def test_markdown_shows_hostile_strings_as_text(hostile_rows):
    text = dlbench("report", "--results", hostile_rows, "--format", "md", check=True).stdout
    assert "<script" not in text and "<a " not in text
    for page in (markdown.markdown(text, extensions=["tables"]),            # as MkDocs renders it
                 MarkdownIt("gfm-like", {"linkify": False}).render(text)):
        assert not re.search(r"<(script|a|img)\b", page)
        assert f"evil{LINK}" in html.unescape(page)                        # shown, as it is
    assert "| evil&lt;a href=\"https&#58;//example.com/steal\"&gt;click&lt;/a&gt; |" in text


def test_csv_cells_a_spreadsheet_would_run_are_neutralised_and_numbers_stay_numbers(hostile_rows):
    shown = pd.read_csv(io.StringIO(dlbench("results", "--results", hostile_rows, "--format", "csv",
                                            check=True).stdout))
    assert set(shown["framework_version"]) == {"'" + HOSTILE["framework_version"]}
    assert set(shown["device_name"]) == {"'@SUM(1+1)"} and set(shown["host_name"]) == {"'-2+3"}
    assert set(shown["model"]) == {"'+cmd|' /C calc'!A0"} and set(shown["framework"]) == {f"evil{LINK}"}
    assert "'" + ERROR in set(shown["error"])
    assert shown["accuracy"].dtype == float and shown["train_time_s"].dtype == float
    report = pd.read_csv(io.StringIO(dlbench("report", "--results", hostile_rows, "--format", "csv",
                                             check=True).stdout))
    assert set(report["host_name"]) == {"'-2+3"}
    text = [c for c in report.columns if not pd.api.types.is_numeric_dtype(report[c])]
    assert "host_name" in text and "framework_versions" in text
    assert all(not str(v).startswith(("=", "+", "-", "@")) for c in text for v in report[c].dropna())


@pytest.mark.skipif(not (shutil.which("chromium") and shutil.which("chromedriver")),
                    reason="needs a headless browser: Debian's chromium and chromium-driver")
def test_no_chart_makes_a_hostile_name_a_link(hostile_rows, tmp_path):
    from test_report_page import load
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    dlbench("report", "--results", hostile_rows, "--html", tmp_path / "page", check=True)
    page = (tmp_path / "page" / "index.html").read_text()
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    options.binary_location = shutil.which("chromium")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    try:
        assert load(browser, tmp_path / "page" / "index.html") == []
        found = browser.execute_script("""return {
            title: document.title,
            plots: document.querySelectorAll('.js-plotly-plot').length,
            links: [...document.querySelectorAll('a')].map(a => a.getAttribute('href') || a.getAttribute('xlink:href') || '')
                .filter(h => !h.startsWith('data:') && h.includes('example.com')),
            legend: [...document.querySelectorAll('.js-plotly-plot .legendtext')].map(t => t.textContent)};""")
    finally:
        browser.quit()
    assert found["plots"] >= 1 and found["links"] == [] and "owned" not in found["title"]
    assert f"evil{LINK}" in " ".join(found["legend"])          # the name shown, as text
    # the chart's CSV link: the names as stored, neutralised as the CSV formats' are
    uri = re.search(r'href="data:text/csv;charset=utf-8,([^"]+)"', page)[1]
    table = pd.read_csv(io.StringIO(urllib.parse.unquote(uri)))
    assert set(table["framework"]) == {f"evil{LINK}"}


def test_the_terminal_shows_a_jobs_error_without_its_markup_or_escape_sequences():
    from types import SimpleNamespace

    from rich.console import Console

    from orchestrator.display import RichDisplay
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    display = RichDisplay(console)
    display.start(1)
    link = "\x1b]8;;https://example.com\x1b\\click\x1b]8;;\x1b\\"      # a terminal's hyperlink
    display.job_finished(SimpleNamespace(status="failed", framework="evil[link=https://example.com]x",
                                         dataset="mnist", profile="quick", error=f"{link} [bold]boom"))
    display.stop()
    shown = console.file.getvalue()
    assert "\x1b]8" not in shown                  # no hyperlink: neither the job's nor rich's [link]
    assert "evil[link=https://example.com]x/mnist/quick: ?]8;;https://example.com?\\click" in shown
    assert "[bold]boom" in shown
