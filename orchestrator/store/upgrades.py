"""Older schema versions: rows upgraded step by step as they are read, and the rewrite of a
whole results directory into the current layout and schema (``dlbench upgrade``).

Directories written before schema version 4 kept rows as ``RESULTS/runs-*.parquet``
and traces in ``RESULTS/_traces/``, each row as its version wrote it.  Readers read
them as they are, upgrading older rows step by step in memory (``upgrade``; the
history is in ``UPGRADES``' comment and ``schema.py``).  ``rewrite`` (``dlbench upgrade``,
and ``dlbench run`` at its first write to a directory) rewrites every such file into the
current layout and schema, each new file written and fsynced before the old one is
removed; ``compact`` rewrites before it merges.  A file that cannot be read (truncated,
garbage, another schema) is left out by readers and left in place by ``rewrite`` and
``compact``, each time with a ``StoreWarning`` naming it.  Rows of a newer schema
version are refused.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dlbench_runner import contract

from .. import files, rowcheck
from ..errors import StoreError
from ..schema import ADDED_IN, ARROW_SCHEMA, CHECK_COLUMNS, RENAMED_IN, SCHEMA_VERSION
from .layout import OLD_TRACES, REWRITTEN, RUNS, _warn, _why, row_files
from .tables import SIDE_TABLES, SideTable, side_files
from .read import _gather, _is_current, _read_table, _Unreadable
from .settle import _settle_locked
from .write import _lock, _write_atomic


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
# today's defaults); 16 the platforms a job deployed its model on (empty: none); 17 the
# workers a job trained over, its engine and each worker's time (empty: one process); 18
# the hosts they ran on (empty: one process); 19 the seconds of setup spent compiling the
# training step ahead (empty: none compiled).
UPGRADES = {1: _add_empty(2), 2: _add_empty(3), 3: _to_4, 4: _renamed(5), 5: _add_empty(6),
            6: _add_empty(7), 7: _add_empty(8), 8: _add_empty(9), 9: _add_empty(10), 10: _to_11,
            11: _add_empty(12), 12: _add_empty(13), 13: _add_empty(14), 14: _add_empty(15),
            15: _add_empty(16), 16: _add_empty(17),
            17: _add_empty(18), 18: _add_empty(19)}


def upgrade(table: pa.Table, version: int) -> pa.Table:
    """Rows of an older schema version, brought to the current one step by step; a check's
    column that rows written without the check lack is empty in them, as in the steps."""
    while version < SCHEMA_VERSION:
        table = UPGRADES[version](table)
        version += 1
    for name in CHECK_COLUMNS:
        if name not in table.column_names:
            field = ARROW_SCHEMA.field(name)
            table = table.append_column(field, pa.nulls(len(table), field.type))
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


# -- the rewrite ---------------------------------------------------------------------------
def _rewritten(results: Path) -> int | None:
    try:
        return int(files.read_regular(results / REWRITTEN, 64))
    except (OSError, files.Refused, ValueError):
        return None


def _rewrite_once(results: Path) -> None:
    """Before the first write to a directory this dlbench has not rewritten: rewrite it."""
    if _rewritten(results) != SCHEMA_VERSION:
        results.mkdir(parents=True, exist_ok=True)
        with _lock(results):
            _rewrite_locked(results)


def _rewrite_files(paths: list[Path], folder: Path, schema: pa.Schema, read_one, kind: str,
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


def _rewrite_locked(results: Path, verify: bool = False) -> tuple[tuple[int, ...], set]:
    """Returns how many files were rewritten (rows, then each side table) and those left."""
    rows, left = _rewrite_files(row_files(results), results / RUNS, ARROW_SCHEMA, _read_rows, "row",
                                verify, rowcheck.ROWS)
    counts = [rows]
    for side in SIDE_TABLES:
        count, left_side = _rewrite_files(side_files(results, side), results / side.folder, side.schema,
                                          _side_reader(side), side.kind, verify, side.rules)
        counts.append(count)
        left |= left_side
    with contextlib.suppress(OSError):
        (results / OLD_TRACES).rmdir()           # unless a file was left in place
    tmp = results / f"{REWRITTEN}.{os.getpid()}.tmp"
    tmp.write_text(f"{SCHEMA_VERSION}\n")
    os.replace(tmp, results / REWRITTEN)
    return tuple(counts), left


def rewrite(results: Path) -> tuple[int, ...]:
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
        return _rewrite_locked(results, verify=True)[0]
