"""Stop signals: SIGINT, SIGTERM and SIGHUP stop a run the same way in every phase.

``install`` takes them over whatever the parent left: a shell starts a background
job with SIGINT ignored, and Python then never turns it into KeyboardInterrupt, so a
``kill -INT`` went by while every job ran to its end.  The first stop signal raises
``Interrupted`` in the main thread; the clean-up it starts (removing the running
container, keeping the rows stored so far) is not interrupted again by a second one.
"""

from __future__ import annotations

import contextlib
import signal
import sys

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
INTERRUPTED = "interrupted; the rows stored so far are kept"


class Interrupted(KeyboardInterrupt):
    """A stop signal; the process exits with 128 + its number, as a shell reports it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.exit_code = 128 + signum


received: list[int] = []          # the stop signal that came, if one did
_deferring: list[bool] = []        # inside signals_deferred()


def _interrupt(signum, frame):
    for other in STOP_SIGNALS:          # once: the clean-up runs to its end
        signal.signal(other, signal.SIG_IGN)
    received.append(signum)
    if not _deferring:
        raise Interrupted(signum)


def interrupted() -> int:
    """The one line for an interrupted run; returns the exit code.  (Typer turns the
    interrupt into a plain exit code 130, so the signal is taken from ``received``.)"""
    sys.stderr.write(f"dlbench: error: {INTERRUPTED}\n")
    return 128 + received[0] if received else 130


@contextlib.contextmanager
def signals_deferred():
    """Hold a stop signal back while a resource is made and its handle taken, so that an
    interrupt never falls between the two (a container started by the daemon but not yet
    known here would be left running); one that came meanwhile is raised as the block
    ends.  (Blocking the signal with a mask would not do: the kernel hands a process's
    signal to any thread that does not block it, and Python runs the handler in the main
    thread all the same.)"""
    _deferring.append(True)
    try:
        yield
    finally:
        _deferring.pop()
    if received and not _deferring:
        raise Interrupted(received[0])


def install():
    for signum in STOP_SIGNALS:
        signal.signal(signum, _interrupt)
