"""The stored runs and the report as text: tables for the terminal, Markdown, CSV and JSON.

Every function returns the text; the CLI prints it.  A table is drawn for a terminal
``width`` columns wide, in colour where ``color_system`` names one (rich's names:
"standard", "256", "truecolor"; None for plain text).
"""

from __future__ import annotations

import dataclasses
import io
import json

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from . import compare
from .views import section_views

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
    if value is None or value is pd.NA or (isinstance(value, float) and pd.isna(value)):
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


def results_text(frame: pd.DataFrame, fmt: str, width: int = 80, color_system: str | None = None,
                 whole: bool = False) -> str:
    """The stored runs as a table (fmt 'table'; cut to ``width`` unless ``whole``), CSV or JSON."""
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "json":
        return frame.to_json(orient="records", date_format="iso", indent=1)
    console = _console(width, color_system)
    if whole:
        _print_whole(console, results_table(frame))
    else:
        console.print(results_table(frame))
    return console.file.getvalue()


def _console(width: int, color_system: str | None) -> Console:
    """A console that draws into a string, as the CLI's own would on its terminal."""
    return Console(file=io.StringIO(), width=width, color_system=color_system,
                   force_terminal=color_system is not None, soft_wrap=True)


# --- the comparison report ---

def report_table(rep: compare.Report, width: int = 80, color_system: str | None = None) -> str:
    """The report's tables for the terminal, each printed whole however wide."""
    console = _console(width, color_system)
    console.print(f"[bold]dlbench report[/bold]: {len(rep.rows)} stored run(s) on "
                  f"{len(rep.sections)} machine(s) / schema version(s)")
    for section in rep.sections:
        console.rule(f"[bold]rows from[/bold] {escape(section.title)}", style="cyan")
        for view in section_views(rep, section):
            table = Table(title=escape(view.title), title_justify="left")
            for i, column in enumerate(view.columns):
                table.add_column(escape(column), justify="right" if i in view.numeric else "left",
                                 no_wrap=i in view.numeric)
            for row in view.rows:
                cells = [escape(c) for c in row]
                for i in view.verdicts:
                    cells[i] = _coloured(row[i])
                table.add_row(*cells)
            _print_whole(console, table)
    for note in rep.notes():
        console.print(f"- {note}", highlight=False, markup=False)
    return console.file.getvalue()


def _print_whole(console: Console, table: Table) -> None:
    """A table wider than the console is printed whole, as `docker ps` does, not cut into ellipses."""
    width = console.width
    console.width = max(width, Measurement.get(console, console.options.update_width(4096),
                                               table).maximum)
    try:
        console.print(table)
    finally:
        console.width = width


def _coloured(verdict: str) -> str:
    colour = {compare.REPRODUCED: "green", compare.NOT_REPRODUCED: "red"}.get(compare.kind(verdict), "dim")
    return f"[{colour}]{escape(verdict)}[/{colour}]"


def report_markdown(rep: compare.Report) -> str:
    lines = ["# dlbench report", "",
             f"{len(rep.rows)} stored run(s) on {len(rep.sections)} machine(s) / schema version(s).", ""]
    for section in rep.sections:
        lines += [f"## Rows from {section.title}", ""]
        for view in section_views(rep, section):
            lines += [f"### {view.title}", "", _md_row(view.columns),
                      "|" + "|".join("---:" if i in view.numeric else "---"
                                     for i in range(len(view.columns))) + "|"]
            lines += [_md_row(row) for row in view.rows] + [""]
    lines += ["## Notes", ""] + [f"- {note}" for note in rep.notes()]
    return "\n".join(lines) + "\n"


def _md_row(cells) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


CSV_DROP = ["settings_kind"]
LISTS = ["framework_versions", "accuracy_caveats", "ratio_caveats"]   # "; "-joined in the CSV

# The JSON report's shape (`dlbench report --format json`), documented in docs/reports.md:
#   1  (no "format_version" key) tolerance_points, reference, notes, machines, groups; a
#      group's published cell as paper_accuracy_pct / paper_train_time_s / paper_test_time_s,
#      one "verdict" on accuracy, paper_train_time_ratio.
#   2  "format_version" and "ratio_tolerance_factor"; the published cell renamed published_*
#      (paper_train_time_s / paper_test_time_s are the rows' paper spans, as
#      paper_*_time_s_median/_min/_max); accuracy_verdict with accuracy_caveats,
#      train_time_span / test_time_span, ratio_span, published_train_time_ratio,
#      ratio_vs_published, ratio_verdict with ratio_caveats, framework_versions.
JSON_FORMAT_VERSION = 2


def report_frame(rep: compare.Report, join_lists: bool = True) -> pd.DataFrame:
    """One flat row per group, with its machine: the CSV form (lists joined with "; ")."""
    machines = pd.DataFrame([{"section": s.index, "host_name": s.host_name,
                              "host_cpu_model": s.host_cpu_model, "schema_version": s.schema_version}
                             for s in rep.sections])
    frame = rep.groups.drop(columns=CSV_DROP)
    if join_lists:
        frame = frame.assign(**{c: frame[c].map("; ".join) for c in LISTS})
    if len(machines):
        frame = machines.merge(frame, on="section")
    return frame.assign(tolerance_points=rep.tolerance, ratio_tolerance_factor=rep.ratio_tolerance)


def report_json(rep: compare.Report) -> str:
    frame = report_frame(rep, join_lists=False)
    document = {
        "format_version": JSON_FORMAT_VERSION,
        "tolerance_points": rep.tolerance,
        "ratio_tolerance_factor": rep.ratio_tolerance,
        "reference": rep.reference.meta,
        "notes": rep.notes(),
        "machines": [dataclasses.asdict(s) | {"title": s.title} for s in rep.sections],
        "groups": json.loads(frame.to_json(orient="records", double_precision=15)),
    }
    return json.dumps(document, indent=1, ensure_ascii=False)


def render_report(rep: compare.Report, fmt: str, width: int = 80,
                  color_system: str | None = None) -> str:
    """The report as terminal tables (fmt 'table'), Markdown, CSV or JSON text."""
    if fmt == "md":
        return report_markdown(rep)
    if fmt == "csv":
        return report_frame(rep).to_csv(index=False)
    if fmt == "json":
        return report_json(rep)
    return report_table(rep, width, color_system)
