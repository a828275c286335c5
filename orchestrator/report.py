"""Show stored results: a terminal table, or CSV and JSON for scripts."""

from __future__ import annotations

import pandas as pd
from rich.console import Console
from rich.table import Table

COLUMNS = {  # column -> heading
    "recorded_at": "when", "framework": "framework", "dataset": "data", "profile": "profile",
    "device": "dev", "threads": "thr", "status": "status", "accuracy": "accuracy",
    "setup_time_s": "setup s", "train_time_s": "train s", "test_time_s": "test s",
    "train_images_per_s": "img/s", "param_count": "params", "run_id": "run",
}
NUMERIC = {"threads", "accuracy", "setup_time_s", "train_time_s", "test_time_s",
           "train_images_per_s", "param_count"}


def results_table(frame: pd.DataFrame) -> Table:
    table = Table(title=f"{len(frame)} stored run(s)")
    for column, heading in COLUMNS.items():
        table.add_column(heading, justify="right" if column in NUMERIC else "left", no_wrap=True)
    for _, row in frame.sort_values("recorded_at").iterrows():
        table.add_row(*(_cell(column, row[column]) for column in COLUMNS))
    return table


def _cell(column, value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "-"
    if column == "accuracy":
        return f"{value:.4f}"
    if column == "recorded_at":
        return pd.Timestamp(value).strftime("%m-%d %H:%M")
    if column == "run_id":
        return value[:8]
    if column == "train_images_per_s":
        return f"{value:.0f}"
    if column == "status":
        return value if value == "ok" else f"[red]{value}[/red]"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def render(frame: pd.DataFrame, fmt: str, console: Console | None = None) -> str | None:
    """Print the table (fmt 'table'), or return CSV or JSON text."""
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "json":
        return frame.to_json(orient="records", date_format="iso", indent=1)
    (console or Console()).print(results_table(frame))
    return None
