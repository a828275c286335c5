"""`dlbench results`: the stored rows as a table for the terminal, drawn from pyarrow's rows
(no pandas), or as CSV or JSON, every stored column as pandas writes it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .. import store
from .draw import View, _console, _fixed2, _pct, _percent, _rate, check_columns, draw

if TYPE_CHECKING:
    import pyarrow as pa

RUN_COLUMNS = {  # stored column -> heading, in the table's order
    "recorded_at": "when", "framework": "framework", "dataset": "data", "profile": "profile",
    "device": "dev", "threads": "thr", "status": "status", "accuracy": "accuracy %",
    "setup_time_s": "setup s", "train_time_s": "train s", "test_time_s": "test s",
    "train_images_per_s": "img/s", "param_count": "params", "cpu_percent_mean": "CPU %",
    "host_load_avg": "load", "run_id": "run",
}
RUN_DROP = ["host_load_avg", "cpu_percent_mean", "param_count", "setup_time_s", "run_id",
            "train_images_per_s", "recorded_at", "threads", "device", "test_time_s"]
RUN_FORMATS = {"accuracy": lambda v: _pct(100 * v), "setup_time_s": _fixed2,
               "train_time_s": _fixed2, "test_time_s": _fixed2, "train_images_per_s": _rate, "cpu_percent_mean": _percent,
               "host_load_avg": _fixed2, "param_count": lambda v: f"{v:,}",
               "recorded_at": lambda v: v.strftime("%m-%d %H:%M"),
               "run_id": lambda v: v[:8]}


def results_text(rows: pa.Table, fmt: str, width: int | None = 80,
                 color_system: str | None = None, columns: list[str] | None = None,
                 wide: bool = False) -> str:
    """The stored runs as a table (fmt 'table'), CSV or JSON (every stored column, as stored)."""
    if fmt == "csv":
        from .text import csv_text      # pandas writes the CSV

        return csv_text(store.frame(rows))
    if fmt == "json":
        return store.frame(rows).to_json(orient="records", date_format="iso", indent=1)
    if columns is not None:
        check_columns(columns, rows.column_names)
    console = _console(width, color_system)
    draw(console, runs_view(rows, columns), fit=width is not None and not wide,
         drop=columns is None)
    return console.file.getvalue()


def runs_view(rows: pa.Table, columns: list[str] | None = None) -> View:
    """The stored rows, one a line: the known columns, or ``columns`` (any stored ones)."""
    import pyarrow as pa

    keys = list(RUN_COLUMNS) if columns is None else columns
    ordered = rows.sort_by("recorded_at")
    values = [ordered.column(k).to_pylist() for k in keys]
    shown = [[_stored(column[n], RUN_FORMATS.get(k, str)) for k, column in zip(keys, values)]
             for n in range(len(ordered))]
    numeric = {i for i, k in enumerate(keys) if pa.types.is_integer(rows.schema.field(k).type)
               or pa.types.is_floating(rows.schema.field(k).type)}
    return View(f"{len(rows)} stored run(s)", [RUN_COLUMNS.get(k, k) for k in keys], shown,
                numeric=numeric, wrap=set(), keys=keys, drop=RUN_DROP)


def _stored(value, fmt) -> str:
    """A stored value as shown: an empty one (null, NaN) as "-"; lists (the per-epoch
    columns) as they are."""
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "-"
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt(value)
