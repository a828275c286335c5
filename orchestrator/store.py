"""The results directory: five Parquet datasets, rows, traces, robustness, step losses and
layer times, one file per write; and the jobs' trained models, exported to ONNX.

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
    RESULTS/.compact.lock                            the lock (``_lock``)
    RESULTS/.compaction.json                         a compaction's journal, while it swaps files

Every file in ``runs/`` has the current schema, so any Parquet reader reads the folder
whole with no options: ``pandas.read_parquet("RESULTS/runs")``, DuckDB's
``read_parquet('RESULTS/runs/*.parquet')``, polars' ``pl.read_parquet("RESULTS/runs/*.parquet")``.

Each write goes to a hidden temporary name and is renamed into place, so a file
appears whole or not at all, and concurrent writers (two ``dlbench run`` processes on
the same directory) never touch the same file: every name holds the run id.  Names
starting with ``_`` or ``.`` are ignored by Parquet readers.

Traces, robustness, step losses and layer times are a job's side tables (``SideTable``:
``TRACE``, ``ROBUSTNESS``, ``STEPS``, ``OPS``), written, read, migrated, compacted and
rescued alike, each with its own schema version.  A job's ONNX model and its FGSM images
are written and rescued as they are, never merged.

One file per job keeps every row safe the moment its job ends, but thousands of small
files are slow to read.  ``compact`` merges the row files into one, and each side
table's files into one: each merged file is written under a hidden name, a journal naming it and the
files it replaces is put on disk, one rename makes it visible and the replaced files are
removed at once (``_swap``).  A compaction killed at any moment is finished, or its
hidden file removed, by the next dlbench command that uses the directory (``settle``:
``dlbench run`` before its first job, ``compact``, ``upgrade``, ``recover``, and the
readers when they find a journal).  Readers other than dlbench see a row twice only
between that rename and the last removal (milliseconds), or after a crash in that
window until the next dlbench command; dlbench's readers leave the replaced files out
(``_superseded``).  Writers hold the lock shared and compactions exclusive, so the
temporary files found under the exclusive lock are dead writers' and are swept.  A
reader that meets a file removed under it reads the directory again.  ``dlbench run``
compacts when a directory holds more than ``COMPACT_AFTER`` row files; ``dlbench
compact`` does it at any time.

Only regular files (or links to one inside the directory) are opened; anything else
there is left out with a ``StoreWarning`` (``_openable``).

A results directory is as untrusted as a job's out/: anyone may have written its files.
A file whose footer declares more than ``FILE_BYTES`` is skipped (``_declared``), and since
a footer can lie (the reader allocates what each page's header says), each file is read
within ``READ_MEMORY`` more address space (``_memory_bound``); every row is checked by
``rowcheck``'s rules and one breaking them is left out, each with a ``StoreWarning`` naming
the file (and the run, and why).  Files are read one by one and merged every
``BATCH_FILES``, in memory proportional to their rows; past ``MANY_FILES`` files a reader
suggests ``dlbench compact``, which keeps each merged file within half of ``FILE_BYTES``.

Directories written before schema version 4 kept rows as ``RESULTS/runs-*.parquet``
and traces in ``RESULTS/_traces/``, each row as its version wrote it.  Readers read
them as they are, upgrading older rows step by step in memory (``upgrade``; the
history is in ``schema.py``).  ``migrate`` (``dlbench upgrade``, and ``dlbench run``
at its first write to a directory) rewrites every such file into the current layout
and schema, each new file written and fsynced before the old one is removed;
``compact`` migrates before it merges.  A file that cannot be read (truncated,
garbage, another schema) is left out by readers and left in place by ``migrate`` and
``compact``, each time with a ``StoreWarning`` naming it.  Rows of a newer schema
version are refused.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import re
import resource
import stat
import tempfile
import uuid
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dlbench_runner import contract

from . import files, jobdir, rowcheck
from .errors import StoreError, StoreWarning
from .schema import (ADDED_IN, ARROW_SCHEMA, OPS_SCHEMA, RENAMED_IN, ROBUSTNESS_SCHEMA, SCHEMA_VERSION, STEPS_SCHEMA,
                     TRACE_SCHEMA, upgrade_robustness,
                     RunRecord)

RUNS = "runs"
MODELS = "models"
TRANSFER = "transfer"
JOBS = "_jobs"
OLD_ROWS = "runs-*.parquet"   # rows before schema version 4, at the top of the directory
OLD_TRACES = "_traces"        # traces before schema version 4
MIGRATED = ".schema_version"  # the version the last migration brought every file to
COMPACT_AFTER = 200           # row files; ``dlbench run`` compacts past this many
READ_ATTEMPTS = 5             # a compaction may replace files while they are being read
BATCH_FILES = 256             # files read before their rows are checked and merged compactly
MANY_FILES = 1_000            # files of one table; past this many a reader suggests compacting
FILE_BYTES = 128 << 20        # a file declaring more uncompressed bytes (or values) is skipped
READ_MEMORY = 8 * FILE_BYTES   # address space reading one file may add (``_memory_bound``)
FOOTER_BYTES = 1 << 20        # the longest string, and most items of a list, in a file's footer
SAID_ROWS = 3                 # rows named in the warning about a file's rows that break a rule
if TYPE_CHECKING:
    import pandas as pd


def _integers(arrow_type):
    """pyarrow's ``types_mapper``: nullable integers stay integers in pandas (imported
    here, not at start-up: commands that read no rows need no pandas)."""
    import pandas as pd
    return pd.Int64Dtype() if arrow_type == pa.int64() else None


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


def row_file_count(results: Path) -> int:
    return len(row_files(results)) if results.is_dir() else 0


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


def append(results: Path, records: list[RunRecord]) -> Path:
    """Write the records as one new Parquet file, atomically (migrating an old directory first)."""
    _migrate_once(results)
    rows = [r.model_dump() for r in records]
    table = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)
    with _lock(results, shared=True):
        return _write_atomic(table, results / RUNS / f"{_stamp()}-{records[0].run_id}.parquet")


# -- reading files, old ones upgraded, unreadable ones left out -----------------------------
class _Unreadable(Exception):
    """A file that is not what its folder should hold; the message names it."""


def _warn(message: str) -> None:
    warnings.warn(message, StoreWarning, stacklevel=3)


def _why(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _is_current(schema: pa.Schema, target: pa.Schema) -> bool:
    """Whether a file's schema is ``target``'s, version included (read as it is)."""
    meta = schema.metadata or {}
    return (all(meta.get(key) == value for key, value in target.metadata.items()
                if key.startswith(b"dlbench."))
            and schema.remove_metadata().equals(target.remove_metadata()))


def _gather(paths: list[Path], schema: pa.Schema, read_one: Callable[[Path], pa.Table],
            kind: str, fate: str, rules: dict[str, str] | None = None,
            whole_files: bool = False) -> tuple[pa.Table, list[Path]]:
    """The rows of these files as one table of ``schema``, and the files they came from.

    Each file is read on its own (``_read_table``: within the bounds its footer declares,
    and within ``READ_MEMORY`` of memory), those of an older version by ``read_one``, which
    upgrades them; a file that cannot be read is left out with a warning naming it and its
    ``fate``.  Every ``BATCH_FILES`` files, their rows are checked by ``rules``
    (``rowcheck``) and merged into one compact table: 10,000 one-row tables kept apart took
    1.1 GiB, merged so 94 MiB (``bench/many_files.py``).  A row breaking a rule is left out with a
    warning naming its file, its run and why; with ``whole_files`` (a compaction) every row
    of its file is, and the file is not among those returned (it is left in place)."""
    parts, used, batch = [], [], []
    for path in paths:
        try:
            table = _read_table(path, kind)
            table = (table.replace_schema_metadata(schema.metadata) if _is_current(table.schema, schema)
                     else read_one(path))
        except _Unreadable as exc:
            _warn(f"{exc}; {fate}")
            continue
        batch.append((path, table))
        if len(batch) == BATCH_FILES:
            used += _checked(batch, schema, rules, fate if whole_files else None, parts)
            batch = []
    if batch:
        used += _checked(batch, schema, rules, fate if whole_files else None, parts)
    table = pa.concat_tables(parts) if parts else schema.empty_table()
    return table.replace_schema_metadata(schema.metadata), used


def _checked(batch: list[tuple[Path, pa.Table]], schema: pa.Schema, rules: dict[str, str] | None,
             whole_fate: str | None, parts: list[pa.Table]) -> list[Path]:
    """Add the batch's rows that keep ``rules`` to ``parts``, as one compact table, and
    return the files they came from (all but those left in place, with ``whole_fate``)."""
    table = pa.concat_tables([t.cast(schema) if not t.schema.equals(schema, check_metadata=False)
                              else t for _, t in batch])
    found = rowcheck.problems(table, rules) if rules is not None else {}
    paths = [path for path, _ in batch]
    if found:
        sizes = [t.num_rows for _, t in batch]
        file_of = np.repeat(np.arange(len(batch)), sizes)
        run_ids = table["run_id"]
        by_file: dict[int, list[str]] = {}
        for row, reason in sorted(found.items()):
            by_file.setdefault(int(file_of[row]), []).append(f"run {run_ids[row].as_py()}: {reason}")
        for index, said in by_file.items():
            more = f"; and {len(said) - SAID_ROWS} more rows" if len(said) > SAID_ROWS else ""
            _warn(f"{paths[index]}: {'; '.join(said[:SAID_ROWS])}{more}; "
                  + (whole_fate if whole_fate else
                     "the row left out" if len(said) == 1 else f"those {len(said)} rows left out"))
        keep = np.ones(table.num_rows, dtype=bool)
        if whole_fate:
            keep = ~np.isin(file_of, list(by_file))
            paths = [path for index, path in enumerate(paths) if index not in by_file]
        else:
            keep[list(found)] = False
        table = table.filter(pa.array(keep))
    parts.append(table.combine_chunks())
    return paths


@contextlib.contextmanager
def _memory_bound(extra: int):
    """Within the block, the process may map at most ``extra`` more bytes (RLIMIT_AS, its
    soft limit put back after): a Parquet reader allocates what a file's page headers
    declare, which its footer need not tell truly, so only the kernel's limit bounds a
    lying file.  Arrow allocates from the system's allocator meanwhile: its own
    (mimalloc) reserves address space a GiB at a time, which an honest read then could
    not have.  (Other threads share the limit meanwhile; it is far above any honest
    read's.)  Where the process's size cannot be read, no limit."""
    try:
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * resource.getpagesize()
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError):
        yield
        return
    limit = mapped + extra
    for given in (soft, hard):
        if given != resource.RLIM_INFINITY:
            limit = min(limit, given)
    pool = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        pa.set_memory_pool(pool)


def _declared_size(metadata: pq.FileMetaData) -> int:
    """What a file's footer says reading it takes: its uncompressed bytes, or 8 bytes a
    value (rows times columns, every value empty), whichever is more."""
    size = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    return max(size, metadata.num_rows * max(metadata.num_columns, 1) * 8)


def _declared(path: Path, metadata: pq.FileMetaData, kind: str) -> None:
    """Refuse a file whose footer declares more than ``FILE_BYTES`` (``_declared_size``)."""
    if _declared_size(metadata) > FILE_BYTES:
        size = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
        raise _Unreadable(f"{path}: {kind} file declaring {metadata.num_rows:,} rows and "
                          f"{size:,} bytes uncompressed, past the bound of "
                          f"{FILE_BYTES >> 20:,} MiB a file")


def _in_groups(paths: list[Path]) -> list[list[Path]]:
    """The files to merge, in groups that each declare at most ``FILE_BYTES`` / 2, so that
    no merged file is ever past the readers' bound.  (A file whose footer cannot be read
    counts for nothing: ``_gather`` says why it is left in place.)"""
    groups, size = [[]], 0
    for path in paths:
        try:
            declared = _declared_size(pq.read_metadata(path))
        except (pa.ArrowException, OSError):
            declared = 0
        if groups[-1] and size + declared > FILE_BYTES // 2:
            groups.append([])
            size = 0
        groups[-1].append(path)
        size += declared
    return groups


def _read_table(path: Path, kind: str) -> pa.Table:
    """A file's table, read only if its footer declares no more than the bounds
    (``_declared``) and only within ``READ_MEMORY`` of memory (``_memory_bound``)."""
    try:
        with pq.ParquetFile(path, pre_buffer=False, thrift_string_size_limit=FOOTER_BYTES,
                            thrift_container_size_limit=FOOTER_BYTES) as parquet:
            _declared(path, parquet.metadata, kind)
            # one thread, no read-ahead: no thread's allocator reserves address space meanwhile
            with _memory_bound(READ_MEMORY):
                return parquet.read(use_threads=False)
    except FileNotFoundError:
        raise
    except MemoryError:     # pyarrow's ArrowMemoryError too
        raise _Unreadable(f"{path}: {kind} file needing more than {READ_MEMORY >> 20:,} MiB "
                          "of memory to read") from None
    except (pa.ArrowException, OSError) as exc:
        raise _Unreadable(f"{path}: unreadable {kind} file ({_why(exc)})") from None


def _suggest_compacting(results: Path, paths: list[Path]) -> None:
    """Past ``MANY_FILES`` files of one table, say that ``dlbench compact`` merges them."""
    if len(paths) > MANY_FILES:
        _warn(f"{results}: more than {MANY_FILES:,} files in one of its tables, each read "
              f"on its own: `dlbench compact --results {results}` merges them")


# -- rows, old ones upgraded ----------------------------------------------------------------
def _field(name: str) -> pa.Field:
    """The current schema's field of a column, or of the column it was renamed to."""
    for renamed in RENAMED_IN.values():
        if name in renamed:
            return _field(renamed[name]).with_name(name)
    return ARROW_SCHEMA.field(name)


