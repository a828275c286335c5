"""A results directory that can take the rows, and rows rescued when it cannot.

Before a run, ``check_results``: the directory can be written and has room.  Before each
job, ``Rescue`` sets room aside for its row; ``store_row`` stores the job's row, side
tables, ONNX model and FGSM images, and keeps what the directory could not take in that
room (a full disk), so that a finished job is never lost; ``recover`` (``dlbench
recover``) stores what was kept.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import json
import os
import re
import tempfile
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from .. import files, jobdir
from ..errors import StoreError
from ..records import RunRecord
from .layout import RESCUED
from .tables import RESULT_TABLES, TRACE
from .rows import append, write_model, write_side, write_trace, write_transfer
from .settle import _unheld, settle
from .write import _lock

MIN_FREE_MB = 100               # free space a run needs to start; DLBENCH_MIN_FREE_MB overrides
MIN_FREE_VARIABLE = "DLBENCH_MIN_FREE_MB"
RESCUE_RESERVE = 1 << 20        # bytes set aside for each job's row before the job starts
DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EIO,
                         errno.EACCES, errno.EPERM})


def min_free_bytes() -> int:
    text = os.environ.get(MIN_FREE_VARIABLE)
    if text is None:
        return MIN_FREE_MB * 2**20
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise StoreError(f"{MIN_FREE_VARIABLE}={text!r}: give a whole number of MB, 0 or more")
    return value * 2**20


def check_results(results: Path, make: bool = True) -> Path:
    """Before any build or job: the results directory exists or can be made, is a
    directory, can be written, and has at least ``min_free_bytes()`` free.  Without
    ``make``, nothing is made or written (a directory not there yet is judged by its
    nearest existing parent), so that a run checks every other input before it leaves
    anything behind."""
    if results.exists() and not results.is_dir():
        raise StoreError(f"{results}: not a directory (the results go to a directory)")
    if not make:
        where = results
        while not where.exists():
            where = where.parent
        doing = "write in" if where == results else "make"
        if not where.is_dir():
            raise StoreError(f"{results}: cannot {doing} the results directory: Not a directory")
        if not os.access(where, os.W_OK | os.X_OK):
            why = ("Read-only file system" if os.statvfs(where).f_flag & os.ST_RDONLY
                   else "Permission denied")
            raise StoreError(f"{results}: cannot {doing} the results directory: {why}")
        _check_free(results, where)
        return results
    try:
        results.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"{results}: cannot make the results directory: {exc.strerror}") from None
    try:
        fd, probe = tempfile.mkstemp(dir=results, prefix=".write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise StoreError(f"{results}: cannot write in the results directory: {exc.strerror}") from None
    _check_free(results, results)
    settle(results)
    return results


def _check_free(results: Path, where: Path) -> None:
    disk = os.statvfs(where)
    free, needed = disk.f_bavail * disk.f_frsize, min_free_bytes()
    if free < needed:
        raise StoreError(f"{results}: {free / 2**20:.0f} MB free, a run needs at least "
                         f"{needed / 2**20:.0f} MB ({MIN_FREE_VARIABLE} sets it)")


class Kept(NamedTuple):
    """Where ``Rescue.keep`` put a row (None: nowhere) and, when they did not fit beside it,
    its ONNX model and FGSM images (None: lost; the row keeps their figures)."""
    path: Path | None
    aside: dict[str, Path | None] = {}


BLOB_WORDS = {"model": "ONNX model", "transfer": "FGSM images"}
BLOB_SUFFIXES = {"model": ".onnx", "transfer": ".npz"}
BLOB_LIMIT = jobdir.OUT_LIMIT_BYTES     # a job keeps no more than that in out/


def _aside(run_id: str, name: str, blob: bytes) -> Path | None:
    """A rescued row's model or images, in a file of the temporary directory."""
    try:
        fd, path = tempfile.mkstemp(prefix=_aside_prefix(run_id), suffix=BLOB_SUFFIXES[name])
    except OSError:
        return None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        return Path(path)
    except OSError:
        Path(path).unlink(missing_ok=True)
        return None


def _aside_prefix(run_id: str) -> str:
    return f"dlbench-rescued-{run_id}-"


