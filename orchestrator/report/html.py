"""The report as one self-contained HTML page: what was judged first (one line a group),
then the charts (Plotly, its library inlined once, each chart's data downloadable as CSV),
then every table of the report, then its rules.  Nothing is fetched from anywhere."""

from __future__ import annotations

import contextlib
import datetime as dt
import html
import re
import urllib.parse
from pathlib import Path

import pandas as pd
import plotly.io
import plotly.offline

from .. import __version__
from ..errors import DlbenchError
from . import paper, reference_rows, tta
from .charts import Chart, Missing, charts, machine_label
from .text import csv_text
from .views import (View, correlation_views, fair_views, platform_views, reference_lines, scaling_views,
                    section_views)

PAGE = "index.html"
PLOT_CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False}

STYLE = """
html { overflow-y: scroll; }  /* the scroll bar there from the start: charts sized once fit */
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1400px; padding: 0 1em;
       color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.8em; border-bottom: 2px solid #ccd; }
table { border-collapse: collapse; margin: 0.6em 0 1em; font-size: 13px; }
caption { text-align: left; font-weight: 600; padding-bottom: 0.3em; }
th, td { border: 1px solid #ccd; padding: 3px 7px; vertical-align: top; }
th { background: #eef; text-align: left; cursor: pointer; user-select: none; }
th[aria-sort=ascending]::after { content: " ▲"; } th[aria-sort=descending]::after { content: " ▼"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr[hidden] { display: none; }
input.filter { font: inherit; font-size: 13px; margin: 0.4em 0 0; padding: 2px 6px; width: 22em;
               max-width: 100%; }
.reproduced, .as-expected { background: #d9f2d9; }
.not-reproduced, .not-as-expected { background: #f8d7d7; }
.not-comparable { color: #666; }
td.verdict { min-width: 9em; max-width: 19em; } td.settings { max-width: 14em; overflow-wrap: anywhere; }
td.wrap { min-width: 12em; max-width: 28em; }
figure { margin: 1em 0 2.2em; } figcaption { color: #444; font-size: 13px; max-width: 70em; }
.meta, .missing { color: #555; } .scroll { overflow-x: auto; max-width: 100%; }
.js-plotly-plot, .plot-container { max-width: 100%; } nav.site { font-size: 13px; margin-bottom: 1em; }
.notes li { margin-bottom: 0.4em; max-width: 80em; } details { margin: 0.6em 0; }
summary { cursor: pointer; font-weight: 600; } a.csv { font-size: 13px; margin-left: 0.6em; }
"""


# Every table sorts by a click on a heading (numbers as numbers, "-" last) and filters by
# the words typed above it (a row stays when it holds every word); plain code, no library.
TABLE_SCRIPT = """
function dlbenchKey(cell) {
  const text = cell.textContent.trim();
  const number = text.replace(/,/g, '').match(/^[-+]?(\\d+\\.?\\d*|\\.\\d+)(e[-+]?\\d+)?/i);
  return number ? parseFloat(number[0]) : text.toLowerCase();
}
function dlbenchSort(table, column, heading) {
  const body = table.tBodies[0];
  const up = heading.getAttribute('aria-sort') !== 'ascending';
  for (const th of table.tHead.rows[0].cells) th.removeAttribute('aria-sort');
  heading.setAttribute('aria-sort', up ? 'ascending' : 'descending');
  const rows = [...body.rows].map((row, i) => [dlbenchKey(row.cells[column]), i, row]);
  rows.sort((a, b) => {
    const [x, y] = [a[0], b[0]];
    const missing = (x === '-' || x === '') - (y === '-' || y === '');
    if (missing) return missing;                                   // empty cells last, either way
    const order = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0)
                                        : (typeof x === 'number' ? -1 : 1);
    return (up ? order : -order) || a[1] - b[1];
  });
  for (const [, , row] of rows) body.appendChild(row);
}
function dlbenchFilter(table, text) {
  const words = text.toLowerCase().split(/\\s+/).filter(Boolean);
  for (const row of table.tBodies[0].rows)
    row.hidden = !words.every(word => row.textContent.toLowerCase().includes(word));
}
for (const table of document.querySelectorAll('table.sortable')) {
  const input = document.createElement('input');
  input.type = 'search'; input.className = 'filter'; input.placeholder = 'filter rows: type words';
  input.setAttribute('aria-label', 'filter the rows of the table below');
  input.addEventListener('input', () => dlbenchFilter(table, input.value));
  const box = table.closest('.scroll') || table;
  box.parentNode.insertBefore(input, box);
  [...table.tHead.rows[0].cells].forEach((th, column) => {
    th.tabIndex = 0; th.title = 'sort by this column';
    th.addEventListener('click', () => dlbenchSort(table, column, th));
    th.addEventListener('keydown', e => { if (e.key === 'Enter') dlbenchSort(table, column, th); });
  });
}
"""