def _renamed(version: int):
    """The step to ``version``: columns renamed, their values kept."""
    def step(table: pa.Table) -> pa.Table:
        names = RENAMED_IN[version]
        return table.rename_columns([names.get(n, n) for n in table.column_names])
    step.__doc__ = f"Version {version} renamed {', '.join(f'{a} to {b}' for a, b in RENAMED_IN[version].items())}."
    return step


def _add_empty(version: int):
    """The step to ``version``: the columns it added, empty (what older rows meant)."""
    def step(table: pa.Table) -> pa.Table:
        for name in ADDED_IN[version]:
            if name not in table.column_names:
                field = _field(name)
                table = table.append_column(field, pa.nulls(len(table), field.type))
        return table
    step.__doc__ = f"Version {version} added {', '.join(ADDED_IN[version])}."
    return step


def _keep_written_version(table: pa.Table) -> pa.Table:
    """Version 4 added written_schema_version: an older row was written with its own."""
    if "written_schema_version" in table.column_names:
        return table
    return table.append_column(ARROW_SCHEMA.field("written_schema_version"),
                               table["schema_version"].cast(pa.int64()))


def torch_rows_as_pytorch(table: pa.Table) -> pa.Table:
    """Rows stored as ``torch`` by the PyTorch image become ``pytorch``.

    Before version 4, framework ``torch`` was the PyTorch port of GTDLBench's Torch7
    models; since then ``torch`` is Lua Torch7 (its framework_version starts with
    ``torch7@``) and the port is ``pytorch``.  A row whose framework_version is a
    PyTorch version (``1.7.0a0``, ``2.8.0+cu128``), or empty (a job that never
    reported one: before version 4 that was the PyTorch image too), is renamed."""
    frameworks = table["framework"].to_pylist()
    versions = table["framework_version"].to_pylist()
    renamed = ["pytorch" if fw == "torch" and not (version or "").startswith("torch7@") else fw
               for fw, version in zip(frameworks, versions)]
    return table.set_column(table.schema.get_field_index("framework"), "framework",
                            pa.array(renamed, table.schema.field("framework").type))


