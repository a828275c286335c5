"""A job's directory, and the job's output handled as hostile input.

    RESULTS/_jobs/<run id>/        made by the host; the job never gets it
        job.json                   the spec, written before the job starts (mounted read-only)
        weights.npz                a fair job's initial weights, beside the spec (read-only)
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
file within the size cap (``files.py``).

A job may also nest directories thousands deep or make files by the thousand.  out/
is walked (``out_usage``) and removed (``remove_tree``) without recursion and with a
bounded number of open directories; the bounds on what it may hold (bytes, entries,
depth) are checked in one place, ``over_limit``: the Docker runtime stops a job past
one while it runs, and fails one found past one when it ends.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import re
import stat
from pathlib import Path
from typing import NamedTuple

from . import files

OUT = "out"
OUT_LIMIT_BYTES = 64 << 20      # what a job may keep in out/; more and it is stopped
OUT_LIMIT_ENTRIES = 10_000      # files, links and directories in out/
OUT_LIMIT_DEPTH = 64            # directories within directories in out/
RUN_ID = re.compile(r"[0-9a-f]{16}")

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def create(path: Path, mode: int = 0o644):
    """A new file opened for writing (text, line-buffered); never an existing file or a link."""
    return os.fdopen(os.open(path, _CREATE, mode), "w", buffering=1)


def prepare(job_dir: Path, spec: dict, owner: int | None = None, inputs: dict | None = None):
    """Write job.json and the job's ``inputs`` (file name -> bytes, beside it), create
    log.txt and an empty out/ (handed to ``owner``, a uid, when given); returns log.txt
    open for writing.  Call before the job starts."""
    with create(job_dir / "job.json") as f:
        f.write(json.dumps(spec, indent=1))
    for name, data in (inputs or {}).items():
        with os.fdopen(os.open(job_dir / name, _CREATE, 0o444), "wb") as f:
            f.write(data)
    log = create(job_dir / "log.txt")
    out = job_dir / OUT
    out.mkdir(mode=0o700)
    if owner is not None:
        os.chown(out, owner, owner)
    return log


def absent(name: str) -> str:
    """``read_output``'s reason for a file the job did not write."""
    return f"the runner wrote no {name}"


def read_output(job_dir: Path, name: str, limit: int) -> tuple[bytes | None, str | None]:
    """The bytes of ``out/<name>``, or None and why not: missing (``absent``), not a
    regular file (a link, FIFO, directory, device), or over ``limit`` bytes."""
    try:
        top = os.open(job_dir, _DIR)
    except OSError as exc:
        return None, f"the job directory cannot be opened ({exc.strerror})"
    try:
        try:
            out = os.open(OUT, _DIR, dir_fd=top)
        except FileNotFoundError:
            return None, absent(name)
        except OSError as exc:
            return None, f"{OUT}/ is not a directory the job made ({exc.strerror})"
        try:
            return files.read_regular(name, limit, dir_fd=out, follow_links=False), None
        except FileNotFoundError:
            return None, absent(name)
        except files.Refused as exc:
            return None, f"{name} is {exc}"
        except OSError as exc:              # ELOOP: a symbolic link, ENXIO: a socket ...
            return None, f"{name} is not a regular file ({files.kind_at(name, out) or exc.strerror})"
        finally:
            os.close(out)
    finally:
        os.close(top)


class Usage(NamedTuple):
    """What a job's out/ holds (as far as it was counted)."""

    bytes: int          # apparent or allocated, whichever is more, summed
    entries: int        # files, links and directories
    depth: int          # of the deepest directory: 1 for one in out/ itself


def _verdict(usage: Usage) -> str | None:
    """Why out/ is over its bounds, or None: the one place they are checked."""
    if usage.bytes > OUT_LIMIT_BYTES:
        return f"the job wrote more than {OUT_LIMIT_BYTES >> 20} MiB into /out"
    if usage.entries > OUT_LIMIT_ENTRIES:
        return f"the job made more than {OUT_LIMIT_ENTRIES} files in /out"
    if usage.depth > OUT_LIMIT_DEPTH:
        return f"the job nested directories more than {OUT_LIMIT_DEPTH} deep in /out"
    return None


