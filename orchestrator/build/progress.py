"""An image build's progress, read from its output: the Dockerfile step, the time left and
what apt and pip download.

Time left.  Each image's last build on this machine is kept in the user cache (``Times``):
how long each of its Dockerfile steps took.  While the image builds again with as many
steps, the time left is what the last build took from the current step on, less the time
the current step has run so far (never less than the steps after it took).  A step that
Docker's layer cache reused ("Using cache") keeps the time it took when it last ran, so a
cold build is not promised the speed of a cached one.  Without a last build (or with
another number of steps), the time left is the pace so far (the time to the current step
over the steps done) times the steps left; none before the second step.

Downloads.  apt says what it will fetch ("Need to get 45.3 MB of archives.") and each
archive as it comes ("Get:12 ... [1,234 kB]"): shown as done/total.  pip names each file
it starts to download with its size ("Downloading torch-....whl (182.3 MB)"), but shows
no progress within a file when its output is not a terminal: shown as the sum of the
files begun.  Other downloads (curl, git) say nothing parseable and are not shown.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import threading
import time
from pathlib import Path

from .. import cache
from ..errors import DlbenchError

STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)")
CACHED = "---> Using cache"
_SIZE = r"([\d.,]+) ([kMG]?B)"
APT_NEED = re.compile(rf"^Need to get (?:{_SIZE}/)?{_SIZE} of archives")
APT_GET = re.compile(rf"^Get:\d+ .*\[{_SIZE}\]\s*$")
PIP_GET = re.compile(rf"^\s*Downloading \S+ \({_SIZE}\)")
UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def size(number: str, unit: str) -> float:
    """apt's and pip's sizes ("1,234", "kB") in bytes."""
    return float(number.replace(",", "")) * UNITS[unit]


@dataclasses.dataclass(frozen=True)
class Step:
    instruction: str
    seconds: float
    cached: bool = False


class BuildProgress:
    """One build's progress, fed its output line by line (``line``); ``last``: the steps of
    the image's last build here (``Times.last``), or None.  ``clock``: monotonic seconds."""

    def __init__(self, last: list[Step] | None = None, clock=time.monotonic):
        self.last, self.clock = last, clock
        self.started = clock()
        self.step = self.steps = 0
        self.instruction = ""
        self.step_started = self.started
        self.done: list[Step] = []          # the steps ended so far
        self._cached = False
        self.apt_total = self.apt_got = None
        self.pip_got = 0.0

    def line(self, text: str) -> bool:
        """Reads one line of the build's output; True when it began a Dockerfile step."""
        step = STEP.match(text)
        if step:
            now = self.clock()
            self._end_step(now)
            self.step, self.steps, self.instruction = int(step[1]), int(step[2]), step[3]
            self.step_started, self._cached = now, False
            self.apt_total = self.apt_got = None
            return True
        if CACHED in text:
            self._cached = True
        elif need := APT_NEED.match(text):      # "1,024 kB/2,048 kB": the first is fetched
            self.apt_total, self.apt_got = size(*need.group(*((1, 2) if need[1] else (3, 4)))), 0.0
        elif self.apt_total is not None and (got := APT_GET.match(text)):
            self.apt_got += size(got[1], got[2])
        elif got := PIP_GET.match(text):
            self.pip_got += size(got[1], got[2])
        return False

    def finish(self) -> list[Step]:
        """The build ended: its steps, as ``Times`` keeps them."""
        self._end_step(self.clock())
        return self.done

    def _end_step(self, now: float) -> None:
        if self.step:
            self.done.append(Step(self.instruction, now - self.step_started, self._cached))
            self.step = 0

    def eta_s(self) -> float | None:
        """Seconds left, as the module says; None when there is nothing to go by."""
        if not self.step:
            return None
        now = self.clock()
        in_step = now - self.step_started
        if self.last and len(self.last) == self.steps:
            after = sum(s.seconds for s in self.last[self.step:])
            return max(after, after + self.last[self.step - 1].seconds - in_step)
        done = self.step - 1
        if done == 0:
            return None
        pace = (self.step_started - self.started) / done
        return max(0.0, pace * (self.steps - done) - in_step)

    def downloads(self) -> str:
        """What apt and pip have fetched, in words ("apt 12.3/45.3 MB, pip 182 MB"), or ""."""
        parts = []
        if self.apt_total:
            parts.append(f"apt {self.apt_got / 1e6:.1f}/{self.apt_total / 1e6:.1f} MB")
        if self.pip_got:
            parts.append(f"pip {self.pip_got / 1e6:.0f} MB")
        return ", ".join(parts)

    def text(self, width: int = 40) -> str:
        """One line: "step 3/9 RUN apt-get install ..., about 4 min left, apt 12.3/45.3 MB"."""
        if not self.step:
            return ""
        words = " ".join(self.instruction.split())
        parts = [f"step {self.step}/{self.steps} {words[:width]}"]
        eta = self.eta_s()
        if eta is not None:
            parts.append(f"about {duration(eta)} left")
        if downloads := self.downloads():
            parts.append(downloads)
        return ", ".join(parts)


def duration(seconds: float) -> str:
    """A time left in words: "40 s", "4 min", "1 h 05 min"."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


class Times:
    """Each image's last build on each machine: a JSON file (``path``; None: the user
    cache's, ``cache.build_times``), read and written whole (atomically), keyed by host name
    then image tag.  A file that cannot be read or written is taken as empty: an estimate is
    not worth an error."""

    def __init__(self, path: Path | None = None, host: str | None = None):
        self._path, self.host = path, host or socket.gethostname()
        self._lock = threading.Lock()

    @property
    def path(self) -> Path | None:
        if self._path is None:
            try:
                self._path = cache.build_times()
            except DlbenchError:
                return None
        return self._path

    def _read(self) -> dict:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def last(self, tag: str) -> list[Step] | None:
        with self._lock:
            host = self._read().get(self.host)
        return self._steps(host.get(tag)) if isinstance(host, dict) else None

    @staticmethod
    def _steps(stored) -> list[Step] | None:
        try:
            return [Step(str(i), float(s), bool(c)) for i, s, c in stored] or None
        except (TypeError, ValueError):
            return None

    def keep(self, tag: str, steps: list[Step]) -> None:
        """Keeps a finished build's steps; a step the layer cache reused keeps the time the
        last build took for it, where that ran the same instruction."""
        with self._lock:
            data = self._read()
            if not isinstance(data.get(self.host), dict):
                data[self.host] = {}
            old = data[self.host].get(tag)
            old = self._steps(old) if isinstance(old, list) else None
            kept = []
            for n, step in enumerate(steps):
                seconds = step.seconds
                if step.cached and old and len(old) == len(steps) and old[n].instruction == step.instruction:
                    seconds = max(seconds, old[n].seconds)
                kept.append([step.instruction, round(seconds, 3), step.cached])
            data[self.host][tag] = kept
            if self.path is None:
                return
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
            try:
                tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
                os.replace(tmp, self.path)
            except OSError:
                tmp.unlink(missing_ok=True)     # no estimate next time; the build itself is fine