def _to_4(table: pa.Table) -> pa.Table:
    """Version 4: the version a row was written with, the host's timing facts, the Slurm
    node and ids, the script's own times; framework torch became Lua Torch7."""
    return torch_rows_as_pytorch(_add_empty(4)(_keep_written_version(table)))


def _to_11(table: pa.Table) -> pa.Table:
    """Version 11: ``blas`` became the BLAS library asked for, and ``blas_loaded`` the ones
    training ran on, by name (the old ``blas`` held the mapped files' paths)."""
    table = _renamed(11)(table)
    paths = table["blas_loaded"].to_pylist()
    names = [";".join(contract.blas.loaded(p.split(";"))) or None if p else None for p in paths]
    table = table.set_column(table.schema.get_field_index("blas_loaded"), "blas_loaded",
                             pa.array(names, pa.string()))
    return _add_empty(11)(table)


# version -> the step to the next: 2 added the campaign name, the job's limits and the
# resource summary; 3 the cross-settings source; 4 the version a row was written with,
# the host's timing facts, the Slurm node and ids and the script's own times (and torch
# rows of the PyTorch port read as pytorch); 5 renamed the script's times to the paper
# spans; 6 added the GPU's model, driver and memory; 7 the image builds a job ran beside;
# 8 the parameters' and the saved model's bytes; 9 the migration check's figures; 10 its
# time on the host; 11 the compute libraries asked for (blas, onednn), the loaded ones
# by name (blas_loaded, the old blas); 12 the fair profile's checks; 13 each job's noise
# facts (load at its end and highest, other processes' CPU time; host_load_avg kept: the
# run's start, which the older rows measured); 14 why the host did not take a job's FGSM
# images; 15 the overrides a job was asked for (empty: not known, the report compares with
# today's defaults).
UPGRADES = {1: _add_empty(2), 2: _add_empty(3), 3: _to_4, 4: _renamed(5), 5: _add_empty(6),
            6: _add_empty(7), 7: _add_empty(8), 8: _add_empty(9), 9: _add_empty(10), 10: _to_11,
            11: _add_empty(12), 12: _add_empty(13), 13: _add_empty(14), 14: _add_empty(15)}


