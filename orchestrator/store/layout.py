"""The results directory's layout: its folders and files, the side tables, and the files a
reader may open.

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

Traces, robustness, step losses and layer times are a job's side tables (``SideTable``:
``TRACE``, ``ROBUSTNESS``, ``STEPS``, ``OPS``), written, read, rewritten, compacted and
rescued alike, each with its own schema version.  A job's ONNX model and its FGSM images
are written and rescued as they are, never merged.

Only regular files (or links to one inside the directory) are opened; anything else
there is left out with a ``StoreWarning`` (``_openable``).
"""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

import pyarrow as pa

from .. import files, rowcheck
from ..errors import StoreWarning
from ..schema import OPS_SCHEMA, ROBUSTNESS_SCHEMA, STEPS_SCHEMA, TRACE_SCHEMA, upgrade_robustness

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


class SideTable(NamedTuple):
    """A table of many rows per job beside the rows: one file per job, in ``folder``."""
    kind: str                   # in messages: "trace file"
    folder: str
    schema: pa.Schema
    version_key: bytes          # the schema metadata that holds its version
    old_folder: str | None = None   # where an older layout kept its files
    order: tuple = ("run_id",)  # how ``load_side`` sorts its rows
    integers: bool = False      # whether pandas gets its integer columns as nullable Int64
    upgrade: Callable[[pa.Table, int], pa.Table] | None = None  # older versions' rows to this one
    rules: dict[str, str] | None = None     # what its values may be (``rowcheck``)

    @property
    def version(self) -> int:
        return int(self.schema.metadata[self.version_key])


TRACE = SideTable("trace", "traces", TRACE_SCHEMA, b"dlbench.trace_schema_version",
                  old_folder=OLD_TRACES, order=("run_id", "t_s"), rules=rowcheck.TRACE)
ROBUSTNESS = SideTable("robustness", "robustness", ROBUSTNESS_SCHEMA,
                       b"dlbench.robustness_schema_version", integers=True,
                       upgrade=upgrade_robustness, rules=rowcheck.ROBUSTNESS)
STEPS = SideTable("step loss", "steps", STEPS_SCHEMA, b"dlbench.steps_schema_version",
                  order=("run_id", "step"), integers=True, rules=rowcheck.STEPS)
OPS = SideTable("op time", "ops", OPS_SCHEMA, b"dlbench.ops_schema_version", integers=True,
                rules=rowcheck.OPS)
SIDE_TABLES = (TRACE, ROBUSTNESS, STEPS, OPS)
# The side tables a job's collected result may hold rows of (the trace is sampled apart).
RESULT_TABLES = (ROBUSTNESS, STEPS, OPS)
TRACES = TRACE.folder


def side_files(results: Path, side: SideTable) -> list[Path]:
    """A side table's files a reader may open: an old layout's first, then its folder's."""
    old = sorted((results / side.old_folder).glob("*.parquet")) if side.old_folder else []
    return _openable(results, old + sorted((results / side.folder).glob("*.parquet")))


def trace_files(results: Path) -> list[Path]:
    return side_files(results, TRACE)


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


def side_path(results: Path, side: SideTable, run_id: str) -> Path:
    return results / side.folder / f"{run_id}.parquet"


def trace_path(results: Path, run_id: str) -> Path:
    return side_path(results, TRACE, run_id)


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