def _aside_file(run_id: str, name: str, file) -> Path:
    """A kept model's or images' file named in a rescue file, which ``recover`` reads and
    then removes: only a file named as ``_aside`` names them, never any path the results
    directory (as untrusted as a job's out/) would have it read and delete."""
    path = Path(file) if isinstance(file, str) else None
    if (path is None or not path.is_absolute() or not path.name.startswith(_aside_prefix(run_id))
            or path.suffix != BLOB_SUFFIXES[name]):
        raise ValueError(f"its {BLOB_WORDS[name]} file {file!r} is not one dlbench kept")
    return path


class Rescue:
    """Room for one job's row, set aside before the job starts, in
    ``RESULTS/_rescued/<run id>.json``: where the row goes when the results directory
    cannot take it after the job (a full disk), so that a finished job is never lost.
    The file is locked while its run lives; ``release`` removes it once the row is
    stored, ``recover`` stores what was kept."""

    def __init__(self, results: Path, run_id: str):
        self.path = results / RESCUED / f"{run_id}.json"
        self.path.parent.mkdir(exist_ok=True)
        with _lock(results, shared=True):       # no sweep sees it made and not yet locked
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                              | os.O_CLOEXEC, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            try:
                os.posix_fallocate(self.fd, 0, RESCUE_RESERVE)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.write(self.fd, b" " * RESCUE_RESERVE)     # blank JSON, as room
            os.fsync(self.fd)
        except OSError:
            self.release()
            raise

    def keep(self, record: RunRecord, samples: list[dict], row_stored: bool,
             sides: dict[str, list[dict]] | None = None, blobs: dict[str, bytes] | None = None) -> Kept:
        """Keep the row, its trace samples and its rows of the other side tables (``sides``:
        by folder, as ``Collected`` holds them) in the room set aside, with its files
        (``blobs``, by kind: the ONNX model, the FGSM images) when the room can take them
        too; when it cannot (the room is sized for the row), those go to files in the
        temporary directory that the kept row names.  When even the row does not fit,
        everything goes to one file in the temporary directory."""
        blobs = {name: blob for name, blob in (blobs or {}).items() if blob is not None}
        document = {"row": record.model_dump(mode="json"), "trace": samples,
                    **{folder: list(rows) for folder, rows in (sides or {}).items()},
                    "row_stored": row_stored}
        whole = json.dumps(dict(document, **{name: base64.b64encode(blob).decode()
                                             for name, blob in blobs.items()})).encode()
        try:
            try:
                self._fill(whole)
                return Kept(self.path)
            except OSError:
                if not blobs:
                    raise
            aside = {name: _aside(record.run_id, name, blob) for name, blob in blobs.items()}
            document["files"] = {name: str(path) for name, path in aside.items() if path is not None}
            try:
                self._fill(json.dumps(document).encode())
                return Kept(self.path, aside)
            except OSError:
                for path in aside.values():
                    if path is not None:
                        path.unlink(missing_ok=True)
                raise
        except OSError:
            try:
                fd, other = tempfile.mkstemp(prefix=f"dlbench-rescued-{record.run_id}-", suffix=".json")
                with os.fdopen(fd, "wb") as f:
                    f.write(whole)
                return Kept(Path(other))
            except OSError:
                return Kept(None)
        finally:
            os.close(self.fd)
            self.fd = None

    def _fill(self, data: bytes) -> None:
        """The room holds ``data`` and nothing else, or OSError (a short write is one:
        a full disk takes what fits and says so only on the next write)."""
        done = 0
        while done < len(data):
            written = os.pwrite(self.fd, data[done:], done)
            if written == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            done += written
        os.ftruncate(self.fd, len(data))
        os.fsync(self.fd)

    def release(self) -> None:
        """The row is stored: give the room back."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            self.path.unlink(missing_ok=True)


def store_row(results: Path, record: RunRecord, samples: list[dict], rescue: Rescue,
              sides: dict[str, list[dict]] | None = None, blobs: dict[str, bytes] | None = None) -> None:
    """Store a finished job's trace, its rows of the other side tables (``sides``, by
    folder: robustness, steps, ops), its files (``blobs``, by kind: the ONNX model, the FGSM
    images; as ``Collected`` holds them) and its row; if the results directory cannot take
    them, keep them in the rescue file and raise one StoreError saying how to recover them."""
    problems = []
    sides = sides or {}
    for side, rows in ((TRACE, samples), *((t, sides.get(t.folder)) for t in RESULT_TABLES)):
        if side is not TRACE and not rows:
            continue
        try:
            write_side(results, side, record.run_id, rows)
        except (OSError, pa.ArrowException, OverflowError, ValueError) as exc:
            problems.append(f"its {side.kind}: {_reason(exc)}")
    blobs = blobs or {}
    writers = {"model": write_model, "transfer": write_transfer}     # by kind, as BLOB_WORDS
    for name, blob in blobs.items():
        try:
            writers[name](results, record.run_id, blob)
        except OSError as exc:
            problems.append(f"its {BLOB_WORDS[name]}: {_reason(exc)}")
    try:
        append(results, [record])
    except (OSError, pa.ArrowException, OverflowError, ValueError) as exc:
        problems.insert(0, f"its row: {_reason(exc)}")
        stored = False
    else:
        stored = True
    if not problems:
        rescue.release()
        return
    kept = rescue.keep(record, samples, stored, sides, blobs)
    what = (f"{results}: cannot store job {record.run_id} ({record.framework}/{record.dataset}, "
            f"{record.status}): {'; '.join(problems)}")
    if kept.path is None:
        raise StoreError(f"{what}; it could not be kept anywhere else either")
    beside = "".join(f", its {BLOB_WORDS[name]} in {path}" if path is not None else
                     f", its {BLOB_WORDS[name]} could not be kept (the row keeps its figures)"
                     for name, path in kept.aside.items())
    where = (f"run `dlbench recover --results {results}`" if kept.path == rescue.path else
             f"move it into {results / RESCUED}/ and run `dlbench recover --results {results}`")
    raise StoreError(f"{what}; it is kept in {kept.path}{beside}: once the problem is fixed, {where}")


def _reason(exc: BaseException) -> str:
    """An error in a few words: the system's message for its errno (pyarrow's OSErrors
    carry it only in their text, as ``[errno 28]``)."""
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)
    text = str(exc)
    found = re.search(r"\[errno (\d+)\]", text, re.IGNORECASE)
    if found:
        return os.strerror(int(found.group(1)))
    return (text.splitlines() or [type(exc).__name__])[0][:200]


def recover(results: Path) -> tuple[int, list[str]]:
    """Store the rows (and their rows of the side tables, ONNX models, FGSM images) kept in
    ``RESULTS/_rescued/``; returns how many, and a line for each file that could not be
    (left in place).  Room set aside by a run that still lives is left alone; room left
    empty by a run that was stopped is removed."""
    if not results.is_dir():
        raise StoreError(f"{results}: no such results directory")
    settle(results)                         # the empty room goes there
    recovered, problems = 0, []
    for path in sorted((results / RESCUED).glob("*.json")):
        try:
            data = _unheld(path)
            if data is None or not data.strip(b"\0 \t\n"):
                continue                    # its run is still going
            document = json.loads(data)
            record = RunRecord.model_validate(document["row"])
            if document.get("trace") is not None:
                write_trace(results, record.run_id, document["trace"])
            for side in RESULT_TABLES:
                if document.get(side.folder):
                    write_side(results, side, record.run_id, document[side.folder])
            aside = {name: _aside_file(record.run_id, name, file)
                     for name, file in (document.get("files") or {}).items() if name in BLOB_WORDS}
            for name, write in (("model", write_model), ("transfer", write_transfer)):
                if document.get(name) is not None:
                    write(results, record.run_id, base64.b64decode(document[name], validate=True))
                elif name in aside:
                    try:
                        blob = files.read_regular(aside[name], BLOB_LIMIT, follow_links=False)
                    except FileNotFoundError:
                        problems.append(f"{path}: its {BLOB_WORDS[name]} ({aside[name]}) is gone: "
                                        "the row is stored without it")
                        continue
                    write(results, record.run_id, blob)
            if not document.get("row_stored"):
                append(results, [record])
        except (OSError, files.Refused, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
            problems.append(f"{path}: not recovered: {_reason(exc)}")
            continue
        path.unlink()
        for file in aside.values():
            file.unlink(missing_ok=True)
        recovered += 1
    return recovered, problems