def upgrade(table: pa.Table, version: int) -> pa.Table:
    """Rows of an older schema version, brought to the current one step by step."""
    while version < SCHEMA_VERSION:
        table = UPGRADES[version](table)
        version += 1
    table = table.set_column(table.schema.get_field_index("schema_version"), "schema_version",
                             pa.array([SCHEMA_VERSION] * len(table), pa.int64()))
    return table.select(ARROW_SCHEMA.names).cast(ARROW_SCHEMA)


def _newer(results: Path, version) -> StoreError:
    return StoreError(f"{results}: rows of schema version {version}; this dlbench reads up to "
                      f"{SCHEMA_VERSION}: upgrade dlbench")


def _read_rows(path: Path) -> pa.Table:
    """A row file's rows, upgraded to the current schema."""
    table = _read_table(path, "row")
    if "schema_version" not in table.column_names:
        raise _Unreadable(f"{path}: not a dlbench row file (no schema_version)")
    newest, oldest = pc.max(table["schema_version"]).as_py(), pc.min(table["schema_version"]).as_py()
    if newest is None:
        return ARROW_SCHEMA.empty_table()
    if newest > SCHEMA_VERSION:
        raise _newer(path.parent, newest)
    try:
        return upgrade(table, oldest)
    except (pa.ArrowException, KeyError, ValueError) as exc:
        raise _Unreadable(f"{path}: rows of schema version {oldest} do not match it "
                          f"({_why(exc)})") from None


