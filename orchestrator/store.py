"""The results directory: a Parquet dataset of runs, one file per write.

    RESULTS/runs-<time>-<run id>.parquet   rows; pandas.read_parquet(RESULTS) reads them all
    RESULTS/_jobs/<run id>/                the job's spec, raw result and log

Each write goes to a temporary name and is renamed into place, so a row appears
whole or not at all, and concurrent writers never touch the same file.  Names
starting with ``_`` or ``.`` are ignored by Parquet readers.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from .errors import StoreError
from .schema import ARROW_SCHEMA, SCHEMA_VERSION, RunRecord

JOBS = "_jobs"


def results_dir(explicit: str | os.PathLike | None) -> Path:
    return Path(explicit or os.environ.get("DLBENCH_RESULTS_DIR") or "dlbench-results")


def job_dir(results: Path, run_id: str) -> Path:
    path = results / JOBS / run_id
    path.mkdir(parents=True, exist_ok=True)
    return path


def append(results: Path, records: list[RunRecord]) -> Path:
    """Write the records as one new Parquet file, atomically."""
    results.mkdir(parents=True, exist_ok=True)
    rows = [r.model_dump() for r in records]
    table = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    final = results / f"runs-{stamp}-{records[0].run_id}.parquet"
    tmp = results / f".{final.name}.tmp"
    pq.write_table(table, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def load(results: Path) -> pd.DataFrame:
    """Every stored row; refuses rows written by a newer dlbench."""
    if not results.is_dir():
        raise StoreError(f"{results}: no such results directory")
    files = sorted(results.glob("runs-*.parquet"))
    if not files:
        return ARROW_SCHEMA.empty_table().to_pandas()
    try:
        table = pads.dataset(files, format="parquet", schema=ARROW_SCHEMA).to_table()
    except (pa.ArrowInvalid, OSError) as exc:
        raise StoreError(f"{results}: unreadable result file: {exc}") from None
    newest = pc.max(table["schema_version"]).as_py()
    if newest and newest > SCHEMA_VERSION:
        raise StoreError(f"{results}: rows of schema version {newest}; this dlbench reads "
                         f"up to {SCHEMA_VERSION}: upgrade dlbench")
    return table.to_pandas()


def ok_job_ids(results: Path) -> set[str]:
    """Ids of the jobs stored with status ok (for --resume)."""
    if not results.is_dir():
        return set()
    frame = load(results)
    return set(frame.loc[frame["status"] == "ok", "job_id"])
