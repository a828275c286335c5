"""The live terminal display of a run: job k/N, the time left, phase, epoch, loss.

In a terminal every line fits its width: prose wraps between words, a progress line's text
too; a command to copy is printed on a line of its own and never wrapped (``command``).  In
a file or a pipe (a log) lines stay whole."""

from __future__ import annotations

import threading

from rich.console import Console
from rich.table import Column
from rich.markup import escape
from rich.progress import (BarColumn, DownloadColumn, Progress, ProgressColumn, SpinnerColumn,
                           TextColumn, TimeElapsedColumn, TransferSpeedColumn)
from rich.table import Table
from rich.text import Text

from .terminal import shown

# Lines of ``say`` shown without --verbose (besides "building" and "up to date").
SHOWN = ("debootstrap", "pulling", "no registry", "importing", "removed", "resume", "fail-fast",
         "download cache")


class RichDisplay:
    """``on_start``: called once as the jobs start, before the first line of progress.
    ``estimate``: (the plan's jobs, a function giving a job's estimated seconds or None), for
    the time left (report/estimate.py); None: no time left shown."""

    def __init__(self, console: Console | None = None, verbose: bool = False, on_start=None,
                 estimate=None):
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.verbose = verbose
        self.on_start = on_start
        self.progress = Progress(   # the text and the detail share what the bar and time leave
            SpinnerColumn(), TextColumn("{task.description}", table_column=Column(ratio=3)),
            BarColumn(bar_width=BAR), _Detail(table_column=Column(ratio=2)), TimeElapsedColumn(),
            console=self.console, transient=False, expand=True)
        self.left = TimeLeft(*estimate) if estimate is not None else None
        self.overall = None
        self._lanes = threading.local()     # each lane's (thread's) own job line
        self._builds = {}                   # image tag -> its progress line while it builds
        self._lock = threading.Lock()

    @property
    def current(self):
        return getattr(self._lanes, "task", None)

    @current.setter
    def current(self, task):
        self._lanes.task = task

    @property
    def epochs(self):
        return getattr(self._lanes, "epochs", 1)

    @epochs.setter
    def epochs(self, epochs):
        self._lanes.epochs = epochs

    @property
    def _whole(self) -> bool:
        """Lines are kept whole (a file or a pipe), not wrapped between words."""
        return not self.console.is_terminal

    def say(self, text):
        if self.verbose:
            self.console.print(text, markup=False, highlight=False, soft_wrap=self._whole)
        elif text.endswith(("building", "up to date")) or text.startswith(SHOWN) or ": built in " in text:
            self.console.print(f"[dim]{escape(text)}[/dim]", highlight=False, soft_wrap=self._whole)

    def build_step(self, tag, progress):
        """One line per image being built: a bar over its Dockerfile steps, then the step,
        the time left and what apt and pip have downloaded (``progress.text()``, read again
        at every refresh), and the time so far; gone when the build ends (``progress``
        None)."""
        with self._lock:
            task = self._builds.get(tag)
            if progress is None:
                if task is not None:
                    self.progress.remove_task(self._builds.pop(tag))
                if not self._builds and self.overall is None:
                    self.progress.stop()
                return
            if task is None:
                self.progress.start()
                task = self._builds[tag] = self.progress.add_task(tag, total=progress.steps,
                                                                  detail=progress.text)
            self.progress.update(task, completed=progress.step - 1, total=progress.steps)

    def download_progress(self):
        return _Downloads(self.console)

    def start(self, total):
        if self.on_start is not None:
            self.on_start()
        self.progress.start()
        self._total = total
        self.overall = self.progress.add_task("jobs", total=total, detail=self._left_text)

    def _left_text(self) -> str:
        """The overall line's detail: the estimated time left, read at every refresh."""
        return self.left.text() if self.left is not None else ""

    def jobs_left_out(self, count):
        """``count`` jobs of those ``start`` counted will not run (``--resume``: stored)."""
        if self.overall is not None and count:
            self._total = max(0, self._total - count)
            self.progress.update(self.overall, total=self._total)
            if self.left is not None:
                self.left.left_out(count)

    def job_started(self, index, job):
        if self.current is not None:
            self.progress.remove_task(self.current)
        self.epochs = job.hyperparameters.get("epochs") or 1
        if self.left is not None:
            self.left.started(job)
        self.current = self.progress.add_task(f"job {index}/{self._total} {escape(describe(job))}",
                                              total=float(self.epochs), detail="starting")

    def event(self, event):
        kind = event.get("event")
        if self.current is None:
            return
        if event.get("epochs") and event["epochs"] != self.epochs:
            self.epochs = event["epochs"]
            self.progress.update(self.current, total=float(self.epochs))
        if kind == "phase":
            self.progress.update(self.current, detail=event.get("phase", ""))
        elif kind == "progress":
            done = (event.get("epoch", 1) - 1) + event.get("fraction", 0.0)
            if self.left is not None:
                self.left.running(done / self.epochs)
            self.progress.update(self.current, completed=done,
                                 detail=f"epoch {event.get('epoch')}/{self.epochs:.3g} loss {event.get('loss', 0):.4f}")
        elif kind == "epoch":
            self.progress.update(self.current, completed=event.get("epoch", 0),
                                 detail=f"epoch {event.get('epoch')}/{self.epochs:.3g} loss {event.get('loss', 0):.4f} "
                                        f"train acc {100 * event.get('accuracy', 0):.2f}%")

    def job_finished(self, record):
        if self.current is not None:
            self.progress.remove_task(self.current)
            self.current = None
        self.progress.advance(self.overall)
        if self.left is not None:
            self.left.finished()
        if record.status == "ok":
            peak = (f", peak memory {record.memory_peak_bytes / 2**20:.0f} MiB"
                    if record.memory_peak_bytes else "")
            self.console.print(f"[green]ok[/green] {shown(record.framework)}/{record.dataset}/{record.profile}: "
                               f"accuracy {100 * record.accuracy:.2f}%, train {record.train_time_s:.1f} s, "
                               f"test {record.test_time_s:.2f} s{peak}", highlight=False,
                               soft_wrap=self._whole)
        else:
            self.console.print(f"[red]{record.status}[/red] {shown(record.framework)}/{record.dataset}/"
                               f"{record.profile}: {shown(record.error)}", highlight=False,
                               soft_wrap=self._whole)

    def stop(self):
        self.progress.stop()