def _refuse_newer(table: pa.Table, results: Path) -> pa.Table:
    newest = pc.max(table["schema_version"]).as_py()
    if newest is not None and newest > SCHEMA_VERSION:
        raise _newer(results, newest)
    return table


def load(results: Path) -> pd.DataFrame:
    """Every stored row in the current schema (older ones upgraded, a run stored twice once),
    in the order they were recorded; integer columns are pandas' nullable ``Int64``.  A file
    that cannot be read is left out with a ``StoreWarning``; rows written by a newer dlbench
    are refused."""
    if not results.is_dir():
        raise StoreError(f"{results}: no such results directory")
    _settle_for_reading(results)
    for _ in range(READ_ATTEMPTS):
        try:
            paths = _superseded(results, row_files(results))
            _suggest_compacting(results, paths)
            table, _ = _gather(paths, ARROW_SCHEMA, _read_rows, "row", "skipped", rowcheck.ROWS)
        except FileNotFoundError:
            continue            # compacted or migrated under us: read the directory again
        # a row can still be in two files (an old layout's file and its rewrite, after a
        # crash between the two): each run is read once
        frame = _refuse_newer(table, results).to_pandas(types_mapper=_integers).sort_values("recorded_at", kind="stable")
        return frame.drop_duplicates("run_id", ignore_index=True)
    raise StoreError(f"{results}: the row files kept changing while being read; try again")


def ok_job_ids(results: Path, campaign: str | None = None) -> set[str]:
    """Ids of the jobs stored with status ok (for --resume); of one campaign when named."""
    if not results.is_dir():
        return set()
    frame = load(results)
    ok = frame["status"] == "ok"
    if campaign is not None:
        ok &= frame["campaign"] == campaign
    return set(frame.loc[ok, "job_id"])


# -- side tables: resource traces, robustness ----------------------------------------------
def side_path(results: Path, side: SideTable, run_id: str) -> Path:
    return results / side.folder / f"{run_id}.parquet"


def trace_path(results: Path, run_id: str) -> Path:
    return side_path(results, TRACE, run_id)


def write_side(results: Path, side: SideTable, run_id: str, rows: list[dict]) -> Path:
    """A job's rows of a side table as one Parquet file, atomically (possibly with none)."""
    _migrate_once(results)
    table = pa.Table.from_pylist([dict(row, run_id=run_id) for row in rows], schema=side.schema)
    with _lock(results, shared=True):
        return _write_atomic(table, side_path(results, side, run_id))


