"""The results directory: five Parquet datasets, rows, traces, robustness, step losses and
layer times, one file per write; and the jobs' trained models, exported to ONNX.

One module a concern, each importing only those above it in this list:

    layout       the folders and files, the side tables, the files a reader may open
    write        a file written whole beside other processes; the lock
    settle       what a killed process leaves (a compaction's journal, temporary files,
                 empty rescue rooms), cleared by ``settle``
    read         the directory's files read as untrusted, within bounds
    upgrades     older schema versions upgraded step by step, and ``rewrite``
                 (``dlbench upgrade``)
    rows         a job's rows written, every job's rows read (``load``, ``load_traces``, ...)
    compaction   one-row files merged into one (``compact``)
    rescue       a row the directory could not take kept, and ``recover``

Every name the rest of dlbench uses is here: ``store.load``, ``store.store_row``.
"""

from __future__ import annotations

from ..errors import StoreError
from ..schema import SCHEMA_VERSION
from .compaction import COMPACT_AFTER, compact, counted, row_file_count
from .layout import (JOBS, JOURNAL, LOCK, MODELS, OLD_ROWS, OLD_TRACES, OPS, RESCUED, RESULT_TABLES, REWRITTEN,
                     ROBUSTNESS, RUNS, SIDE_TABLES, STEPS, TRACE, TRACES, TRANSFER, SideTable, job_dir, model_path,
                     results_dir, row_files, side_files, side_path, trace_files, trace_path, transfer_path)
from .read import BATCH_FILES, FILE_BYTES, FOOTER_BYTES, MANY_FILES, READ_ATTEMPTS, READ_MEMORY, SAID_ROWS
from .rescue import (BLOB_LIMIT, BLOB_SUFFIXES, BLOB_WORDS, DISK_ERRORS, MIN_FREE_MB, MIN_FREE_VARIABLE,
                     RESCUE_RESERVE, Kept, Rescue, check_results, min_free_bytes, recover, store_row)
from .rows import (append, load, load_ops, load_robustness, load_side, load_steps, load_traces, ok_job_ids,
                   write_model, write_side, write_trace, write_transfer)
from .settle import JOURNAL_LIMIT, RESCUED_LIMIT, settle
from .upgrades import UPGRADES, rewrite, torch_rows_as_pytorch, upgrade
from .write import write_json

__all__ = [
    "StoreError", "SCHEMA_VERSION",
    # layout
    "RUNS", "MODELS", "TRANSFER", "JOBS", "RESCUED", "OLD_ROWS", "OLD_TRACES", "REWRITTEN", "LOCK", "JOURNAL",
    "SideTable", "TRACE", "ROBUSTNESS", "STEPS", "OPS", "SIDE_TABLES", "RESULT_TABLES", "TRACES",
    "results_dir", "job_dir", "row_files", "side_files", "trace_files", "side_path", "trace_path",
    "model_path", "transfer_path",
    # write, settle
    "write_json", "JOURNAL_LIMIT", "RESCUED_LIMIT", "settle",
    # read
    "READ_ATTEMPTS", "BATCH_FILES", "MANY_FILES", "FILE_BYTES", "READ_MEMORY", "FOOTER_BYTES", "SAID_ROWS",
    # upgrades
    "UPGRADES", "upgrade", "torch_rows_as_pytorch", "rewrite",
    # rows
    "append", "write_side", "write_trace", "write_model", "write_transfer",
    "load", "ok_job_ids", "load_side", "load_traces", "load_robustness", "load_steps", "load_ops",
    # compaction
    "COMPACT_AFTER", "row_file_count", "counted", "compact",
    # rescue
    "MIN_FREE_MB", "MIN_FREE_VARIABLE", "RESCUE_RESERVE", "DISK_ERRORS", "min_free_bytes", "check_results",
    "Kept", "BLOB_WORDS", "BLOB_SUFFIXES", "BLOB_LIMIT", "Rescue", "store_row", "recover",
]
