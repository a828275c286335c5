"""Reading a results directory's Parquet files, which anyone may have written.

A results directory is as untrusted as a job's out/.  A file whose footer declares more
than ``FILE_BYTES`` is skipped (``_declared``), and since a footer can lie (the reader
allocates what each page's header says), each file is read within ``READ_MEMORY`` more
address space (``_memory_bound``); every row is checked by ``rowcheck``'s rules and one
breaking them is left out, each with a ``StoreWarning`` naming the file (and the run, and
why).  Files are read one by one and merged every ``BATCH_FILES``, in memory proportional
to their rows; past ``MANY_FILES`` files a reader suggests ``dlbench compact``, which keeps
each merged file within half of ``FILE_BYTES`` (``_in_groups``).
"""

from __future__ import annotations

import contextlib
import resource
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import rowcheck
from .layout import _warn, _why

READ_ATTEMPTS = 5             # a compaction may replace files while they are being read
BATCH_FILES = 256             # files read before their rows are checked and merged compactly
MANY_FILES = 1_000            # files of one table; past this many a reader suggests compacting
FILE_BYTES = 128 << 20        # a file declaring more uncompressed bytes (or values) is skipped
READ_MEMORY = 8 * FILE_BYTES   # address space reading one file may add (``_memory_bound``)
FOOTER_BYTES = 1 << 20        # the longest string, and most items of a list, in a file's footer
SAID_ROWS = 3                 # rows named in the warning about a file's rows that break a rule


def _integers(arrow_type):
    """pyarrow's ``types_mapper``: nullable integers stay integers in pandas (imported
    here, not at start-up: commands that read no rows need no pandas)."""
    import pandas as pd
    return pd.Int64Dtype() if arrow_type == pa.int64() else None


# -- reading files, old ones upgraded, unreadable ones left out -----------------------------
class _Unreadable(Exception):
    """A file that is not what its folder should hold; the message names it."""


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
