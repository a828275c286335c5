"""Compaction: a results directory's one-row files merged into one.

One file per job keeps every row safe the moment its job ends, but thousands of small
files are slow to read.  ``compact`` merges the row files into one, and each side
table's files into one, each merged file made visible by ``settle._swap`` so that a
compaction killed at any moment is finished or undone by the next dlbench command.  A
reader that meets a file removed under it reads the directory again.  ``dlbench run``
compacts when a directory holds more than ``COMPACT_AFTER`` row files; ``dlbench
compact`` does it at any time.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa

from .. import rowcheck
from ..errors import StoreError
from ..schema import ARROW_SCHEMA
from .layout import RUNS, row_files
from .tables import SIDE_TABLES, side_files
from .read import _gather, _in_groups
from .settle import _settle_locked, _swap
from .upgrades import _read_rows, _refuse_newer, _rewrite_locked, _side_reader
from .write import _lock, _stamp, _write_hidden

COMPACT_AFTER = 200           # row files; ``dlbench run`` compacts past this many


def row_file_count(results: Path) -> int:
    return len(row_files(results)) if results.is_dir() else 0


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
    """What ``rewrite`` or ``compact`` returned, in words: "3 row files, 2 trace files,
    0 robustness files, 0 step loss files and 0 op time files"."""
    words = [f"{count} {kind} files" for count, kind in
             zip(counts, ["row"] + [side.kind for side in SIDE_TABLES])]
    return ", ".join(words[:-1]) + " and " + words[-1]


def compact(results: Path) -> tuple[int, ...]:
    """Rewrite (``upgrades.rewrite``), then merge the row files into one and each side
    table's files into one (each made visible by ``_swap``; into more than one where they
    declare more than half the readers' bound, ``_in_groups``); returns how many files were
    merged: rows, then each of ``SIDE_TABLES``.  Safe beside running writers and readers,
    and when killed at any moment."""
    if not results.is_dir():
        raise StoreError(f"{results}: no such results directory")

    def name() -> str:
        return f"{_stamp()}-compacted-{uuid.uuid4().hex[:8]}.parquet"

    with _lock(results):
        _settle_locked(results)
        _, left = _rewrite_locked(results)      # those already said to be left in place
        merged = [sum(_merge(results, group, results / RUNS, ARROW_SCHEMA, _read_rows, "row", name(),
                             lambda table: _refuse_newer(table, results), rowcheck.ROWS)
                      for group in _in_groups([p for p in row_files(results) if p not in left]))]
        for side in SIDE_TABLES:
            merged.append(sum(_merge(results, group, results / side.folder, side.schema,
                                     _side_reader(side), side.kind, name(), rules=side.rules)
                              for group in _in_groups([p for p in side_files(results, side)
                                                       if p not in left])))
    return tuple(merged)