def out_usage(job_dir: Path) -> Usage:
    """Bytes, entries and depth of out/, walked without recursion and without following
    links, and only until one of them is past its bound (a job may make far more than is
    worth counting).  One directory per level is open, so at most ``OUT_LIMIT_DEPTH`` + 1."""
    used = entries = deepest = 0
    try:
        top = os.open(job_dir, _DIR)
    except OSError:
        return Usage(0, 0, 0)
    levels = []                     # (descriptor, its entries not yet seen), out/ first
    try:
        with contextlib.suppress(OSError):
            levels.append(_open_level(OUT, top))
        while levels and _verdict(Usage(used, entries, deepest)) is None:
            fd, names = levels[-1]
            entry = next(names, None)
            if entry is None:
                _close_level(*levels.pop())
                continue
            entries += 1
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue                    # removed meanwhile
            used += _size(info)
            if stat.S_ISDIR(info.st_mode):
                deepest = max(deepest, len(levels))
                if deepest <= OUT_LIMIT_DEPTH:
                    with contextlib.suppress(OSError):
                        levels.append(_open_level(entry.name, fd))
    finally:
        for level in levels:
            _close_level(*level)
        os.close(top)
    return Usage(used, entries, deepest)


def _size(info: os.stat_result) -> int:
    """What an entry of out/ counts against its bound: its apparent size or the blocks it
    holds, whichever is more.  Blocks alone let a sparse file of any apparent size pass
    (the host reads and copies apparent bytes); the apparent size alone misses blocks
    allocated past a file's end (``fallocate`` keeping its size)."""
    return max(info.st_size, info.st_blocks * 512)


def _open_level(name: str, dir_fd: int):
    fd = os.open(name, _DIR, dir_fd=dir_fd)
    try:
        return fd, os.scandir(fd)
    except BaseException:
        os.close(fd)
        raise


def _close_level(fd: int, names) -> None:
    names.close()
    os.close(fd)


def over_limit(job_dir: Path) -> str | None:
    """Why the job's out/ is over its bounds, or None."""
    return _verdict(out_usage(job_dir))


def take_result(job_dir: Path, limit: int) -> tuple[bytes | None, str | None]:
    """Take the runner's result.json out of out/: checked, copied beside it as the
    host's own file, and out/ removed (``remove_tree``: no link followed)."""
    data, problem = read_output(job_dir, "result.json", limit)
    if data is not None:
        (job_dir / "result.json").unlink(missing_ok=True)
        with os.fdopen(os.open(job_dir / "result.json", _CREATE, 0o644), "wb") as f:
            f.write(data)
    remove_out(job_dir)
    return data, problem


def remove_out(job_dir: Path) -> None:
    remove_tree(job_dir / OUT)


def remove_inputs(job_dir: Path, names) -> None:
    """Remove the inputs ``prepare`` wrote beside the spec, once the job's row is made
    (a fair job's weights: its seed or the user's file gives them again)."""
    for name in names:
        (job_dir / name).unlink(missing_ok=True)


def remove(job_dir: Path) -> None:
    """Remove a job's directory (an interrupted job leaves no row, so nothing of it is kept)."""
    remove_tree(job_dir)


_hoisted = itertools.count()


def remove_tree(path: Path) -> None:
    """Remove a directory and all it holds, following no link (a link to it is left as
    it is), however deep it nests: ``shutil.rmtree`` recurses, and a job's tree of 1,100
    levels crashed it.  Each directory met is emptied of its files while its own
    directories are moved up into the top one, to be emptied in turn, so no more than
    two directories are open at a time.  What cannot be removed is left in place."""
    try:
        top = os.open(path, _DIR)
    except OSError:
        return                      # gone already, or a link
    try:
        progress = True
        while progress:             # each pass empties one level more
            progress = False
            for name in os.listdir(top):
                progress |= _remove_entry(top, name)
    finally:
        os.close(top)
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _remove_entry(top: int, name: str) -> bool:
    """Remove ``name`` from the directory ``top``; a directory is emptied of its files and
    its directories moved up into ``top``.  Whether anything changed."""
    try:
        os.unlink(name, dir_fd=top)
        return True
    except IsADirectoryError:
        pass
    except OSError:
        return False
    try:
        sub = os.open(name, _DIR, dir_fd=top)
    except OSError:
        return False
    changed = False
    try:
        for child in os.listdir(sub):
            try:
                os.unlink(child, dir_fd=sub)
                changed = True
            except IsADirectoryError:
                changed |= _move_up(sub, child, top)
            except OSError:
                pass
    finally:
        os.close(sub)
    try:
        os.rmdir(name, dir_fd=top)
        return True
    except OSError:
        return changed


def _move_up(sub: int, name: str, top: int) -> bool:
    """Move the directory ``name`` from ``sub`` into ``top`` under a name of its own (one
    already taken by a file or a full directory is skipped; an empty one is replaced,
    which loses nothing since everything there goes)."""
    for _ in range(100):
        try:
            os.rename(name, f".dlbench-removed-{next(_hoisted)}", src_dir_fd=sub, dst_dir_fd=top)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                return False
    return False
