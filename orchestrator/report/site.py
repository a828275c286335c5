"""`dlbench site DIR... -o OUT`: one static site over many results folders, as asv
publishes one over its benchmarks' history.

    OUT/index.html          the folders: dates, machines, profiles, frameworks, data sets
    OUT/history.html        a chart per framework, data set and profile across the folders
    OUT/runs/NAME/index.html  each folder's report page (report/html.py)
    OUT/plotly.min.js       the plotting library, once for every page

Every page works offline from the files (no server).  A DIR that holds no rows itself but
results folders one level down stands for those folders; one with neither is left out with
a warning.  Every DIR is read before anything is written; a missing one, DIRs without a
single row, or an OUT that is a file are refused."""

from __future__ import annotations

import contextlib
import datetime as dt
import html
import re
import warnings
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.io
import plotly.offline
from plotly.subplots import make_subplots

from .. import __version__, store
from ..errors import DlbenchError, StoreError, StoreWarning, UsageError
from . import build_report, paper
from .charts import _layout, colour, inert
from .html import PLOT_CONFIG, STYLE, TABLE_SCRIPT, render_page

LIBRARY = "plotly.min.js"
RUNS = "runs"
HISTORY = "history.html"


class Folder:
    """One results folder of the site: its page's name and its report."""

    def __init__(self, path: Path, name: str, rep: paper.Report):
        self.path, self.name, self.rep = path, name, rep
        recorded = pd.to_datetime(rep.rows["recorded_at"], utc=True)
        self.first, self.last = recorded.min(), recorded.max()

    @property
    def href(self) -> str:
        return f"{RUNS}/{self.name}/index.html"


def folders(given: list[Path]) -> list[tuple[Path, str]]:
    """(results folder, page name) for each DIR, or for each results folder one level down
    in a DIR that holds no rows itself; names made unique."""
    found = []
    for directory in given:
        if not directory.is_dir():
            raise UsageError(f"{directory}: no such directory")
    for directory in given:
        if store.row_files(directory):
            found.append((directory, directory.resolve().name))
            continue
        inner = sorted(d for d in directory.iterdir() if d.is_dir() and store.row_files(d))
        if not inner:       # a folder of notes or scripts beside the results: said, left out
            warnings.warn(StoreWarning(f"{directory}: no stored runs (nor results folders in it); "
                                       "left out of the site"), stacklevel=2)
        found += [(d, f"{directory.resolve().name}-{d.name}") for d in inner]
    if not found:
        raise StoreError(f"{', '.join(map(str, given))}: no stored runs in any (run `dlbench run` first)")
    used: dict[str, int] = {}
    unique = []
    for path, name in found:
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-") or "results"
        used[name] = used.get(name, 0) + 1
        unique.append((path, name if used[name] == 1 else f"{name}-{used[name]}"))
    return unique