def line(console: Console, text: str) -> None:
    """A line of prose: in a terminal wrapped between words at its width, in a file or a
    pipe whole; never read as markup."""
    console.print(text, markup=False, highlight=False, soft_wrap=not console.is_terminal)


def command(console: Console, text: str) -> None:
    """A command to copy and paste, on a line of its own and never wrapped (the terminal may
    fold it where it is wider, which copying joins again)."""
    console.print(Text(text, no_wrap=True, overflow="ignore"), highlight=False, soft_wrap=True,
                  crop=False)


MARKS = {"ok": "[green]ok[/green]", "fail": "[red]FAIL[/red]", "warn": "[yellow]WARN[/yellow]",
         "note": "[blue]note[/blue]", "": ""}


def marked(console: Console, lines) -> None:
    """(status, text) lines as `dlbench doctor` prints them: the status's mark, then the
    text; in a terminal the text wraps between words under itself, in a file or a pipe each
    line stays whole."""
    if not console.is_terminal:
        for status, text in lines:
            mark = Text.from_markup(MARKS[status])
            mark.pad_right(5 - mark.cell_len)
            console.print(mark + Text(text), highlight=False, soft_wrap=True)
        return
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=4, no_wrap=True)
    grid.add_column(ratio=1)
    for status, text in lines:
        grid.add_row(MARKS[status], Text(text))
    console.print(grid, highlight=False)


BAR = 16       # a progress bar's width: a job line keeps its words at 80 columns


class TimeLeft:
    """The estimated time left of a run: the estimates (``seconds(job)``, None where none is
    known) of the jobs not started yet, and what is left of the running job's, from the
    share of its training done.  Builds, set-up and the time spent past an estimate are not
    counted: it is the estimator's time (report/estimate.py), never below zero."""

    def __init__(self, jobs, seconds):
        self.seconds = seconds
        known = [seconds(job) for job in jobs if job.unsupported is None]
        self.waiting = sum(s for s in known if s is not None)
        self.unknown = sum(s is None for s in known)
        self.jobs = len(known)
        self.current, self.done_share = 0.0, 0.0
        self.lock = threading.Lock()

    def started(self, job):
        with self.lock:
            took = None if job.unsupported else self.seconds(job)
            if took is None:
                self.unknown = max(0, self.unknown - (job.unsupported is None))
            self.waiting = max(0.0, self.waiting - (took or 0.0))
            self.jobs = max(0, self.jobs - (job.unsupported is None))
            self.current, self.done_share = took or 0.0, 0.0

    def running(self, share: float):
        with self.lock:
            self.done_share = min(max(share, 0.0), 1.0)

    def finished(self):
        with self.lock:
            self.current, self.done_share = 0.0, 0.0

    def left_out(self, count: int):
        """``count`` jobs will not run (stored already): their share of the estimate goes."""
        with self.lock:
            if self.jobs:
                mean = self.waiting / max(1, self.jobs - self.unknown) if self.jobs > self.unknown else 0.0
                self.waiting = max(0.0, self.waiting - mean * min(count, self.jobs - self.unknown))
                self.jobs = max(0, self.jobs - count)

    def text(self) -> str:
        from .report.estimate import duration

        with self.lock:
            left = self.waiting + self.current * (1 - self.done_share)
            unknown = self.unknown
        if left <= 0 and not unknown:
            return ""
        text = f"about {duration(left)} left" if left > 0 else ""
        if unknown:
            text += (" + " if text else "") + f"{unknown} job(s) not estimated"
        return text


def describe(job) -> str:
    """A job in one short line: what it is and what the campaign varies."""
    parts = [job.label] + [f"{k}={v}" for k, v in job.overrides.items()]
    if job.cpus:
        parts.append(f"cpus={job.cpus}")
    if job.gpu is not None:
        parts.append(f"gpu={job.gpu}")
    if job.repeat:
        parts.append(f"repeat {job.repeat}")
    return " ".join(parts)


class _Detail(ProgressColumn):
    """A line's detail: its ``detail`` field, or what that returns where it is a function
    (an image build's step and time left, which change between lines of its output)."""

    def render(self, task):
        detail = task.fields.get("detail", "")
        return Text(detail() if callable(detail) else str(detail))


class _Downloads:
    """A progress bar per downloaded archive, as datasets.download expects."""

    def __init__(self, console):
        self.console = console
        self.progress = None

    def add_task(self, name, total=None):
        if self.progress is None:
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                     TransferSpeedColumn(), console=self.console)
            self.progress.start()
        return self.progress.add_task(f"download {name}", total=total)

    def update(self, task, advance):
        self.progress.update(task, advance=advance)

    def __del__(self):
        if self.progress is not None:
            self.progress.stop()


class NullDisplay:
    """No display: what tests, the bench and a Slurm task use."""
    def say(self, text):
        pass

    def build_step(self, tag, progress):
        pass

    def download_progress(self):
        return None

    def start(self, total):
        pass

    def jobs_left_out(self, count):
        pass

    def job_started(self, index, job):
        pass

    def event(self, event):
        pass

    def job_finished(self, record):
        pass

    def stop(self):
        pass
