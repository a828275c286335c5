"""A job's rows written, and every job's rows read: the row, its side tables' rows, its
ONNX model and FGSM images, each written whole (``write``); the rows read in the current
schema (``read``, ``upgrades``), each run once.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from .. import rowcheck
from ..errors import StoreError
from ..schema import ARROW_SCHEMA
from .layout import RUNS, model_path, row_files, transfer_path
from .tables import OPS, ROBUSTNESS, STEPS, TRACE, SideTable, side_files, side_path
from .read import READ_ATTEMPTS, _gather, _integers, _suggest_compacting
from .settle import _settle_for_reading, _superseded
from .upgrades import _read_rows, _refuse_newer, _rewrite_once, _side_reader
from .write import _lock, _stamp, _write_atomic

if TYPE_CHECKING:
    import pandas as pd

    from ..records import RunRecord


# -- rows ------------------------------------------------------------------------------------
def append(results: Path, records: list[RunRecord]) -> Path:
    """Write the records as one new Parquet file, atomically (rewriting an old directory first)."""
    _rewrite_once(results)
    rows = [r.model_dump() for r in records]
    table = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)
    with _lock(results, shared=True):
        return _write_atomic(table, results / RUNS / f"{_stamp()}-{records[0].run_id}.parquet")


def load(results: Path) -> pd.DataFrame:
    """Every stored row in the current schema (older ones upgraded, a run stored twice once),
    in the order they were recorded; integer columns are pandas' nullable ``Int64``.  A file
    that cannot be read is left out with a ``StoreWarning``; rows written by a newer dlbench
    are refused."""
    return frame(load_table(results))


def load_table(results: Path) -> pa.Table:
    """``load``'s rows as pyarrow's table, for what needs no pandas (``dlbench results``)."""
    if not results.is_dir():
        raise StoreError(f"{results}: no such results directory")
    _settle_for_reading(results)
    for _ in range(READ_ATTEMPTS):
        try:
            paths = _superseded(results, row_files(results))
            _suggest_compacting(results, paths)
            table, _ = _gather(paths, ARROW_SCHEMA, _read_rows, "row", "skipped", rowcheck.ROWS)
        except FileNotFoundError:
            continue            # compacted or rewritten under us: read the directory again
        # a row can still be in two files (an old layout's file and its rewrite, after a
        # crash between the two): each run is read once, as first recorded (a stable sort)
        table = _refuse_newer(table, results).sort_by("recorded_at")
        seen, first = set(), []
        for n, run_id in enumerate(table["run_id"].to_pylist()):
            if run_id not in seen:
                seen.add(run_id)
                first.append(n)
        return table if len(first) == len(table) else table.take(first)
    raise StoreError(f"{results}: the row files kept changing while being read; try again")


def frame(table: pa.Table) -> pd.DataFrame:
    """Rows as pandas holds them: integer columns as nullable ``Int64``."""
    return table.to_pandas(types_mapper=_integers)


def ok_job_ids(results: Path, campaign: str | None = None) -> set[str]:
    """Ids of the jobs stored with status ok (for --resume); of one campaign when named."""
    if not results.is_dir():
        return set()
    frame = load(results)
    ok = frame["status"] == "ok"
    if campaign is not None:
        ok &= frame["campaign"] == campaign
    return set(frame.loc[ok, "job_id"])


# -- side tables: resource traces, robustness, step losses, layer times ----------------------
def write_side(results: Path, side: SideTable, run_id: str, rows: list[dict]) -> Path:
    """A job's rows of a side table as one Parquet file, atomically (possibly with none)."""
    _rewrite_once(results)
    table = pa.Table.from_pylist([dict(row, run_id=run_id) for row in rows], schema=side.schema)
    with _lock(results, shared=True):
        return _write_atomic(table, side_path(results, side, run_id))


def write_trace(results: Path, run_id: str, samples: list[dict]) -> Path:
    """A job's resource samples as one Parquet file, atomically (possibly with no rows)."""
    return write_side(results, TRACE, run_id, samples)


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
            continue            # compacted or rewritten under us: read the directory again
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
def write_model(results: Path, run_id: str, model: bytes) -> Path:
    """A job's exported ONNX model, atomically, as ``RESULTS/models/<run id>.onnx``."""
    with _lock(results, shared=True):
        return _write_atomic(model, model_path(results, run_id))


# -- the jobs' FGSM images, for transfer attacks ------------------------------------------
def write_transfer(results: Path, run_id: str, images: bytes) -> Path:
    """A job's FGSM images (the file its runner wrote, as it is), atomically, as
    ``RESULTS/transfer/<run id>.npz``; ``transfer.read`` checks them where they are used."""
    with _lock(results, shared=True):
        return _write_atomic(images, transfer_path(results, run_id))
