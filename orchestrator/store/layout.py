"""The results directory's layout: its folders and files, and the files a reader may open
(it needs no pyarrow: ``store.results_dir`` is all that ``dlbench doctor`` asks of it).

    RESULTS/runs/<time>-<run id>.parquet             a job's row, written when it ends
    RESULTS/runs/<time>-compacted-<id>.parquet       rows merged by compaction
    RESULTS/traces/<run id>.parquet                  a job's resource samples
    RESULTS/traces/<time>-compacted-<id>.parquet     samples merged by compaction
    RESULTS/robustness/<run id>.parquet              a job's accuracy under attack
    RESULTS/robustness/<time>-compacted-<id>.parquet those merged by compaction
    RESULTS/steps/<run id>.parquet                   a fair job's loss at each of its first steps
    RESULTS/steps/<time>-compacted-<id>.parquet      those merged by compaction
    RESULTS/ops/<run id>.parquet                     a fair job's time per layer and pass
    RESULTS/ops/<time>-compacted-<id>.parquet        those merged by compaction
    RESULTS/models/<run id>.onnx                     a job's trained model (the migration check)
    RESULTS/transfer/<run id>.npz                    a job's FGSM images, for transfer attacks
    RESULTS/_jobs/<run id>/                          the job's spec, raw result and log
    RESULTS/_rescued/<run id>.json                   a row that could not be stored (``recover``)
    RESULTS/.compact.lock                            the lock (``write._lock``)
    RESULTS/.compaction.json                         a compaction's journal, while it swaps files
    RESULTS/.schema_version                          the version the last rewrite brought it to

Every file in ``runs/`` has the current schema, so any Parquet reader reads the folder
whole with no options: ``pandas.read_parquet("RESULTS/runs")``, DuckDB's
``read_parquet('RESULTS/runs/*.parquet')``, polars' ``pl.read_parquet("RESULTS/runs/*.parquet")``.
Names starting with ``_`` or ``.`` are ignored by Parquet readers.

Traces, robustness, step losses and layer times are a job's side tables (``tables.py``),
written, read, rewritten, compacted and rescued alike, each with its own schema version.  A
job's ONNX model and its FGSM images are written and rescued as they are, never merged.

Only regular files (or links to one inside the directory) are opened; anything else
there is left out with a ``StoreWarning`` (``_openable``).
"""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

from .. import files
from ..errors import StoreWarning

RUNS = "runs"
MODELS = "models"
TRANSFER = "transfer"
JOBS = "_jobs"
RESCUED = "_rescued"
OLD_ROWS = "runs-*.parquet"   # rows before schema version 4, at the top of the directory
OLD_TRACES = "_traces"        # traces before schema version 4
REWRITTEN = ".schema_version"  # the version the last rewrite brought every file to
LOCK = ".compact.lock"
JOURNAL = ".compaction.json"    # a compaction making its file visible: the names involved


def results_dir(explicit: str | os.PathLike | None) -> Path:
    return Path(explicit or os.environ.get("DLBENCH_RESULTS_DIR") or "dlbench-results")


def job_dir(results: Path, run_id: str) -> Path:
    path = results / JOBS / run_id
    path.mkdir(parents=True, exist_ok=True)
    return path


def row_files(results: Path) -> list[Path]:
    """The row files a reader may open (``_openable``): those of an old layout first, then
    ``runs/``'s."""
    return _openable(results, sorted(results.glob(OLD_ROWS)) + sorted((results / RUNS).glob("*.parquet")))


def _openable(results: Path, paths: list[Path]) -> list[Path]:
    """The files of ``paths`` a reader may open: regular files, or links to one inside the
    results directory, and none that Parquet readers ignore (a name starting with ``.`` or
    ``_``).  Each other one is left out with a StoreWarning: a FIFO blocked every reader
    for good, deaf to signals, and a dangling link looked like a file that a compaction
    removed, read again and again.  (Someone who can write the results directory can still
    swap a file for a FIFO after this look: that is not a job, which never reaches it.)"""
    kept, top = [], None
    for path in paths:
        if path.name.startswith((".", "_")):
            continue
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue                    # compacted meanwhile
        why = None
        if stat.S_ISLNK(info.st_mode):
            top = top or results.resolve()
            if not path.resolve().is_relative_to(top):
                why = "a symbolic link out of the results directory"
            else:
                try:
                    info = path.stat()
                except OSError:
                    why = "a symbolic link that leads nowhere"
                else:
                    if not stat.S_ISREG(info.st_mode):
                        why = f"a symbolic link to {files.kind(info.st_mode)}"
        elif not stat.S_ISREG(info.st_mode):
            why = f"not a regular file ({files.kind(info.st_mode)})"
        if why is None:
            kept.append(path)
        else:
            _warn(f"{path}: {why}; ignored")
    return kept


# -- the jobs' ONNX models and FGSM images, kept as they are --------------------------------
def model_path(results: Path, run_id: str) -> Path:
    return results / MODELS / f"{run_id}.onnx"


def transfer_path(results: Path, run_id: str) -> Path:
    return results / TRANSFER / f"{run_id}.npz"


# -- a warning naming the file -------------------------------------------------------------
def _warn(message: str) -> None:
    warnings.warn(message, StoreWarning, stacklevel=3)


def _why(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