def write_page(rep: paper.Report, directory: Path) -> Path:
    """Write DIRECTORY/index.html; returns its path."""
    text = render_page(rep)
    page = directory / PAGE
    tmp = directory / f".{PAGE}.tmp"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(page)
    except FileExistsError:
        raise DlbenchError(f"--html {directory}: not a directory") from None
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise DlbenchError(f"--html {directory}: cannot write the page there: {exc.strerror}") from None
    return page


def render_page(rep: paper.Report, plotly_src: str | None = None, nav: str = "") -> str:
    """The page's HTML: the plotting library inlined, or loaded from ``plotly_src`` (a
    relative address: a site's pages share one copy); ``nav`` (HTML) goes above the title."""
    esc = html.escape
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    found = charts(rep)
    drawn = [c for c in found if isinstance(c, Chart)]
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>dlbench report</title>", f"<style>{STYLE}</style>",
        # the plotting library, once, inline: the page works offline
        (("" if not drawn else f'<script src="{esc(plotly_src)}"></script>' if plotly_src else
          f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>')),
        "</head><body>", nav, "<h1>dlbench report</h1>",
        f'<p class="meta">{len(rep.rows)} stored run(s), {len(rep.groups)} group(s), on '
        f"{len(rep.sections)} machine(s) / schema version(s); GTDLBench's published numbers "
        f"(Server1) beside them. Written by dlbench {esc(__version__)} on {now}. The rules "
        f'are at the end: <a href="#rules">rules</a>.</p>',
        "<h2>What was judged</h2>", _machines(rep), _verdicts(rep),
        "<h2>Charts</h2>",
    ]
    parts += [_figure(c) if isinstance(c, Chart) else
              f'<h3>{esc(c.title)}</h3><p class="missing">Not drawn: {esc(c.why)}.</p>' for c in found]
    parts.append("<h2>Tables</h2>")
    for section in rep.sections:
        label = machine_label(rep, section.index)
        parts.append(f"<details open><summary>{esc(label + ': ' if label else '')}{esc(section.title)}"
                     f"</summary>")
        parts += [_table(view) for view in section_views(rep, section) + tta.views(rep, section)
                  + platform_views(rep, section) + scaling_views(rep, section)
                  + correlation_views(rep, section)
                  + fair_views(rep, section)]
        heading, lines = reference_lines(rep, section)
        if lines:
            parts.append(f"<h3>{esc(heading)}</h3><ul>"
                         + "".join(f"<li>{esc(line)}</li>" for line in lines) + "</ul>")
        parts.append("</details>")
    parts += ['<h2 id="rules">Rules</h2>',
              '<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in rep.notes()) + "</ul>",
              f"<script>{TABLE_SCRIPT}</script>", "</body></html>"]
    return "\n".join(p for p in parts if p) + "\n"


def _machines(rep: paper.Report) -> str:
    if len(rep.sections) < 2:
        return f'<p class="meta">Machine: {html.escape(rep.sections[0].title)}.</p>'
    return '<ul class="meta">' + "".join(
        f"<li>{machine_label(rep, s.index)}: {html.escape(s.title)}</li>" for s in rep.sections) + "</ul>"


# --- what was judged: one line a group ---

def _verdicts(rep: paper.Report) -> str:
    """One row a group, one short line a cell, coloured by verdict; the full verdict and its
    caveats in the cell's tooltip (and in the tables below)."""
    groups = rep.groups
    judged = rep.against_reference
    reference = {} if judged is None else judged.groups.set_index("group")["verdict"].to_dict()
    several = len(rep.sections) > 1
    settings = (groups["settings_kind"] != "own").any()
    published = groups["published_accuracy_pct"].notna().any()
    ratios = groups["ratio_vs_published"].notna().any()
    head = (["machine"] if several else []) + ["framework", "data", "device", "profile"] + (
        ["settings"] if settings else []) + ["runs", "accuracy %"] + (
        ["paper %"] if published else []) + ["accuracy verdict"] + (
        ["ratio here ÷ paper"] if ratios else []) + ["ratio verdict"] + (
        ["against dlbench's reference rows"] if reference else [])
    body = []
    for g in groups.itertuples():
        cells = ([_td(machine_label(rep, g.section))] if several else []) + [
            _td(g.framework), _td(g.dataset), _td(g.device), _td(g.profile)]
        if settings:
            cells.append(_td(g.settings, title=g.settings, classes=["settings"]))
        runs = f"{g.ok}/{g.runs} ok" + (f", {g.disturbed} disturbed" if g.disturbed else "")
        cells += [_td(runs), _td(_number(g.accuracy_pct_median, "{:.2f}"), classes=["num"])]
        if published:
            cells.append(_td(_number(g.published_accuracy_pct, "{:.2f}"), classes=["num"]))
        cells.append(_verdict(g.accuracy_verdict, g.accuracy_caveats, g.accuracy_diff_points,
                              "{:+.2f} pts"))
        if ratios:
            cells.append(_td(_number(g.ratio_vs_published, "{:.2f}×"), classes=["num"]))
        cells.append(_verdict(g.ratio_verdict, g.ratio_caveats, None, ""))
        if reference:
            cells.append(_reference_verdict(reference.get(g.group)))
        body.append("<tr>" + "".join(cells) + "</tr>")
    return ('<div class="scroll"><table class="sortable" id="judged"><thead><tr>'
            + "".join(f"<th>{html.escape(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join(body) + "</tbody></table></div>"
            '<p class="meta">Green: reproduced (or, for a quick run, trains as expected); red: not; '
            "grey: not comparable, with the reason. * the verdict has caveats. Hover a cell for "
            "the whole verdict; the tables below hold every figure.</p>")


BRACKET_OR_COLON = r" \(|: "


def short(verdict: str) -> str:
    """A verdict in a few words: a reason's explanation in brackets, or after a colon, left
    out (the tooltip holds it whole)."""
    kind, _, reason = verdict.partition(": ")
    if not reason:
        return verdict
    return f"{kind}: {re.split(BRACKET_OR_COLON, reason, maxsplit=1)[0]}"


def _verdict(verdict: str, caveats, diff, diff_format: str) -> str:
    text = short(verdict)
    if paper.present(diff):
        text += f" ({diff_format.format(diff)})"
    caveats = list(caveats) if caveats is not None else []
    if caveats:
        text += " *"
    title = "; ".join([verdict] + caveats)
    return _td(text, title=title, classes=["verdict", paper.kind(verdict).replace(" ", "-")])


def _reference_verdict(verdict) -> str:
    if verdict is None:          # not a quick group: the paper judges it
        return _td("-")
    kind = {reference_rows.AS_EXPECTED: "as-expected",
            reference_rows.NOT_AS_EXPECTED: "not-as-expected"}.get(verdict, "not-comparable")
    return _td(short(verdict), title=verdict, classes=["verdict", kind])


def _number(value, fmt: str) -> str:
    return fmt.format(value) if paper.present(value) else "-"


def _td(text: str, title: str | None = None, classes: list[str] = ()) -> str:
    attr = f' class="{" ".join(classes)}"' if classes else ""
    if title is not None:
        attr += f' title="{html.escape(title)}"'
    return f"<td{attr}>{html.escape(text)}</td>"


# --- charts ---

def _figure(chart: Chart) -> str:
    esc = html.escape
    plot = plotly.io.to_html(chart.figure, include_plotlyjs=False, full_html=False,
                             div_id=f"chart-{chart.key}", config=PLOT_CONFIG | {
                                 "toImageButtonOptions": {"filename": f"dlbench-{chart.key}"}})
    return (f'<figure id="{chart.key}"><h3>{esc(chart.title)}<a class="csv" download='
            f'"dlbench-{chart.key}.csv" href="{csv_uri(chart.data)}">download CSV</a></h3>'
            f"{plot}<figcaption>{esc(chart.caption)}</figcaption></figure>")


def csv_uri(data: pd.DataFrame) -> str:
    """The table as a CSV file in a data: URI (a link that downloads it, offline), its text
    cells neutralised for spreadsheets as the CSV formats' are."""
    return "data:text/csv;charset=utf-8," + urllib.parse.quote(csv_text(data))


# --- the report's tables ---

def _table(view: View) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in view.columns)
    body = []
    for row in view.rows:
        cells = []
        for i, cell in enumerate(row):
            classes = ["num"] if i in view.numeric else ["wrap"] if i in view.wrap else []
            if i in view.verdicts:
                classes.append(paper.kind(cell).replace(" ", "-"))
            attr = f' class="{" ".join(classes)}"' if classes else ""
            cells.append(f"<td{attr}>{esc(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table class="sortable"><caption>{esc(view.title)}</caption><thead><tr>{head}'
            f"</tr></thead><tbody>{''.join(body)}</tbody></table></div>")
