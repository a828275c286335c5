"""What the Docker runtime's two ways of running a job (one container, ``docker.py``; one a
worker, ``workers.py``) share: stopping a container, and the watch on a job's out/."""

from __future__ import annotations

import threading
from pathlib import Path

from .. import jobdir


def kill(container, flag: threading.Event) -> None:
    flag.set()
    try:
        container.kill()
    except Exception:  # noqa: BLE001 - it may have just finished
        pass


class OutWatch:
    """Stops a job (kills its container) once its out/ holds more than jobdir's bounds;
    checked once a second: a bind mount has no size limit of its own.  A watch that
    fails stops the job too: a job nobody watches could fill the disk."""

    def __init__(self, job_dir: Path, container, interval: float = 1.0):
        self.job_dir, self.container, self.interval = job_dir, container, interval
        self.reason: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="out-watch", daemon=True)

    def start(self) -> "OutWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def verdict(self) -> str | None:
        """Once the job has ended: why it failed its bounds (what it was stopped for, or
        what out/ holds past them: a job can pass one and end between two checks), or None."""
        return self.reason or jobdir.over_limit(self.job_dir)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                reason = jobdir.over_limit(self.job_dir)
                if reason is not None:
                    self._halt(reason + " (stopped)")
                    return
        except BaseException as exc:  # noqa: BLE001 - whatever it was, the job must not run unwatched
            self._halt(f"dlbench could not check /out ({type(exc).__name__}: {exc}); the job was stopped")

    def _halt(self, reason: str) -> None:
        self.reason = reason
        kill(self.container, threading.Event())