def write_trace(results: Path, run_id: str, samples: list[dict]) -> Path:
    """A job's resource samples as one Parquet file, atomically (possibly with no rows)."""
    return write_side(results, TRACE, run_id, samples)


def _side_reader(side: SideTable) -> Callable[[Path], pa.Table]:
    def read(path: Path) -> pa.Table:
        table = _read_table(path, side.kind)
        try:
            version = int((table.schema.metadata or {}).get(side.version_key, b"1"))
        except ValueError:
            version = 1
        if version > side.version:
            raise StoreError(f"{path}: {side.kind} schema version {version}; this dlbench reads "
                             f"up to {side.version}: upgrade dlbench")
        try:
            if version < side.version and side.upgrade is not None:
                table = side.upgrade(table, version)
            return table.select(side.schema.names).cast(side.schema)
        except (pa.ArrowException, KeyError, ValueError) as exc:
            raise _Unreadable(f"{path}: not a dlbench {side.kind} file ({_why(exc)})") from None
    return read


def load_side(results: Path, side: SideTable, run_ids=None) -> pd.DataFrame:
    """A side table's rows of every job (or of the given run ids), in ``side.order``; a
    file that cannot be read is left out with a ``StoreWarning``."""
    _settle_for_reading(results)
    for _ in range(READ_ATTEMPTS):
        try:
            paths = _superseded(results, side_files(results, side))
            _suggest_compacting(results, paths)
            table, _ = _gather(paths, side.schema, _side_reader(side), side.kind, "skipped", side.rules)
        except FileNotFoundError:
            continue            # compacted or migrated under us: read the directory again
        if run_ids is not None:
            table = table.filter(pc.is_in(table["run_id"], pa.array(list(run_ids), pa.string())))
        frame = table.to_pandas(types_mapper=_integers if side.integers else None)
        return frame.sort_values(list(side.order), kind="stable", ignore_index=True)
    raise StoreError(f"{results}: the {side.kind} files kept changing while being read; try again")


def load_traces(results: Path, run_ids=None) -> pd.DataFrame:
    """The resource samples of every job (or of the given run ids), by run id and time."""
    return load_side(results, TRACE, run_ids)


def load_robustness(results: Path, run_ids=None) -> pd.DataFrame:
    """The accuracy under attack of every job (or of the given run ids), in the order each
    job's runner measured it."""
    return load_side(results, ROBUSTNESS, run_ids)


def load_steps(results: Path, run_ids=None) -> pd.DataFrame:
    """The step losses of every fair job (or of the given run ids), step by step."""
    return load_side(results, STEPS, run_ids)


def load_ops(results: Path, run_ids=None) -> pd.DataFrame:
    """The layer times of every fair job (or of the given run ids), in each job's order."""
    return load_side(results, OPS, run_ids)


# -- the jobs' ONNX models ------------------------------------------------------------------
def model_path(results: Path, run_id: str) -> Path:
    return results / MODELS / f"{run_id}.onnx"


def write_model(results: Path, run_id: str, model: bytes) -> Path:
    """A job's exported ONNX model, atomically, as ``RESULTS/models/<run id>.onnx``."""
    with _lock(results, shared=True):
        return _write_atomic(model, model_path(results, run_id))


# -- the jobs' FGSM images, for transfer attacks ------------------------------------------
def transfer_path(results: Path, run_id: str) -> Path:
    return results / TRANSFER / f"{run_id}.npz"


def write_transfer(results: Path, run_id: str, images: bytes) -> Path:
    """A job's FGSM images (the file its runner wrote, as it is), atomically, as
    ``RESULTS/transfer/<run id>.npz``; ``transfer.read`` checks them where they are used."""
    with _lock(results, shared=True):
        return _write_atomic(images, transfer_path(results, run_id))


# -- the lock, and a compaction made crash-safe ----------------------------------------------
LOCK = ".compact.lock"
JOURNAL = ".compaction.json"    # a compaction making its file visible: the names involved
JOURNAL_LIMIT = 64 << 20        # bytes (a name per file replaced: 100,000 files take ~6 MiB)


