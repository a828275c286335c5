"""Show stored results: a terminal table, or CSV and JSON for scripts; and the report
that compares them with the published study (terminal, Markdown, CSV, JSON; HTML in html.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from . import compare, store
from .errors import StoreError, UsageError

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


def render(frame: pd.DataFrame, fmt: str, console: Console | None = None) -> str | None:
    """Print the table (fmt 'table'), or return CSV or JSON text."""
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "json":
        return frame.to_json(orient="records", date_format="iso", indent=1)
    (console or Console()).print(results_table(frame))
    return None


# --- the comparison report: the same tables for the terminal, Markdown and HTML ---

@dataclasses.dataclass
class View:
    """One table of the report, already formatted: what every renderer shows."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    numeric: set[int]
    verdict: int | None = None      # index of the verdict column, coloured where it can be
    wrap: set[int] = dataclasses.field(default_factory=lambda: {4})   # the settings column


RESOURCE_HEADINGS = {"memory_peak_bytes": "peak memory GiB", "cpu_percent_mean": "CPU %",
                     "gpu_util_mean": "GPU %", "gpu_memory_peak_bytes": "GPU memory GiB"}
SETTINGS = ["framework", "data", "device", "profile", "settings", "threads"]


def section_views(rep: compare.Report, section: compare.Section) -> list[View]:
    groups = rep.groups[rep.groups["section"] == section.index]
    views = [_measured(groups, rep.resources), _against_paper(groups)]
    ratios = groups[groups["ratio_baseline"].notna()]
    if len(ratios):
        views.append(_ratios(ratios))
    return views


def _setting_cells(g) -> list[str]:
    return [g.framework, g.dataset, g.device, g.profile, g.settings,
            "-" if pd.isna(g.threads) else str(g.threads)]


def _measured(groups: pd.DataFrame, resources: list[str]) -> View:
    columns = SETTINGS + ["runs", "train s", "test s", "accuracy %", "train img/s", "test img/s"]
    columns += [RESOURCE_HEADINGS[c] for c in resources]
    rows = []
    for g in groups.itertuples():
        runs = f"{g.ok}/{g.runs} ok" + (f" ({g.not_ok})" if g.not_ok else "")
        cells = _setting_cells(g) + [runs] + [
            _stat(g, metric, fmt) for metric, fmt in (
                ("train_time_s", _seconds), ("test_time_s", _seconds), ("accuracy_pct", _pct),
                ("train_images_per_s", _rate), ("test_images_per_s", _rate))]
        cells += [_stat(g, c, _gib if c.endswith("bytes") else _percent) for c in resources]
        rows.append(cells)
    return View("Measured: median [min–max] over the ok runs", columns, rows,
                numeric=set(range(len(SETTINGS) + 1, len(columns))))


def _against_paper(groups: pd.DataFrame) -> View:
    columns = SETTINGS[:5] + ["accuracy %", "paper accuracy %", "Δ points", "verdict",
                              "train s", "paper train s", "test s", "paper test s †"]
    rows = []
    for g in groups.itertuples():
        rows.append([g.framework, g.dataset, g.device, g.profile, g.settings] + [
            _num(g.accuracy_pct_median, _pct), _num(g.paper_accuracy_pct, _pct),
            _num(g.accuracy_diff_points, lambda v: f"{v:+.2f}"), g.verdict,
            _num(g.train_time_s_median, _seconds), _num(g.paper_train_time_s, _published),
            _num(g.test_time_s_median, _seconds),
            _num(g.paper_test_time_s, _published) + (" †" if _present(g.paper_test_time_note) else "")])
    return View("Against the paper (GTDLBench, Server1)", columns, rows,
                numeric={5, 6, 7, 9, 10, 11, 12}, verdict=8)


