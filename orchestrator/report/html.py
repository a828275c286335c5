"""The report as one self-contained HTML page: the report's tables and matplotlib plots
rendered to SVG and inlined, with no script, style sheet or font fetched from anywhere."""

from __future__ import annotations

import contextlib
import datetime as dt
import html
import io
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .. import __version__, catalog
from ..errors import DlbenchError
from . import compare
from .views import View, reference_lines, section_views

PAGE = "index.html"
# A framework's colour: the study's six first, then any added, by their order (catalog.names);
# one that is not found any more (rows of a framework since removed) is grey.
PALETTE = ("#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
           "#17becf")
OTHER_COLOUR = "#7f7f7f"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1400px; padding: 0 1em;
       color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 2px solid #ccd; }
table { border-collapse: collapse; margin: 0.6em 0 1.4em; font-size: 13px; }
caption { text-align: left; font-weight: 600; padding-bottom: 0.3em; }
th, td { border: 1px solid #ccd; padding: 3px 7px; white-space: nowrap; }
th { background: #eef; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.reproduced { background: #d9f2d9; } td.not-reproduced { background: #f8d7d7; }
td.not-comparable { color: #777; } td.wrap { white-space: normal; min-width: 8em; max-width: 20em; }
figure { margin: 1em 0 2em; } figcaption { color: #555; font-size: 13px; }
figure svg { max-width: 100%; height: auto; }
.notes li { margin-bottom: 0.3em; } .meta { color: #555; } .scroll { overflow-x: auto; }
"""


def write_page(rep: compare.Report, directory: Path) -> Path:
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


def render_page(rep: compare.Report) -> str:
    esc = html.escape
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>dlbench report</title>", f"<style>{STYLE}</style></head><body>",
        "<h1>dlbench report</h1>",
        f'<p class="meta">{len(rep.rows)} stored run(s) on {len(rep.sections)} machine(s) / schema '
        f"version(s); written by dlbench {esc(__version__)} on {now}.</p>",
        '<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in rep.notes()) + "</ul>",
    ]
    figures = _Figures()
    for section in rep.sections:
        parts.append(f"<h2>Rows from {esc(section.title)}</h2>")
        parts += [_table(view) for view in section_views(rep, section)]
        heading, lines = reference_lines(rep, section)
        if lines:
            parts.append(f"<h3>{esc(heading)}</h3><ul>"
                         + "".join(f"<li>{esc(line)}</li>" for line in lines) + "</ul>")
        rows = rep.rows[rep.rows["section"] == section.index]
        groups = rep.groups[rep.groups["section"] == section.index]
        for (dataset, device, profile), panel in groups.groupby(["dataset", "device", "profile"],
                                                               sort=False):
            members = rows[rows["group"].isin(panel["group"])]
            title = f"{dataset}, {device}, {profile} profile"
            labels = _labels(panel)
            caption = (f"{title}: training time against accuracy (each run a small point, the "
                       f"median a large one); median training time and accuracy per series, bars "
                       f"from min to max; training loss per epoch, one line per run. Training "
                       f"time here is dlbench's training steps only; the tables hold the paper "
                       f"spans where the rows measured them.")
            if profile == "paper":
                caption += (" Open diamonds: the paper's cell (Server1); its time is of another "
                            "machine, only the ratios compare.")
            parts.append(figures.add(_results_figure(panel, members, labels, rep.reference, title),
                                     caption))
            if rep.traces is not None:
                traces = rep.traces[rep.traces["run_id"].isin(members["run_id"])]
                if len(traces):
                    parts.append(figures.add(_traces_figure(traces, members, labels, title),
                                             f"{title}: resource use over time, one line per run."))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _table(view: View) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in view.columns)
    body = []
    for row in view.rows:
        cells = []
        for i, cell in enumerate(row):
            classes = ["num"] if i in view.numeric else ["wrap"] if i in view.wrap else []
            if i in view.verdicts:
                classes.append(compare.kind(cell).replace(" ", "-"))
            attr = f' class="{" ".join(classes)}"' if classes else ""
            cells.append(f"<td{attr}>{esc(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table><caption>{esc(view.title)}</caption><thead><tr>{head}'
            f"</tr></thead><tbody>{''.join(body)}</tbody></table></div>")


class _Figures:
    """Figures to inline SVG; each gets its own id salt, so ids never clash in the page."""

    def __init__(self):
        self.count = 0

    def add(self, figure: Figure, caption: str) -> str:
        self.count += 1
        buffer = io.StringIO()
        with matplotlib.rc_context({"svg.hashsalt": f"dlbench-figure-{self.count}",
                                    "svg.fonttype": "path"}):
            figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
        svg = buffer.getvalue()
        svg = svg[svg.index("<svg"):]      # drop the XML declaration and DOCTYPE
        return f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>"




def colour(framework: str) -> str:
    known = catalog.names()
    return PALETTE[known.index(framework) % len(PALETTE)] if framework in known else OTHER_COLOUR


def _styles(panel: pd.DataFrame) -> dict:
    """Colour by framework; marker by series within a framework."""
    styles, seen = {}, {}
    for g in panel.itertuples():
        index = seen[g.framework] = seen.get(g.framework, -1) + 1
        styles[g.group] = {"color": colour(g.framework),
                           "marker": MARKERS[index % len(MARKERS)]}
    return styles


def _labels(panel: pd.DataFrame) -> dict:
    """Short series labels for the plots (the tables name the settings in full); threads
    are named only where a panel mixes thread counts."""
    mixed = panel["threads"].nunique(dropna=False) > 1
    labels, changed = {}, 0
    for g in panel.itertuples():
        label = g.framework
        if g.settings_kind == "cross":
            label += f" ({g.settings})"
        elif g.settings_kind == "changed":
            changed += 1
            label += f" (changed settings {changed})"
        labels[g.group] = label + (f", {g.threads} thr" if mixed else "")
    return labels


def _results_figure(panel: pd.DataFrame, rows: pd.DataFrame, labels: dict,
                    ref: compare.Reference, title: str) -> Figure:
    figure = Figure(figsize=(11, 7.4), layout="constrained")
    figure.suptitle(title)
    scatter, loss, times, accuracy = figure.subplots(2, 2).flat
    ok = rows[rows["status"] == "ok"]
    styles = _styles(panel)
    for g in panel.itertuples():
        style = styles[g.group]
        mine = ok[ok["group"] == g.group]
        scatter.scatter(mine["train_time_s"], mine["accuracy"] * 100, s=18, alpha=0.45,
                        color=style["color"], marker=style["marker"])
        if pd.notna(g.train_time_s_median) and pd.notna(g.accuracy_pct_median):
            scatter.scatter([g.train_time_s_median], [g.accuracy_pct_median], s=90,
                            color=style["color"], marker=style["marker"], edgecolor="black",
                            label=labels[g.group])
        cell = ref.cell(g.framework, g.dataset, g.device)
        if cell and g.profile == "paper" and g.settings_kind == "own":
            scatter.scatter([cell["train_time_s"]], [cell["accuracy_pct"]], s=90, facecolor="none",
                            edgecolor=style["color"], marker="D", linewidth=1.6,
                            label=f"{g.framework}: paper (Server1)")
        for run in mine.itertuples():
            losses = list(run.epoch_loss) if isinstance(run.epoch_loss, (list, np.ndarray)) else []
            if losses:
                loss.plot(range(1, len(losses) + 1), losses, color=style["color"], alpha=0.8,
                          marker=style["marker"] if len(losses) < 3 else None, markersize=5)
    scatter.set(xlabel="training time, s", ylabel="accuracy, %",
                title="training time vs accuracy")
    if _spans_decades(scatter):
        scatter.set_xscale("log")
    # one legend for the four plots, below them, so that it never hides a point
    figure.legend(*scatter.get_legend_handles_labels(), loc="outside lower center",
                  ncol=min(3, max(1, len(scatter.collections))), fontsize=8)
    loss.set(xlabel="epoch", ylabel="training loss", title="training loss per epoch")
    epochs = max((len(losses) for losses in ok["epoch_loss"] if isinstance(losses, (list, np.ndarray))),
                 default=1)
    if epochs <= 12:
        loss.set_xticks(range(1, epochs + 1))
    else:
        loss.xaxis.get_major_locator().set_params(integer=True)
    _bars(times, panel, labels, styles, "train_time_s", "training time, s (median, min–max)")
    _bars(accuracy, panel, labels, styles, "accuracy_pct", "accuracy, % (median, min–max)")
    return figure


def _spans_decades(axes) -> bool:
    xs = [x for c in axes.collections for x in c.get_offsets()[:, 0] if x > 0]
    return bool(xs) and max(xs) / min(xs) > 20


def _bars(axes, panel: pd.DataFrame, labels: dict, styles: dict, metric: str, title: str) -> None:
    shown = [g for g in panel.itertuples() if pd.notna(getattr(g, f"{metric}_median"))]
    names = [labels[g.group] for g in shown]
    medians = [getattr(g, f"{metric}_median") for g in shown]
    low = [m - getattr(g, f"{metric}_min") for g, m in zip(shown, medians)]
    high = [getattr(g, f"{metric}_max") - m for g, m in zip(shown, medians)]
    axes.bar(range(len(shown)), medians, yerr=[low, high], capsize=5,
             color=[styles[g.group]["color"] for g in shown], alpha=0.85)
    axes.set_xticks(range(len(shown)), names, rotation=20, ha="right", fontsize=8)
    axes.set_title(title)
    if metric == "accuracy_pct" and medians:
        floor = min(m - lo for m, lo in zip(medians, low))
        axes.set_ylim(max(0.0, floor - 5), 100)


def _traces_figure(traces: pd.DataFrame, rows: pd.DataFrame, labels: dict, title: str) -> Figure:
    panels = [("cpu_percent", "CPU, %", 1.0), ("memory_bytes", "memory, GiB", 2**-30)]
    panels += [(c, label, scale) for c, label, scale in (("gpu_util", "GPU use, %", 1.0),
                                                          ("gpu_memory_bytes", "GPU memory, GiB", 2**-30))
               if traces[c].notna().any()]
    figure = Figure(figsize=(11, 3.4), layout="constrained")
    figure.suptitle(f"{title}: resource traces")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    info = rows.set_index("run_id")
    labelled = set()
    for run_id, samples in traces.groupby("run_id", sort=False):
        row = info.loc[run_id]
        label = None if row["group"] in labelled else labels[row["group"]]
        labelled.add(row["group"])
        for ax, (column, _, scale) in zip(axes, panels):
            ax.plot(samples["t_s"], pd.to_numeric(samples[column]) * scale,
                    color=colour(row["framework"]), alpha=0.8, label=label)
    for ax, (_, label, _) in zip(axes, panels):
        ax.set(xlabel="time since the job started, s", ylabel=label)
    figure.legend(*axes[0].get_legend_handles_labels(), loc="outside right upper", fontsize=8)
    return figure