def build(given: list[Path], out: Path, data_dir: Path | None = None) -> Path:
    """Read every folder, then write the site into ``out``; returns its index page."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out}: a file, not a directory")
    chosen = [Folder(path, name, build_report(path, data_dir=data_dir, traces=True))
              for path, name in folders(given)]
    chosen.sort(key=lambda f: (f.first, f.name))
    pages = {out / "index.html": index_page(chosen), out / HISTORY: history_page(chosen),
             out / LIBRARY: plotly.offline.get_plotlyjs()}
    nav = ('<nav class="site"><a href="../../index.html">all results</a> · '
           '<a href="../../history.html">history</a></nav>')
    for folder in chosen:
        pages[out / folder.href] = render_page(folder.rep, plotly_src=f"../../{LIBRARY}", nav=nav)
    for path, text in pages.items():
        _write(path, text, out)
    return out / "index.html"


def _write(path: Path, text: str, out: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise DlbenchError(f"-o {out}: cannot write {path.name} there: {exc.strerror}") from None


def _head(title: str, plots: bool) -> str:
    library = f'<script src="{LIBRARY}"></script>' if plots else ""
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{STYLE}</style>{library}</head><body>")


def _machines(rep: paper.Report) -> list[str]:
    return [f"{s.host_name} ({s.host_cpu_model}{f', {s.host_cpus} CPUs' if s.host_cpus else ''})"
            for s in rep.sections]


def index_page(chosen: list[Folder]) -> str:
    """The folders, one a row, newest first: when, which machine, which profiles."""
    esc = html.escape
    head = ["first run (UTC)", "last run", "results", "machine", "profiles", "frameworks", "data sets",
            "runs", "dlbench"]
    body = []
    for f in sorted(chosen, key=lambda f: f.last, reverse=True):
        rows = f.rep.rows
        ok = int((rows["status"] == "ok").sum())
        cells = [f.first.strftime("%Y-%m-%d %H:%M"), f.last.strftime("%Y-%m-%d %H:%M"),
                 f'<a href="{esc(f.href)}">{esc(f.name)}</a>',
                 "<br>".join(esc(m) for m in _machines(f.rep)),
                 esc(", ".join(dict.fromkeys(rows["profile"]))),
                 esc(", ".join(dict.fromkeys(rows["framework"]))),
                 esc(", ".join(dict.fromkeys(rows["dataset"]))),
                 f"{ok}/{len(rows)} ok",
                 esc(", ".join(sorted(set().union(*(s.dlbench_versions for s in f.rep.sections)))))]
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    runs = sum(len(f.rep.rows) for f in chosen)
    return "\n".join([
        _head("dlbench results", plots=False), "<h1>dlbench results</h1>",
        f'<p class="meta">{len(chosen)} results folder(s), {runs} stored run(s). Written by dlbench '
        f'{esc(__version__)} on {now}. <a href="{HISTORY}">History</a>: each framework, data set '
        f"and profile across the folders.</p>",
        "<h2>Results folders</h2>",
        '<p class="meta">One row a folder, the newest first; click a heading to sort, type in the '
        "box to keep the rows holding every word (a machine, a profile, a framework). Each folder "
        "links to its report.</p>",
        '<div class="scroll"><table class="sortable" id="folders"><thead><tr>'
        + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead><tbody>" + "".join(body)
        + "</tbody></table></div>",
        f"<script>{TABLE_SCRIPT}</script></body></html>"]) + "\n"


# --- the history: a chart per framework, data set and profile ---

def history(chosen: list[Folder]) -> pd.DataFrame:
    """One record per folder and group of the framework's own settings: when its runs were
    recorded (the median), its machine and device, its median and range of training time
    and accuracy, its runs."""
    records = []
    for f in chosen:
        rep = f.rep
        when = pd.to_datetime(rep.rows["recorded_at"], utc=True).groupby(rep.rows["group"]).median()
        for g in rep.groups[rep.groups["settings_kind"] == "own"].itertuples():
            if not paper.present(g.train_time_s_median):
                continue
            section = rep.sections[g.section]
            records.append({
                "framework": g.framework, "dataset": g.dataset, "profile": g.profile, "model": g.model,
                "machine": f"{section.host_name} · {g.device}"
                           + ("" if pd.isna(g.threads) else f" · {g.threads} thr"),
                "folder": f.name, "href": f.href, "recorded_at": when[g.group].tz_convert(None),
                "ok_runs": int(g.ok),
                **{f"{m}_{s}": getattr(g, f"{m}_{s}") for m in ("train_time_s", "accuracy_pct")
                   for s in ("median", "min", "max")}})
    return pd.DataFrame.from_records(records)


def history_page(chosen: list[Folder]) -> str:
    esc = html.escape
    data = history(chosen)
    parts = [_head("dlbench history", plots=len(data) > 0),
             '<nav class="site"><a href="index.html">all results</a></nav>', "<h1>History</h1>",
             '<p class="meta">Each framework, data set and profile across the results folders, run '
             "with the framework's own settings (runs with changed settings are left out): the "
             "median training time and test accuracy of each folder's ok runs, the line across a "
             "point from its lowest run to its highest, one line per machine, device and thread "
             "count (times of different machines are not comparable). Click a point to open its "
             "folder's report.</p>"]
    if not len(data):
        parts.append('<p class="missing">Not drawn: no folder has ok runs with the frameworks\' '
                     "own settings.</p>")
    keys = ["dataset", "profile", "framework"]
    for (dataset, profile, framework), part in data.sort_values(keys + ["recorded_at"]).groupby(keys, sort=False):
        key = f"history-{framework}-{dataset}-{profile}"
        plot = plotly.io.to_html(inert(_history_figure(part)), include_plotlyjs=False, full_html=False,
                                 div_id=f"chart-{key}", config=PLOT_CONFIG)
        parts.append(f'<figure id="{esc(key)}"><h3>{esc(framework)}, {esc(dataset)}, {esc(profile)} '
                     f"profile</h3>{plot}</figure>")
    parts.append(f"<script>{OPEN_ON_CLICK}</script></body></html>")
    return "\n".join(parts) + "\n"


OPEN_ON_CLICK = """
for (const el of document.querySelectorAll('.js-plotly-plot'))
  el.on('plotly_click', event => { location.href = event.points[0].customdata[0]; });
"""


def _history_figure(data: pd.DataFrame) -> go.Figure:
    figure = make_subplots(rows=1, cols=2, horizontal_spacing=0.08,
                           subplot_titles=["training time, s (median, min–max)", "test accuracy, %"])
    tint = colour(data["framework"].iloc[0])
    dashes = ["solid", "dot", "dash", "dashdot", "longdash"]
    for i, (machine, line) in enumerate(data.groupby("machine", sort=True)):
        custom = line[["href", "folder", "ok_runs", "model"]].to_numpy()
        for col, metric, unit in ((1, "train_time_s", "s"), (2, "accuracy_pct", "%")):
            median = pd.to_numeric(line[f"{metric}_median"])
            error = dict(type="data", symmetric=False, array=pd.to_numeric(line[f"{metric}_max"]) - median,
                         arrayminus=median - pd.to_numeric(line[f"{metric}_min"]), color="#555",
                         thickness=1.2, width=4)
            figure.add_trace(go.Scatter(
                x=line["recorded_at"], y=median, mode="lines+markers", name=machine, legendgroup=machine,
                showlegend=col == 1, line=dict(color=tint, dash=dashes[i % len(dashes)]),
                marker=dict(size=9), error_y=error, customdata=custom,
                hovertemplate=(f"%{{customdata[1]}}<br>{machine}<br>%{{x|%Y-%m-%d %H:%M}}: "
                               f"%{{y:,.4g}} {unit} (median of %{{customdata[2]}} ok run(s), "
                               "%{customdata[3]})<extra></extra>")), row=1, col=col)
    figure.update_yaxes(rangemode="tozero", row=1, col=1)
    figure.update_xaxes(title_text="when the runs were recorded (UTC)")
    _layout(figure, height=340)
    figure.update_layout(legend=dict(title_text="machine · device", orientation="h", y=-0.3))
    return figure
