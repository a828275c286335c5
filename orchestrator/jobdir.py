"""A job's directory, and the job's output handled as hostile input.

    RESULTS/_jobs/<run id>/        made by the host; the job never gets it
        job.json                   the spec, written before the job starts (mounted read-only)
        log.txt                    the job's output, created before the job starts
        result.json                the host's copy of out/result.json, once checked
        out/                       the only thing the job may write (mounted at /out),
                                   removed once the job is collected

Whatever a job leaves in ``out/`` may be a symbolic link to a host file, a FIFO,
a directory, or a file of any size.  The host never follows a link or opens a
non-regular file there: every file it writes is created before the job starts,
with ``O_EXCL`` and ``O_NOFOLLOW``, in a directory the job cannot reach; what it
reads from ``out/`` is opened relative to a descriptor of ``out/`` itself, with
``O_NOFOLLOW | O_NONBLOCK``, and read only when ``fstat`` says it is a regular
file within the size cap.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

OUT = "out"
OUT_LIMIT_BYTES = 64 << 20      # what a job may keep in out/; more and it is stopped
OUT_LIMIT_ENTRIES = 10_000      # files, links and directories in out/
RUN_ID = re.compile(r"[0-9a-f]{16}")

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def create(path: Path, mode: int = 0o644):
    """A new file opened for writing (text, line-buffered); never an existing file or a link."""
    return os.fdopen(os.open(path, _CREATE, mode), "w", buffering=1)


def prepare(job_dir: Path, spec: dict, owner: int | None = None):
    """Write job.json, create log.txt and an empty out/ (handed to ``owner``, a uid,
    when given); returns log.txt open for writing.  Call before the job starts."""
    with create(job_dir / "job.json") as f:
        f.write(json.dumps(spec, indent=1))
    log = create(job_dir / "log.txt")
    out = job_dir / OUT
    out.mkdir(mode=0o700)
    if owner is not None:
        os.chown(out, owner, owner)
    return log


def read_output(job_dir: Path, name: str, limit: int) -> tuple[bytes | None, str | None]:
    """The bytes of ``out/<name>``, or None and why not: missing, not a regular file
    (a link, FIFO, directory, device), or over ``limit`` bytes."""
    try:
        top = os.open(job_dir, _DIR)
    except OSError as exc:
        return None, f"the job directory cannot be opened ({exc.strerror})"
    try:
        try:
            out = os.open(OUT, _DIR, dir_fd=top)
        except FileNotFoundError:
            return None, f"the runner wrote no {name}"
        except OSError as exc:
            return None, f"{OUT}/ is not a directory the job made ({exc.strerror})"
        try:
            try:
                fd = os.open(name, _READ, dir_fd=out)
            except FileNotFoundError:
                return None, f"the runner wrote no {name}"
            except OSError as exc:          # ELOOP: a symbolic link, ENXIO: a socket ...
                return None, f"{name} is not a regular file ({_kind(out, name) or exc.strerror})"
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    return None, f"{name} is not a regular file ({_KINDS.get(stat.S_IFMT(info.st_mode), 'special file')})"
                if info.st_size > limit:
                    return None, f"{name} is {info.st_size} bytes (limit {limit})"
                data = _read_at_most(fd, limit + 1)
                if len(data) > limit:                        # grew after fstat
                    return None, f"{name} is over {limit} bytes (limit {limit})"
                return data, None
            finally:
                os.close(fd)
        finally:
            os.close(out)
    finally:
        os.close(top)


_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a directory",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket"}


def _kind(dir_fd: int, name: str) -> str | None:
    try:
        return _KINDS.get(stat.S_IFMT(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode))
    except OSError:
        return None


def _read_at_most(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def out_usage(job_dir: Path, max_entries: int = OUT_LIMIT_ENTRIES) -> tuple[int, int]:
    """(bytes allocated, entries) in out/, walked without following links; stops
    counting entries past ``max_entries``."""
    used = entries = 0
    try:
        top = os.open(job_dir, _DIR)
    except OSError:
        return 0, 0
    try:
        for _, dirs, files, dir_fd in os.fwalk(OUT, dir_fd=top):
            for name in dirs + files:
                entries += 1
                try:
                    used += os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_blocks * 512
                except OSError:
                    pass
            if entries > max_entries:
                break
    except OSError:
        pass
    finally:
        os.close(top)
    return used, entries


def over_limit(job_dir: Path) -> str | None:
    """Why the job's out/ is over its bound, or None."""
    used, entries = out_usage(job_dir)
    if used > OUT_LIMIT_BYTES:
        return f"the job wrote more than {OUT_LIMIT_BYTES >> 20} MiB into /out"
    if entries > OUT_LIMIT_ENTRIES:
        return f"the job made more than {OUT_LIMIT_ENTRIES} files in /out"
    return None


def take_result(job_dir: Path, limit: int) -> tuple[bytes | None, str | None]:
    """Take the runner's result.json out of out/: checked, copied beside it as the
    host's own file, and out/ removed (``shutil.rmtree`` follows no links)."""
    data, problem = read_output(job_dir, "result.json", limit)
    if data is not None:
        (job_dir / "result.json").unlink(missing_ok=True)
        with os.fdopen(os.open(job_dir / "result.json", _CREATE, 0o644), "wb") as f:
            f.write(data)
    remove_out(job_dir)
    return data, problem


def remove_out(job_dir: Path) -> None:
    out = job_dir / OUT
    if out.is_dir() and not out.is_symlink():
        shutil.rmtree(out, ignore_errors=True)


def remove(job_dir: Path) -> None:
    """Remove a job's directory (an interrupted job leaves no row, so nothing of it is kept)."""
    if job_dir.is_dir() and not job_dir.is_symlink():
        shutil.rmtree(job_dir, ignore_errors=True)