def _ratios(groups: pd.DataFrame) -> View:
    columns = ["data", "device", "profile", "threads", "framework", "train s",
               "÷ baseline here", "÷ baseline in paper"]
    rows = []
    for g in groups.itertuples():
        if _present(g.paper_train_time_ratio):
            paper = _ratio(g.paper_train_time_ratio)
        else:
            paper = f"not compared ({g.profile} profile)" if g.profile != "paper" else "no paper cell"
        rows.append([g.dataset, g.device, g.profile, "-" if pd.isna(g.threads) else str(g.threads),
                     g.framework, _num(g.train_time_s_median, _seconds),
                     f"{_ratio(g.train_time_ratio)} (÷ {g.ratio_baseline})", paper])
    return View("Training-time ratios (times differ across machines; ratios compare)", columns, rows,
                numeric={5, 6, 7}, wrap=set())


def _stat(g, metric: str, fmt) -> str:
    median, low, high = (getattr(g, f"{metric}_{s}") for s in ("median", "min", "max"))
    if not _present(median):
        return "-"
    text = fmt(median)
    if g.ok > 1 and high > low:
        text += f" [{fmt(low)}–{fmt(high)}]"
    return text


def _present(value) -> bool:
    return value is not None and not pd.isna(value)


def _num(value, fmt) -> str:
    return fmt(value) if _present(value) else "-"


def _seconds(v: float) -> str:
    return f"{v:,.1f}" if v >= 100 else f"{v:.2f}"


def _published(v: float) -> str:
    return f"{v:,.2f}"


def _pct(v: float) -> str:
    return f"{v:.2f}"


def _percent(v: float) -> str:
    return f"{v:.0f}"


def _rate(v: float) -> str:
    return f"{v:,.0f}"


def _gib(v: float) -> str:
    return f"{v / 2**30:.2f}"


def _ratio(v) -> str:
    return f"{v:.2f}×"


def report_table(rep: compare.Report, console: Console) -> None:
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
                if view.verdict is not None:
                    cells[view.verdict] = _coloured(row[view.verdict])
                table.add_row(*cells)
            _print_whole(console, table)
    for note in rep.notes():
        console.print(f"- {note}", highlight=False, markup=False)


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
    colour = {compare.REPRODUCED: "green", compare.NOT_REPRODUCED: "red"}.get(verdict, "dim")
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


def report_frame(rep: compare.Report) -> pd.DataFrame:
    """One flat row per group, with its machine: the CSV form."""
    machines = pd.DataFrame([{"section": s.index, "host_name": s.host_name,
                              "host_cpu_model": s.host_cpu_model, "schema_version": s.schema_version}
                             for s in rep.sections])
    frame = rep.groups.drop(columns=CSV_DROP)
    if len(machines):
        frame = machines.merge(frame, on="section")
    return frame.assign(tolerance_points=rep.tolerance)


def report_json(rep: compare.Report) -> str:
    frame = report_frame(rep)
    document = {
        "tolerance_points": rep.tolerance,
        "reference": rep.reference.meta,
        "notes": rep.notes(),
        "machines": [dataclasses.asdict(s) | {"title": s.title} for s in rep.sections],
        "groups": json.loads(frame.to_json(orient="records", double_precision=15)),
    }
    return json.dumps(document, indent=1, ensure_ascii=False)


def render_report(rep: compare.Report, fmt: str, console: Console | None = None) -> str | None:
    """Print the report (fmt 'table'), or return it as Markdown, CSV or JSON text."""
    if fmt == "md":
        return report_markdown(rep)
    if fmt == "csv":
        return report_frame(rep).to_csv(index=False)
    if fmt == "json":
        return report_json(rep)
    report_table(rep, console or Console())
    return None


def make_report(results: Path, fmt: str | None, html_dir: Path | None, tolerance: float,
                console: Console | None = None) -> tuple[str | None, Path | None]:
    """The whole `dlbench report`: load, compare, render; returns (text, page written)."""
    if not 0 <= tolerance <= 100:
        raise UsageError(f"--tolerance {tolerance:g}: a tolerance is 0 points or more, at most 100")
    frame = store.load(results)
    if not len(frame):
        raise StoreError(f"{results}: no stored runs to report (run `dlbench run` first)")
    traces = store.load_traces(results) if html_dir is not None else None   # only the page plots them
    rep = compare.build(frame, traces, tolerance)
    page = None
    if html_dir is not None:
        from .html import write_page
        page = write_page(rep, html_dir)
    text = None
    if fmt is not None or html_dir is None:
        text = render_report(rep, fmt or "table", console)
    return text, page
