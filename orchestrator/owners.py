"""Who owns a job container: a random token per dlbench run, and a lock file it holds.

Each ``dlbench run`` makes a random owner token, creates ``OWNERS/<token>.lock``
(``OWNERS`` is a per-user directory of this machine, beside the data-set cache)
and holds an exclusive ``flock`` on it until it exits; the kernel drops the lock
when the process dies, however it dies.  Its job containers carry the token
(label ``org.dlbench.owner``), their run id and their results directory.

A job container is stale when its owner's lock file is on this machine and
nobody holds its lock.  A container whose lock file is not here (started from
another machine sharing the Docker daemon, or by another user) is never
touched.  Neither host names nor process ids are trusted: both repeat across
machines and PID namespaces.

``Hold`` is the same kernel lock on a file named for what it guards (a tune study), held
by one process at a time: another finds it taken and is told who holds it.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import re
import secrets
import socket
from pathlib import Path

from . import cache

TOKEN = re.compile(r"[0-9a-f]{32}")


def owners_dir() -> Path:
    return cache.folder("owners")


_current = None


def current() -> "Owner":
    """This process's owner token and lock, made on first use and released at exit."""
    global _current
    if _current is None:
        _current = Owner()
        atexit.register(_current.release)
    return _current


class Owner:
    """A claim on the containers a process starts; ``release`` (or the process's end) ends it."""

    def __init__(self, root: Path | None = None):
        self.token = secrets.token_hex(16)
        root = root or owners_dir()
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / f"{self.token}.lock"
        # Locked before it gets its name, so that no sweep ever sees it unlocked.
        tmp = root / f".{self.token}.tmp"
        self._fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(self._fd, f"{os.getpid()}\n".encode())
        os.rename(tmp, self.path)

    def release(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


class Lapsed:
    """The lock of a dead owner, held while its containers are removed (a context manager);
    None when the owner is alive or its lock file is not on this machine."""

    def __init__(self, fd: int, path: Path):
        self.fd, self.path = fd, path

    @classmethod
    def claim(cls, token: str, root: Path | None = None) -> "Lapsed | None":
        if not TOKEN.fullmatch(token):
            return None
        path = (root or owners_dir()) / f"{token}.lock"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None                 # not here: another machine's, or already swept
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None                 # its owner is alive
        return cls(fd, path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(unlink=exc[0] is None)

    def close(self, unlink: bool = True) -> None:
        if unlink:
            self.path.unlink(missing_ok=True)
        os.close(self.fd)


def sweep_lock_files(keep=(), root: Path | None = None) -> int:
    """Remove the lock files of dead owners, except those of the tokens in ``keep``
    (owners whose containers are still there)."""
    root = root or owners_dir()
    removed = 0
    for path in root.glob("*.lock") if root.is_dir() else []:
        if path.stem in keep:
            continue
        lapsed = Lapsed.claim(path.stem, root)
        if lapsed is not None:
            lapsed.close()
            removed += 1
    return removed


class Held(Exception):
    """``Hold``: another process holds the lock; ``holder`` is what it wrote in the file
    (its process id and host name, for a message only), "" when it had not written it yet."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


class Hold:
    """An exclusive ``flock`` on the file ``path`` (created if missing), held until
    ``release`` or the process's end, however it ends; ``Held`` when another process holds
    it.  The file says who holds it and is never removed: a process waiting on a removed
    file's lock and one on its new file would both hold "the same" lock."""

    def __init__(self, path: Path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            raise Held(holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        self.path, self._fd = path, fd

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def gone(token: str, root: Path | None = None) -> bool:
    """Whether the owner of ``token`` is known to be gone: its lock file is on this machine
    and nobody holds it.  An owner whose file is not here may be alive elsewhere."""
    lapsed = Lapsed.claim(token, root)
    if lapsed is None:
        return False
    lapsed.close(unlink=False)          # the sweep removes it once its containers are gone
    return True
