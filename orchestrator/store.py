"""The results directory: a Parquet dataset of runs, one file per write.

    RESULTS/runs-<time>-<run id>.parquet   rows; pandas.read_parquet(RESULTS) reads them all
    RESULTS/_traces/<run id>.parquet       a job's resource samples, one file per job
    RESULTS/_jobs/<run id>/                the job's spec, raw result and log

Each write goes to a temporary name and is renamed into place, so a row appears
whole or not at all, and concurrent writers (two ``dlbench run`` processes on the
same directory) never touch the same file: every name holds the run id.  Names
starting with ``_`` or ``.`` are ignored by Parquet readers.

One file per job keeps every row safe the moment its job ends, but thousands of
small files are slow to read.  ``compact`` merges the row files of the current
schema version into one file, and the trace files into one, each written
atomically before the files it replaces are removed; compactions take a lock, and
a reader that meets a file removed under it reads the directory again.
``dlbench run`` compacts when a directory holds more than ``COMPACT_AFTER`` row
files; ``dlbench compact`` does it at any time.

Rows of an older schema version are upgraded step by step as they are read
(``upgrade``; the history is in ``schema.py``); rows of a newer one are refused.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import uuid
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import StoreError
from .schema import (ADDED_IN, ARROW_SCHEMA, SCHEMA_VERSION, TRACE_SCHEMA, TRACE_SCHEMA_VERSION,
                     RunRecord)

JOBS = "_jobs"
TRACES = "_traces"
COMPACT_AFTER = 200        # row files; ``dlbench run`` compacts past this many
READ_ATTEMPTS = 5          # a compaction may replace files while they are being read


def results_dir(explicit: str | os.PathLike | None) -> Path:
    return Path(explicit or os.environ.get("DLBENCH_RESULTS_DIR") or "dlbench-results")


def job_dir(results: Path, run_id: str) -> Path:
    path = results / JOBS / run_id
    path.mkdir(parents=True, exist_ok=True)
    return path


def _write_atomic(table: pa.Table, final: Path) -> Path:
    """Write to a hidden temporary name in the same folder, fsync, rename into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{os.getpid()}.tmp"
    try:
        pq.write_table(table, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()
    try:
        folder = os.open(final.parent, os.O_RDONLY)
    except OSError:
        return final
    try:
        os.fsync(folder)    # the rename itself survives a crash
    except OSError:
        pass
    finally:
        os.close(folder)
    return final


def append(results: Path, records: list[RunRecord]) -> Path:
    """Write the records as one new Parquet file, atomically."""
    rows = [r.model_dump() for r in records]
    table = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    return _write_atomic(table, results / f"runs-{stamp}-{records[0].run_id}.parquet")


# -- reading rows, old ones upgraded --------------------------------------------------------
def _add_empty(version: int):
    """The step to ``version``: the columns it added, empty (what older rows meant)."""
    def step(table: pa.Table) -> pa.Table:
        for name in ADDED_IN[version]:
            if name not in table.column_names:
                table = table.append_column(ARROW_SCHEMA.field(name),
                                            pa.nulls(len(table), ARROW_SCHEMA.field(name).type))
        return table
    step.__doc__ = f"Version {version} added {', '.join(ADDED_IN[version])}."
    return step


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
    """Version 4 added the script's own times; framework torch became Lua Torch7."""
    return torch_rows_as_pytorch(_add_empty(4)(table))


# version -> the step to the next: 2 added the campaign name, the job's limits and the
# resource summary; 3 the cross-settings source; 4 the script's own times (and torch
# rows of the PyTorch port read as pytorch).
UPGRADES = {1: _add_empty(2), 2: _add_empty(3), 3: _to_4}


def upgrade(table: pa.Table, version: int) -> pa.Table:
    """Rows of an older schema version, brought to the current one step by step."""
    while version < SCHEMA_VERSION:
        table = UPGRADES[version](table)
        version += 1
    table = table.set_column(table.schema.get_field_index("schema_version"), "schema_version",
                             pa.array([SCHEMA_VERSION] * len(table), pa.int64()))
    return table.select(ARROW_SCHEMA.names).cast(ARROW_SCHEMA)


def _read_rows(path: Path) -> tuple[pa.Table, dict[str, int]]:
    """A row file's rows, upgraded, and the written version of those older than current."""
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        raise
    except (pa.ArrowInvalid, OSError) as exc:
        raise StoreError(f"{path}: unreadable result file: {exc}") from None
    if "schema_version" not in table.column_names:
        raise StoreError(f"{path}: not a dlbench result file (no schema_version)")
    newest, oldest = pc.max(table["schema_version"]).as_py(), pc.min(table["schema_version"]).as_py()
    if newest is None:
        return ARROW_SCHEMA.empty_table(), {}
    if newest > SCHEMA_VERSION:
        raise StoreError(f"{path.parent}: rows of schema version {newest}; this dlbench reads "
                         f"up to {SCHEMA_VERSION}: upgrade dlbench")
    written = {} if oldest == SCHEMA_VERSION else {
        run: version for run, version in zip(table["run_id"].to_pylist(),
                                             table["schema_version"].to_pylist())}
    try:
        return upgrade(table, oldest), written
    except (pa.ArrowInvalid, KeyError, ValueError) as exc:
        raise StoreError(f"{path}: rows of schema version {oldest} do not match it: {exc}") from None


def load(results: Path) -> pd.DataFrame:
    """Every stored row, older ones upgraded; refuses rows written by a newer dlbench."""
    return read(results)[0]


def read(results: Path) -> tuple[pd.DataFrame, dict[str, int]]:
    """Every stored row, older ones upgraded, and the schema version each older row was
    written with (by run id: the report keeps rows of different versions apart)."""
    if not results.is_dir():
        raise StoreError(f"{results}: no such results directory")
    for _ in range(READ_ATTEMPTS):
        tables, written = [], {}
        try:
            for path in sorted(results.glob("runs-*.parquet")):
                table, older = _read_rows(path)
                tables.append(table)
                written.update(older)
        except FileNotFoundError:
            continue            # compacted under us: read the directory again
        if not tables:
            return ARROW_SCHEMA.empty_table().to_pandas(), {}
        # a compaction writes its merged file before it removes the ones merged: a reader
        # between the two (or after a crash between them) sees those rows twice
        frame = pa.concat_tables(tables).to_pandas()
        return frame.drop_duplicates("run_id", ignore_index=True), written
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


# -- resource traces ------------------------------------------------------------------------
def trace_path(results: Path, run_id: str) -> Path:
    return results / TRACES / f"{run_id}.parquet"


def write_trace(results: Path, run_id: str, samples: list[dict]) -> Path:
    """A job's resource samples as one Parquet file, atomically (possibly with no rows)."""
    rows = [dict(sample, run_id=run_id) for sample in samples]
    table = pa.Table.from_pylist(rows, schema=TRACE_SCHEMA)
    return _write_atomic(table, trace_path(results, run_id))


def load_traces(results: Path, run_ids=None) -> pd.DataFrame:
    """The resource samples of every job (or of the given run ids), by run id and time."""
    for _ in range(READ_ATTEMPTS):
        try:
            table = _read_traces(results)
        except FileNotFoundError:
            continue            # compacted under us: read the directory again
        if run_ids is not None:
            table = table.filter(pc.is_in(table["run_id"], pa.array(list(run_ids), pa.string())))
        return table.to_pandas().sort_values(["run_id", "t_s"], ignore_index=True)
    raise StoreError(f"{results}: the trace files kept changing while being read; try again")


def _read_traces(results: Path, paths: list[Path] | None = None) -> pa.Table:
    tables = []
    for path in paths if paths is not None else sorted((results / TRACES).glob("*.parquet")):
        try:
            table = pq.read_table(path)
        except FileNotFoundError:
            raise
        except (pa.ArrowInvalid, OSError) as exc:
            raise StoreError(f"{path}: unreadable trace file: {exc}") from None
        version = int((table.schema.metadata or {}).get(b"dlbench.trace_schema_version", b"1"))
        if version > TRACE_SCHEMA_VERSION:
            raise StoreError(f"{path}: trace schema version {version}; this dlbench reads up to "
                             f"{TRACE_SCHEMA_VERSION}: upgrade dlbench")
        tables.append(table.select(TRACE_SCHEMA.names).cast(TRACE_SCHEMA))
    return pa.concat_tables(tables) if tables else TRACE_SCHEMA.empty_table()


# -- compaction -----------------------------------------------------------------------------
@contextlib.contextmanager
def _compaction_lock(results: Path):
    with open(results / ".compact.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def row_file_count(results: Path) -> int:
    return sum(1 for _ in results.glob("runs-*.parquet")) if results.is_dir() else 0


def compact(results: Path) -> tuple[int, int]:
    """Merge the row files of the current schema version into one, and the trace files
    into one; returns how many files of each were merged.  Rows of older versions stay
    in their files as written.  Safe beside running writers and readers."""
    if not results.is_dir():
        raise StoreError(f"{results}: no such results directory")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    name = f"{stamp}-compacted-{uuid.uuid4().hex[:8]}"
    with _compaction_lock(results):
        rows, tables = [], []
        for path in sorted(results.glob("runs-*.parquet")):
            table, older = _read_rows(path)
            if not older:                   # older rows stay in their files, as written
                rows.append(path)
                tables.append(table)
        if len(rows) > 1:
            _write_atomic(pa.concat_tables(tables).replace_schema_metadata(ARROW_SCHEMA.metadata),
                          results / f"runs-{name}.parquet")
            for path in rows:
                path.unlink(missing_ok=True)
        traces = sorted((results / TRACES).glob("*.parquet"))
        if len(traces) > 1:
            _write_atomic(_read_traces(results, traces), results / TRACES / f"traces-{name}.parquet")
            for path in traces:
                path.unlink(missing_ok=True)
    return (len(rows) if len(rows) > 1 else 0), (len(traces) if len(traces) > 1 else 0)
