"""The results directory: a Parquet dataset of runs, one file per write.

    RESULTS/runs-<time>-<run id>.parquet   rows; pandas.read_parquet(RESULTS) reads them all
    RESULTS/_traces/<run id>.parquet       a job's resource samples, one file per job
    RESULTS/_jobs/<run id>/                the job's spec, raw result and log

Each write goes to a temporary name and is renamed into place, so a row appears
whole or not at all, and concurrent writers (two ``dlbench run`` processes on the
same directory) never touch the same file: every name holds the run id.  Names
starting with ``_`` or ``.`` are ignored by Parquet readers.

Rows of an older schema version are upgraded step by step as they are read
(``upgrade``; the history is in ``schema.py``); rows of a newer one are refused.
"""

from __future__ import annotations

import datetime as dt
import os
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


# version -> the step to the next: 2 added the campaign name, the job's limits and the
# resource summary; 3 the cross-settings source.
UPGRADES = {1: _add_empty(2), 2: _add_empty(3)}


def upgrade(table: pa.Table, version: int) -> pa.Table:
    """Rows of an older schema version, brought to the current one step by step."""
    while version < SCHEMA_VERSION:
        table = UPGRADES[version](table)
        version += 1
    table = table.set_column(table.schema.get_field_index("schema_version"), "schema_version",
                             pa.array([SCHEMA_VERSION] * len(table), pa.int64()))
    return table.select(ARROW_SCHEMA.names).cast(ARROW_SCHEMA)


def _read_rows(path: Path) -> pa.Table:
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise StoreError(f"{path}: unreadable result file: {exc}") from None
    if "schema_version" not in table.column_names:
        raise StoreError(f"{path}: not a dlbench result file (no schema_version)")
    newest, oldest = pc.max(table["schema_version"]).as_py(), pc.min(table["schema_version"]).as_py()
    if newest is None:
        return ARROW_SCHEMA.empty_table()
    if newest > SCHEMA_VERSION:
        raise StoreError(f"{path.parent}: rows of schema version {newest}; this dlbench reads "
                         f"up to {SCHEMA_VERSION}: upgrade dlbench")
    try:
        return upgrade(table, oldest)
    except (pa.ArrowInvalid, KeyError, ValueError) as exc:
        raise StoreError(f"{path}: rows of schema version {oldest} do not match it: {exc}") from None


def load(results: Path) -> pd.DataFrame:
    """Every stored row, older ones upgraded; refuses rows written by a newer dlbench."""
    if not results.is_dir():
        raise StoreError(f"{results}: no such results directory")
    files = sorted(results.glob("runs-*.parquet"))
    if not files:
        return ARROW_SCHEMA.empty_table().to_pandas()
    return pa.concat_tables([_read_rows(f) for f in files]).to_pandas()


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
    folder = results / TRACES
    files = [trace_path(results, r) for r in run_ids] if run_ids is not None \
        else sorted(folder.glob("*.parquet"))
    tables = []
    for path in files:
        if not path.is_file():
            continue
        try:
            table = pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise StoreError(f"{path}: unreadable trace file: {exc}") from None
        version = int((table.schema.metadata or {}).get(b"dlbench.trace_schema_version", b"1"))
        if version > TRACE_SCHEMA_VERSION:
            raise StoreError(f"{path}: trace schema version {version}; this dlbench reads up to "
                             f"{TRACE_SCHEMA_VERSION}: upgrade dlbench")
        tables.append(table.select(TRACE_SCHEMA.names).cast(TRACE_SCHEMA))
    table = pa.concat_tables(tables) if tables else TRACE_SCHEMA.empty_table()
    return table.to_pandas().sort_values(["run_id", "t_s"], ignore_index=True)
