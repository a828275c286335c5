"""The results directory: five Parquet datasets, rows, traces, robustness, step losses and
layer times, one file per write; and the jobs' trained models, exported to ONNX.

One module a concern, each importing only those above it in this list:

    layout       the folders and files, the files a reader may open
    tables       the side tables: each one's folder, schema, version and rules
    write        a file written whole beside other processes; the lock
    settle       what a killed process leaves (a compaction's journal, temporary files,
                 empty rescue rooms), cleared by ``settle``
    read         the directory's files read as untrusted, within bounds
    upgrades     older schema versions upgraded step by step, and ``rewrite``
                 (``dlbench upgrade``)
    rows         a job's rows written, every job's rows read (``load``, ``load_traces``, ...)
    compaction   one-row files merged into one (``compact``)
    rescue       a row the directory could not take kept, and ``recover``

Every name the rest of dlbench uses is here: ``store.load``, ``store.store_row``.  Each is
imported from its module when it is first used, so that a command pays only for the modules
it uses: ``store.results_dir`` (``dlbench doctor``) needs no pyarrow.
"""

from __future__ import annotations

import importlib

# Each module (relative to this package), and the names the rest of dlbench takes from it; none
# is a module's own name (importing a module binds its name here: ``store.rescue``).
_NAMES = {
    "..errors": ("StoreError",),
    "..schema": ("SCHEMA_VERSION",),
    ".layout": ("RUNS", "MODELS", "TRANSFER", "JOBS", "RESCUED", "OLD_ROWS", "OLD_TRACES", "REWRITTEN",
                "LOCK", "JOURNAL", "results_dir", "job_dir", "row_files", "model_path", "transfer_path"),
    ".tables": ("SideTable", "TRACE", "ROBUSTNESS", "STEPS", "OPS", "PLATFORMS", "SIDE_TABLES", "RESULT_TABLES", "TRACES",
                "side_files", "trace_files", "side_path", "trace_path"),
    ".write": ("write_json",),
    ".settle": ("JOURNAL_LIMIT", "RESCUED_LIMIT"),
    ".read": ("READ_ATTEMPTS", "BATCH_FILES", "MANY_FILES", "FILE_BYTES", "READ_MEMORY", "FOOTER_BYTES",
              "SAID_ROWS"),
    ".upgrades": ("UPGRADES", "upgrade", "torch_rows_as_pytorch", "rewrite"),
    ".rows": ("append", "write_side", "write_trace", "write_model", "write_transfer", "load", "load_table",
              "frame", "ok_job_ids", "load_side", "load_traces", "load_robustness", "load_steps", "load_ops"),
    ".compaction": ("COMPACT_AFTER", "row_file_count", "counted", "compact"),
    ".rescue": ("MIN_FREE_MB", "MIN_FREE_VARIABLE", "RESCUE_RESERVE", "DISK_ERRORS", "min_free_bytes",
                "check_results", "Kept", "BLOB_WORDS", "BLOB_SUFFIXES", "BLOB_LIMIT", "Rescue", "store_row",
                "recover"),
}
_MODULE = {name: module for module, names in _NAMES.items() for name in names}
_OWN = {module[1:] for module in _NAMES if module.startswith(".") and not module.startswith("..")}

__all__ = list(_MODULE)


def __getattr__(name: str):
    """A name of this package, imported from its module at its first use; a module of the
    package (``store.rescue``) likewise."""
    if name in _OWN:
        return importlib.import_module(f".{name}", __name__)
    if name not in _MODULE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(_MODULE[name], __name__), name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _OWN)
