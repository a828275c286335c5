"""What a killed process leaves in a results directory, and ``settle``, which clears it.

One file per job keeps every row safe the moment its job ends; ``compact`` merges them,
each merged file made visible by ``_swap``: it is written under a hidden name, a journal
naming it and the files it replaces is put on disk, one rename makes it visible and the
replaced files are removed at once.  A compaction killed at any moment is finished, or its
hidden file removed, by the next dlbench command that uses the directory (``settle``:
``dlbench run`` before its first job, ``compact``, ``upgrade``, ``recover``, and the
readers when they find a journal).  Readers other than dlbench see a row twice only
between that rename and the last removal (milliseconds), or after a crash in that
window until the next dlbench command; dlbench's readers leave the replaced files out
(``_superseded``).  Since writers hold the lock shared and compactions exclusive, the
temporary files found under the exclusive lock are dead writers' and are swept, and so
is the room for rows (``rescue.Rescue``) that a stopped run left empty.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from .. import files
from .layout import JOURNAL, MODELS, RESCUED, REWRITTEN, RUNS, TRANSFER, _warn, _why
from .tables import SIDE_TABLES
from .write import _fsync_folder, _lock

JOURNAL_LIMIT = 64 << 20        # bytes (a name per file replaced: 100,000 files take ~6 MiB)
RESCUED_LIMIT = 1 << 30         # a rescued row with its trace (a sample a second: ~100 B each),
                                # robustness rows, and perhaps its ONNX model and FGSM images
                                # (at most 64 MiB together, in base64)


def _relative(results: Path, path: Path) -> str:
    return path.relative_to(results).as_posix()


def _member(results: Path, name) -> Path:
    """A journal's name of a file, as a path inside the results directory (nothing else)."""
    if not isinstance(name, str) or not name or name.startswith("/") or ".." in name.split("/"):
        raise ValueError(f"{name!r} is not a name inside the results directory")
    return results / name


def _journal(results: Path) -> tuple[Path, Path, list[Path]] | None:
    """The compaction the journal names, if there is one: (its file once visible, its
    hidden file, the files it replaces); raises ValueError for a journal that is not one."""
    try:
        document = json.loads(files.read_regular(results / JOURNAL, JOURNAL_LIMIT))
    except FileNotFoundError:
        return None
    except (OSError, files.Refused) as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(document, dict) or not isinstance(document.get("replaced"), list):
        raise ValueError("not a compaction journal")
    return (_member(results, document.get("final")), _member(results, document.get("pending")),
            [_member(results, name) for name in document["replaced"]])


def _superseded(results: Path, paths: list[Path]) -> list[Path]:
    """``paths`` (just listed) less the files a compaction has replaced with a file among
    them but not yet removed: a compaction under way, or one killed before it was done
    and not yet finished by ``settle`` (a results directory dlbench cannot write to)."""
    try:
        journal = _journal(results)
    except ValueError:
        return paths                    # said by settle; rows are read once per run id anyway
    if journal is None or journal[0] not in paths:
        return paths
    replaced = set(journal[2])
    return [path for path in paths if path not in replaced]


def _swap(results: Path, pending: Path, final: Path, replaced: list[Path]) -> None:
    """Make a compaction's file visible and remove the files it replaces, so that a crash
    at any moment is undone or finished by the next ``settle``.

    Parquet readers ignore ``pending`` (its name starts with a dot and does not end in
    .parquet).  The journal naming the three is on disk before the one rename that makes
    it visible; from then on a crash is finished (``_finish``), so the replaced files are
    removed at once, with no flush between them: an outside reader listing ``runs/`` in
    those few milliseconds, or after a crash within them and before the next dlbench
    command, sees their rows twice.  The journal goes once the last of them is gone."""
    document = {"final": _relative(results, final), "pending": _relative(results, pending),
                "replaced": [_relative(results, path) for path in replaced]}
    tmp = results / f"{JOURNAL}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(document))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, results / JOURNAL)
    _fsync_folder(results)
    _complete(results, final, pending, replaced)


def _finish(results: Path) -> None:
    """Finish the compaction a crash interrupted after its journal was written: its file
    made visible if it is not yet (it was whole and flushed before the journal), the files
    it replaces removed.  Call under the exclusive lock."""
    try:
        journal = _journal(results)
    except ValueError as exc:
        _warn(f"{results / JOURNAL}: unreadable compaction journal ({_why(exc)}); removed, "
              "rows may be stored twice until the next compaction")
        (results / JOURNAL).unlink(missing_ok=True)
        return
    if journal is None:
        return
    _complete(results, *journal)


def _complete(results: Path, final: Path, pending: Path, replaced: list[Path]) -> None:
    """A journaled compaction carried to its end, from wherever it stopped: its file made
    visible (the one rename), the files it replaces removed, then the journal."""
    if not final.exists() and pending.exists():
        os.rename(pending, final)
    if final.exists():                  # else both gone: nothing to finish, nothing removed
        for path in replaced:
            path.unlink(missing_ok=True)
        for folder in {final.parent, *(path.parent for path in replaced)}:
            _fsync_folder(folder)
    (results / JOURNAL).unlink()


def _sweep(results: Path) -> None:
    """Remove the temporary files of writers that died (under the exclusive lock no writer
    is writing): half-written rows, traces and compactions, a journal or a rewrite's mark
    never renamed into place."""
    for folder, pattern in ((results / RUNS, ".*.tmp"), (results / MODELS, ".*.tmp"),
                            (results / TRANSFER, ".*.tmp"),
                            *((results / side.folder, ".*.tmp") for side in SIDE_TABLES),
                            (results, f"{JOURNAL}.*.tmp"), (results, f"{REWRITTEN}.*.tmp")):
        for path in folder.glob(pattern):
            with contextlib.suppress(OSError):
                path.unlink()


def settle(results: Path, wait: bool = True) -> None:
    """Before a command uses a results directory: finish a compaction that was killed,
    sweep the temporary files of dead writers, and the room for rows (``Rescue``) that a
    stopped run left empty.  Without ``wait``, skipped while another process holds the lock."""
    if not results.is_dir():
        return
    try:
        with _lock(results, wait=wait):
            _settle_locked(results)
    except BlockingIOError:
        pass


def _settle_locked(results: Path) -> None:
    _finish(results)
    _sweep(results)
    _sweep_rescued(results)


def _settle_for_reading(results: Path) -> None:
    """A reader finishes a killed compaction, so that outside readers see each row once
    again, if it can (the lock free, the directory writable); its own reading leaves the
    replaced files out either way (``_superseded``)."""
    if (results / JOURNAL).exists():
        with contextlib.suppress(OSError):
            settle(results, wait=False)


# -- the room for rows that a stopped run left empty ------------------------------------
def _unheld(path: Path) -> bytes | None:
    """What a rescue file holds, or None while its run lives (it holds the file's lock)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        return files.read_regular(path, RESCUED_LIMIT, follow_links=False)
    finally:
        os.close(fd)


def _sweep_rescued(results: Path) -> None:
    """Remove the room for rows that no run holds and none filled: a run stopped between
    setting it aside and storing its row.  (Under the exclusive lock no run is between
    making its room and locking it.)"""
    for path in (results / RESCUED).glob("*.json"):
        with contextlib.suppress(OSError, files.Refused):
            data = _unheld(path)
            if data is not None and not data.strip(b"\0 \t\n"):
                path.unlink()