@contextlib.contextmanager
def _lock(results: Path, shared: bool = False, wait: bool = True):
    """The results directory's lock: exclusive for migration, compaction and ``settle``,
    shared for a job's writes (its side tables and row); so under the exclusive lock every
    temporary file in ``runs/`` and the side tables' folders is a dead writer's.  Without ``wait``,
    ``BlockingIOError`` when someone holds it."""
    fd = os.open(results / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
        yield
    finally:
        os.close(fd)            # and with it the lock


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
    is writing): half-written rows, traces and compactions, a journal or a migration mark
    never renamed into place."""
    for folder, pattern in ((results / RUNS, ".*.tmp"), (results / MODELS, ".*.tmp"),
                            (results / TRANSFER, ".*.tmp"),
                            *((results / side.folder, ".*.tmp") for side in SIDE_TABLES),
                            (results, f"{JOURNAL}.*.tmp"), (results, f"{MIGRATED}.*.tmp")):
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


# -- migration and compaction ---------------------------------------------------------------
def _migrated(results: Path) -> int | None:
    try:
        return int(files.read_regular(results / MIGRATED, 64))
    except (OSError, files.Refused, ValueError):
        return None


def _migrate_once(results: Path) -> None:
    """Before the first write to a directory this dlbench has not migrated: migrate it."""
    if _migrated(results) != SCHEMA_VERSION:
        results.mkdir(parents=True, exist_ok=True)
        with _lock(results):
            _migrate_locked(results)


def _rewrite(paths: list[Path], folder: Path, schema: pa.Schema, read_one, kind: str,
             verify: bool, rules: dict[str, str] | None = None) -> tuple[int, set]:
    """Every file of ``paths`` not in ``folder`` with ``schema``, rewritten there; the old
    file is removed once its new one is on disk.  Returns how many were rewritten, and the
    files left in place since they cannot be read (those already current too, if
    ``verify``: read whole, which a first write need not pay for)."""
    todo, left, current = [], set(), []
    for path in paths:
        if path.parent == folder:
            with contextlib.suppress(pa.ArrowException, OSError):
                if _is_current(pq.read_schema(path), schema):
                    current.append(path)
                    continue
        try:
            todo.append((path, read_one(path)))   # all read before any is written: a newer
        except _Unreadable as exc:                # version is refused with nothing changed
            _warn(f"{exc}; left in place")
            left.add(path)
    if verify and current:
        left |= set(current) - set(_gather(current, schema, read_one, kind, "left in place", rules,
                                           whole_files=True)[1])
    for path, table in todo:
        new = _write_atomic(table.replace_schema_metadata(schema.metadata),
                            folder / path.name.removeprefix("runs-"))
        if new != path:
            path.unlink()
    return len(todo), left


def _migrate_locked(results: Path, verify: bool = False) -> tuple[tuple[int, ...], set]:
    """Returns how many files were rewritten (rows, then each side table) and those left."""
    rows, left = _rewrite(row_files(results), results / RUNS, ARROW_SCHEMA, _read_rows, "row",
                          verify, rowcheck.ROWS)
    counts = [rows]
    for side in SIDE_TABLES:
        count, left_side = _rewrite(side_files(results, side), results / side.folder, side.schema,
                                    _side_reader(side), side.kind, verify, side.rules)
        counts.append(count)
        left |= left_side
    with contextlib.suppress(OSError):
        (results / OLD_TRACES).rmdir()           # unless a file was left in place
    tmp = results / f"{MIGRATED}.{os.getpid()}.tmp"
    tmp.write_text(f"{SCHEMA_VERSION}\n")
    os.replace(tmp, results / MIGRATED)
    return tuple(counts), left


def migrate(results: Path) -> tuple[int, ...]:
    """Bring a results directory to the current layout and schema (``dlbench upgrade``):
    every row file of an older version or layout rewritten into ``runs/`` with its rows
    upgraded, every side table's file into its folder (traces into ``traces/``); the files
    already current are read whole, so that any damaged one is named.  Returns how many
    files were rewritten: rows, then each of ``SIDE_TABLES``.  Safe beside running
    writers, readers and compactions."""
    if not results.is_dir():
        raise StoreError(f"{results}: no such results directory")
    with _lock(results):
        _settle_locked(results)
        return _migrate_locked(results, verify=True)[0]


def _merge(results: Path, paths: list[Path], folder: Path, schema: pa.Schema, read_one, kind: str,
           name: str, check=lambda table: table, rules: dict[str, str] | None = None) -> int:
    """Merge the files into one (``_swap``); a file that cannot be read, or holds a row
    breaking ``rules``, is left in place, as it is."""
    if len(paths) < 2:
        return 0
    table, used = _gather(paths, schema, read_one, kind, "left in place", rules, whole_files=True)
    if len(used) < 2:
        return 0
    final = folder / name
    _swap(results, _write_hidden(check(table), final), final, used)
    return len(used)


def counted(counts: tuple[int, ...]) -> str:
    """What ``migrate`` or ``compact`` returned, in words: "3 row files, 2 trace files,
    0 robustness files, 0 step loss files and 0 op time files"."""
    words = [f"{count} {kind} files" for count, kind in
             zip(counts, ["row"] + [side.kind for side in SIDE_TABLES])]
    return ", ".join(words[:-1]) + " and " + words[-1]


