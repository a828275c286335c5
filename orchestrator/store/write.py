"""Writing a file whole, beside other processes.

Each write goes to a hidden temporary name and is renamed into place, so a file
appears whole or not at all, and concurrent writers (two ``dlbench run`` processes on
the same directory) never touch the same file: every name holds the run id.  Writers
hold the results directory's lock shared, and a rewrite, a compaction and ``settle``
exclusive (``_lock``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .layout import LOCK


def _stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f")


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)        # the rename itself survives a crash
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_hidden(table: pa.Table | bytes, final: Path) -> Path:
    """Write a table (or bytes) to a hidden temporary name beside ``final``, fsynced;
    returns that name.  Parquet readers skip it: it starts with a dot (pyarrow, pandas)
    and does not end in .parquet (a glob of ``*.parquet``: DuckDB, polars)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{os.getpid()}.tmp"
    try:
        if isinstance(table, bytes):
            tmp.write_bytes(table)
        else:
            pq.write_table(table, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _write_atomic(table: pa.Table | bytes, final: Path) -> Path:
    """Write to a hidden temporary name in the same folder, fsync, rename into place."""
    tmp = _write_hidden(table, final)
    try:
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_folder(final.parent)
    return final


def write_json(path: Path, document) -> None:
    """A small JSON file, written whole or not at all (no empty file on a full disk)."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(document, indent=1))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def _lock(results: Path, shared: bool = False, wait: bool = True):
    """The results directory's lock: exclusive for a rewrite, compaction and ``settle``,
    shared for a job's writes (its side tables and row); so under the exclusive lock every
    temporary file in ``runs/`` and the side tables' folders is a dead writer's.  Without ``wait``,
    ``BlockingIOError`` when someone holds it."""
    fd = os.open(results / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
        yield
    finally:
        os.close(fd)            # and with it the lock