def compact(results: Path) -> tuple[int, ...]:
    """Migrate (above), then merge the row files into one and each side table's files into
    one (each made visible by ``_swap``; into more than one where they declare more than
    half the readers' bound, ``_in_groups``); returns how many files were merged: rows, then
    each of ``SIDE_TABLES``.  Safe beside running writers and readers, and when killed at
    any moment."""
    if not results.is_dir():
        raise StoreError(f"{results}: no such results directory")

    def name() -> str:
        return f"{_stamp()}-compacted-{uuid.uuid4().hex[:8]}.parquet"

    with _lock(results):
        _settle_locked(results)
        _, left = _migrate_locked(results)      # those already said to be left in place
        merged = [sum(_merge(results, group, results / RUNS, ARROW_SCHEMA, _read_rows, "row", name(),
                             lambda table: _refuse_newer(table, results), rowcheck.ROWS)
                      for group in _in_groups([p for p in row_files(results) if p not in left]))]
        for side in SIDE_TABLES:
            merged.append(sum(_merge(results, group, results / side.folder, side.schema,
                                     _side_reader(side), side.kind, name(), rules=side.rules)
                              for group in _in_groups([p for p in side_files(results, side)
                                                       if p not in left])))
    return tuple(merged)


# -- a results directory that can take the rows, and rows rescued when it cannot -----------
RESCUED = "_rescued"
MIN_FREE_MB = 100               # free space a run needs to start; DLBENCH_MIN_FREE_MB overrides
MIN_FREE_VARIABLE = "DLBENCH_MIN_FREE_MB"
RESCUE_RESERVE = 1 << 20        # bytes set aside for each job's row before the job starts
RESCUED_LIMIT = 1 << 30         # a rescued row with its trace (a sample a second: ~100 B each),
                                # robustness rows, and perhaps its ONNX model and FGSM images
                                # (at most 64 MiB together, in base64)
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


def write_json(path: Path, document) -> None:
    """A small JSON file, written whole or not at all (no empty file on a full disk)."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(document, indent=1))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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
             sides: dict[str, list[dict]] | None = None, model: bytes | None = None,
             transfer: bytes | None = None) -> Kept:
        """Keep the row, its trace samples and its rows of the other side tables (``sides``:
        by folder, as ``Collected`` holds them) in the room set aside, with
        the ONNX model and the FGSM images when the room can take them too; when it cannot
        (the room is sized for the row), those two go to files in the temporary directory
        that the kept row names.  When even the row does not fit, everything goes to one
        file in the temporary directory."""
        blobs = {name: blob for name, blob in (("model", model), ("transfer", transfer))
                 if blob is not None}
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
              sides: dict[str, list[dict]] | None = None, model: bytes | None = None,
              transfer: bytes | None = None) -> None:
    """Store a finished job's trace, its rows of the other side tables (``sides``, by
    folder: robustness, steps, ops), ONNX model and FGSM images (if it has them) and row; if the
    results directory cannot take them, keep them in the rescue file and raise one
    StoreError saying how to recover them."""
    problems = []
    sides = sides or {}
    for side, rows in ((TRACE, samples), *((t, sides.get(t.folder)) for t in RESULT_TABLES)):
        if side is not TRACE and not rows:
            continue
        try:
            write_side(results, side, record.run_id, rows)
        except (OSError, pa.ArrowException, OverflowError, ValueError) as exc:
            problems.append(f"its {side.kind}: {_reason(exc)}")
    if model is not None:
        try:
            write_model(results, record.run_id, model)
        except OSError as exc:
            problems.append(f"its ONNX model: {_reason(exc)}")
    if transfer is not None:
        try:
            write_transfer(results, record.run_id, transfer)
        except OSError as exc:
            problems.append(f"its FGSM images: {_reason(exc)}")
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
    kept = rescue.keep(record, samples, stored, sides, model, transfer)
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
