"""The HTML page's charts.  Each chart is the table behind it (what its CSV link downloads,
exactly) and a Plotly figure drawn from that table alone, so what is shown and what is
downloaded never differ.  Frameworks are the legend's entries: clicking one hides it."""

from __future__ import annotations

import dataclasses
import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import catalog
from . import correlations, paper, verification, views

# A framework's colour: the study's six first, then any added, by their order (catalog.names);
# one that is not found any more (rows of a framework since removed) is grey.
PALETTE = ("#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
           "#17becf")
OTHER = "#7f7f7f"


def colour(framework: str) -> str:
    known = catalog.names()
    return PALETTE[known.index(framework) % len(PALETTE)] if framework in known else OTHER

ROW_HEIGHT = 26          # pixels a bar or a point of a horizontal chart gets


@dataclasses.dataclass
class Chart:
    key: str             # unique in the page: the plot's element id and the CSV file's name
    title: str
    caption: str
    data: pd.DataFrame   # the exact numbers drawn
    figure: go.Figure


@dataclasses.dataclass
class Missing:
    """A chart the page would show, left out, and why (said where the chart would be)."""

    title: str
    why: str


def charts(rep: paper.Report) -> list[Chart | Missing]:
    """The page's charts in its order: training-time ratios against the paper, accuracy
    against the paper, training time and speed per profile, accuracy against training time,
    per-epoch curves, accuracy under attack, transfer attacks, the deployed models,
    distributed training's scaling, the settings' effects, the fair profile, resource traces."""
    found: list[Chart | Missing] = [ratio_chart(rep), accuracy_chart(rep)]
    found += speed_charts(rep)
    found += tta_charts(rep)
    found += epoch_charts(rep)
    found += robust_charts(rep)
    found += transfer_charts(rep)
    found += platform_charts(rep)
    found += scaling_charts(rep)
    found += setting_charts(rep)
    found += fair_charts(rep)
    found += op_charts(rep)
    found += trace_charts(rep)
    for chart in found:
        if isinstance(chart, Chart):
            chart.figure = inert(chart.figure)
    return found


# --- text drawn as text ---

OUR_TAGS = ("<br>", "<extra>", "</extra>")      # the only markup the charts' own strings use


def inert(figure: go.Figure) -> go.Figure:
    """The figure with every string of its traces and layout drawn as the text it is.
    Plotly reads a little HTML in names, tick labels, hover text and titles: ``<a href>``
    becomes a live link, and a framework's, a setting's or a layer's name comes from rows a
    job wrote.  ``<``, ``>`` and ``&`` become entities (Plotly shows them as the
    characters), but for the tags of ``OUR_TAGS``; the template is Plotly's own."""
    found = figure.to_dict()
    layout = found.get("layout", {})
    template = layout.pop("template", None)
    layout = _inert(layout)
    if template is not None:
        layout["template"] = template
    return go.Figure(data=[_inert(trace) for trace in found.get("data", [])], layout=layout)


def _inert(value):
    if isinstance(value, str):
        return _inert_text(value)
    if isinstance(value, dict):
        return {key: _inert(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_inert(item) for item in value]
    if isinstance(value, np.ndarray) and value.dtype == object:
        return np.array([_inert(item) for item in value.ravel()], dtype=object).reshape(value.shape)
    return value


def _inert_text(text: str) -> str:
    escaped = html.escape(text, quote=False)
    for tag in OUR_TAGS:
        escaped = escaped.replace(html.escape(tag, quote=False), tag)
    return escaped


# --- the series: what a point or a bar is called ---

def machine_label(rep: paper.Report, section: int) -> str:
    """"" where the report has one machine, else "machine N" (the page lists them)."""
    return f"machine {section + 1}" if len(rep.sections) > 1 else ""


def on_machine(rep: paper.Report, section, title: str) -> str:
    """A chart's title, with its machine in brackets where the report has several."""
    where = machine_label(rep, int(section))
    return title + (f" ({where})" if where else "")


def series_label(rep: paper.Report, g) -> str:
    """One group in a few words: framework, and what sets it apart from the others."""
    parts = [g.framework, g.dataset, g.device, g.profile]
    if g.settings_kind != "own":
        parts.append(g.settings)
    same = rep.groups[(rep.groups["section"] == g.section) & (rep.groups["dataset"] == g.dataset)
                      & (rep.groups["device"] == g.device)]
    if same["threads"].nunique(dropna=False) > 1 and not pd.isna(g.threads):
        parts.append(f"{g.threads} thr")
    machine = machine_label(rep, g.section)
    return " · ".join(map(str, parts)) + (f" ({machine})" if machine else "")


def _group_keys(rep: paper.Report, g) -> dict:
    return {"machine": machine_label(rep, g.section) or rep.sections[g.section].host_name,
            "framework": g.framework, "dataset": g.dataset, "device": g.device,
            "profile": g.profile, "settings": g.settings,
            "threads": None if pd.isna(g.threads) else int(g.threads)}


def _value(v):
    return float(v) if paper.present(v) else None


# --- (1) training-time ratios against the paper ---

def ratio_chart(rep: paper.Report) -> Chart | Missing:
    title = "Training-time ratios against the paper"
    records = []
    for g in rep.groups.itertuples():
        if not paper.present(g.ratio_vs_published) or g.framework == g.ratio_baseline:
            continue
        span = "paper_train_time_s" if g.ratio_span == paper.PAPER_SPAN else "train_time_s"
        records.append(_group_keys(rep, g) | {
            "series": series_label(rep, g), "baseline": g.ratio_baseline, "span": g.ratio_span,
            "train_time_s": _value(getattr(g, f"{span}_median")),
            "ratio_here": float(g.train_time_ratio),
            "ratio_paper": float(g.published_train_time_ratio),
            "here_over_paper": float(g.ratio_vs_published), "verdict": g.ratio_verdict})
    if not records:
        return Missing(title, "no group has a training-time ratio to hold against the paper's: a "
                              "ratio needs runs of the paper profile, with their own defaults, of two "
                              "or more frameworks on one machine, data set, device and thread count")
    data = pd.DataFrame.from_records(records)
    figure = _horizontal(data, "here_over_paper", (
        "%{y}<br>here ÷ paper: %{x:.2f}×<br>÷ %{customdata[0]} here: %{customdata[1]:.2f}×, "
        "in the paper: %{customdata[2]:.2f}×<br>%{customdata[3]}<extra></extra>"),
        ["baseline", "ratio_here", "ratio_paper", "verdict"], marker_only=True)
    tolerance = rep.ratio_tolerance
    figure.add_vrect(x0=1 / tolerance, x1=tolerance, fillcolor="#2ca02c", opacity=0.08, line_width=0,
                     layer="below")
    figure.add_vline(x=1, line_color="#333", line_width=1.5)
    low, high = data["here_over_paper"].min(), data["here_over_paper"].max()
    span = np.log10([min(low, 1 / tolerance) / 1.6, max(high, tolerance) * 1.6])
    figure.update_xaxes(type="log", range=list(span),
                        title_text="(framework ÷ baseline here) ÷ (the same in the paper); "
                                   "log scale, 1 = as in the paper")
    return Chart("ratios", title, (
        f"Each framework's training time ÷ the baseline framework's on the same machine, data "
        f"set, device and thread count, divided by the same ratio of the paper's published "
        f"times: at 1 the ratio is the paper's. Shaded: within ×/÷ {tolerance:g}, the span a "
        f"ratio is reproduced in. Hover a point for both ratios and the verdict."), data, figure)


# --- (2) accuracy against the paper ---

def accuracy_chart(rep: paper.Report) -> Chart | Missing:
    title = "Accuracy against the paper"
    records = []
    for g in rep.groups.itertuples():
        if not paper.present(g.accuracy_pct_median):
            continue
        records.append(_group_keys(rep, g) | {
            "series": series_label(rep, g), "ok_runs": int(g.ok),
            "accuracy_pct": float(g.accuracy_pct_median), "accuracy_pct_min": float(g.accuracy_pct_min),
            "accuracy_pct_max": float(g.accuracy_pct_max),
            "published_accuracy_pct": _value(g.published_accuracy_pct),
            "diff_points": _value(g.accuracy_diff_points), "verdict": g.accuracy_verdict})
    if not records:
        return Missing(title, "no ok run recorded an accuracy")
    data = pd.DataFrame.from_records(records)
    figure = _horizontal(data, "accuracy_pct", (
        "%{y}<br>accuracy %{x:.2f}% (median of %{customdata[0]} ok run(s), "
        "%{customdata[1]:.2f}–%{customdata[2]:.2f}%)<br>%{customdata[3]}<extra></extra>"),
        ["ok_runs", "accuracy_pct_min", "accuracy_pct_max", "verdict"],
        low="accuracy_pct_min", high="accuracy_pct_max")
    published = data[data["published_accuracy_pct"].notna()]
    if len(published):
        figure.add_trace(go.Scatter(
            x=published["published_accuracy_pct"], y=published["series"], mode="markers", name="paper",
            marker=dict(symbol="diamond-open", size=11, color="black", line_width=2),
            hovertemplate="%{y}<br>paper (GTDLBench Server1): %{x:.2f}%<extra></extra>"))
    figure.update_xaxes(range=[0, 100.5], title_text="accuracy on the test set, % (median, bar "
                                                     "from min to max); axis from 0")
    return Chart("accuracy", title, (
        "Median test accuracy of each group's ok runs, from 0 to 100%, the line across a bar "
        "from its lowest run to its highest; open diamonds: the paper's accuracy for the same "
        "framework, data set and device (shown for the framework's own defaults; held against "
        "it only in the paper profile)."), data, figure)


# --- (3) training time and images per second, for every profile ---

SPEEDS = [("train_time_s", "training time, s", "{:,.2f} s"), ("train_images_per_s", "training images per second",
                                                              "{:,.0f} images/s")]


def speed_charts(rep: paper.Report) -> list[Chart]:
    """One chart per machine and profile: each group's median training time and training
    images per second, a bar each from its fastest ok run to its slowest."""
    records = []
    for g in rep.groups.itertuples():
        if not paper.present(g.train_time_s_median):
            continue
        records.append(_group_keys(rep, g) | {"series": series_label(rep, g), "ok_runs": int(g.ok)} | {
            f"{metric}{stat}": _value(getattr(g, f"{metric}{stat}"))
            for metric, _, _ in SPEEDS for stat in ("_median", "_min", "_max")})
    if not records:
        return []
    frame = pd.DataFrame.from_records(records)
    found = []
    for number, ((machine, profile), data) in enumerate(
            frame.groupby(["machine", "profile"], sort=False), start=1):
        where = f"{profile} profile" + (f", {machine}" if len(rep.sections) > 1 else "")
        data = data.reset_index(drop=True)
        found.append(Chart(f"speed-{number}", f"Training time and speed: {where}", (
            f"{where}: each group's median training time (the training steps, left) and training "
            f"images per second (right) over its ok runs, the line across a bar from its lowest "
            f"run to its highest. Times of different data sets, models and lengths are not "
            f"comparable with each other; the profile's settings are in the tables."),
            data, _speed_figure(data)))
    return found


def _speed_figure(data: pd.DataFrame) -> go.Figure:
    figure = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                           subplot_titles=[label for _, label, _ in SPEEDS])
    rank = {name: i for i, name in enumerate(catalog.names())}
    for framework in sorted(data["framework"].unique(), key=lambda f: (rank.get(f, len(rank)), f)):
        part = data[data["framework"] == framework]
        for col, (metric, label, fmt) in enumerate(SPEEDS, start=1):
            median, low, high = (part[f"{metric}{s}"] for s in ("_median", "_min", "_max"))
            shown = median.notna()
            if not shown.any():
                continue       # no such figure in its rows (images per second: older rows)
            error = dict(type="data", symmetric=False, array=(high - median)[shown],
                         arrayminus=(median - low)[shown], color="#333", thickness=1.2, width=4)
            unit = fmt.split("} ")[-1]
            figure.add_trace(go.Bar(
                x=median[shown], y=part["series"][shown], orientation="h", name=framework,
                legendgroup=framework, showlegend=col == 1, marker_color=colour(framework),
                opacity=0.85, error_x=error, customdata=part[[f"{metric}_min", f"{metric}_max",
                                                              "ok_runs"]][shown].to_numpy(),
                hovertemplate=f"%{{y}}<br>{label}: %{{x:,.4g}} {unit} (median of %{{customdata[2]}} "
                              f"ok run(s), %{{customdata[0]:,.4g}}–%{{customdata[1]:,.4g}})<extra></extra>"),
                row=1, col=col)
    for col, (metric, _, _) in enumerate(SPEEDS, start=1):
        values = data[f"{metric}_median"].dropna()
        values = values[values > 0]
        spread = len(values) and values.max() / values.min() > 30     # sizes apart: a log axis
        figure.update_xaxes(type="log" if spread else "linear", title_text="log scale" if spread
                            else "from 0", row=1, col=col)
    figure.update_yaxes(categoryorder="array", categoryarray=list(data["series"]), autorange="reversed",
                        automargin=True, row=1, col=1)
    figure.update_layout(barmode="overlay", bargap=0.3)
    _layout(figure, height=150 + ROW_HEIGHT * len(data))
    return figure


# --- (4) accuracy against training time, and the time to a target accuracy ---

def tta_charts(rep: paper.Report) -> list[Chart]:
    """One chart per machine, data set, device and profile: each ok run's training accuracy
    at the end of each epoch against the training time until then (its epochs' times
    summed), one line per run, the target dashed (report/tta.py)."""
    found = rep.time_to_accuracy
    if found is None or not len(found):
        return []
    runs = rep.rows.set_index("run_id")
    groups = rep.groups.set_index("group")
    records = []
    for r in found.itertuples():
        run = runs.loc[r.run_id]
        accuracy, seconds = _floats(run["epoch_accuracy"]), _floats(run["epoch_time_s"])
        g = _Named(groups.loc[r.group])
        keys = _group_keys(rep, g) | {"series": series_label(rep, g), "run_id": r.run_id,
                                      "target_pct": r.target * 100}
        spent = 0.0
        for i, value in enumerate(accuracy[:len(seconds)]):
            if not seconds[i] > 0:
                break              # an epoch without its time: the line stops there
            spent += seconds[i]
            records.append(keys | {"epoch": i + 1, "time_s": spent, "accuracy_pct": value * 100,
                                   "reached": value >= r.target})
    if not records:
        return []
    drawn = []
    for number, where, data in _panels(rep, pd.DataFrame.from_records(records)):
        data = data.reset_index(drop=True)
        drawn.append(Chart(f"tta-{number}", f"Accuracy against training time: {where}", (
            f"{where}: each run's training accuracy at the end of each epoch against the "
            f"training time until then, one line per run; dashed: the target (see the table "
            f"\"Time to accuracy\"); a filled point is the first epoch at or above it."),
            data, _tta_figure(data)))
    return drawn


def _tta_figure(data: pd.DataFrame) -> go.Figure:
    figure = go.Figure()
    shown = set()
    for (series, run_id), run in data.groupby(["series", "run_id"], sort=False):
        tint = colour(run["framework"].iloc[0])
        first = run["reached"].to_numpy().argmax() if run["reached"].any() else -1
        figure.add_trace(go.Scatter(
            x=run["time_s"], y=run["accuracy_pct"], mode="lines+markers", name=series, legendgroup=series,
            showlegend=series not in shown, line_color=tint,
            marker=dict(size=[12 if i == first else 8 for i in range(len(run))],
                        symbol=["circle" if i == first else "circle-open" for i in range(len(run))]),
            customdata=run[["epoch", "target_pct"]].to_numpy(),
            hovertemplate=(f"{series}<br>run {run_id[:8]}<br>epoch %{{customdata[0]}}: %{{y:.2f}}% "
                           "after %{x:,.1f} s (target %{customdata[1]:g}%)<extra></extra>")))
        shown.add(series)
    for target in sorted(data["target_pct"].unique()):
        figure.add_hline(y=target, line_dash="dash", line_color="#555", line_width=1,
                         annotation_text=f"target {target:g}%", annotation_position="bottom right")
    low = min(data["accuracy_pct"].min(), data["target_pct"].min())
    figure.update_xaxes(title_text="training time, s (the epochs' times summed)", rangemode="tozero")
    figure.update_yaxes(title_text="training accuracy, %", range=[max(0, low - 2), 100.5])
    _layout(figure, height=420)
    return figure


# --- (5) per-epoch curves, where there are several epochs ---

def epoch_charts(rep: paper.Report) -> list[Chart]:
    ok = rep.rows[rep.rows["status"] == "ok"]
    groups = rep.groups.set_index("group")
    records = []
    for run in ok.itertuples():
        losses = _floats(run.epoch_loss)
        if len(losses) < 2:
            continue           # one epoch is a point, not a curve
        accuracy, seconds = _floats(run.epoch_accuracy), _floats(run.epoch_time_s)
        g = groups.loc[run.group]
        keys = _group_keys(rep, _Named(g))
        for i, loss in enumerate(losses):
            records.append(keys | {
                "series": series_label(rep, _Named(g)), "run_id": run.run_id,
                "epoch": i + 1, "loss": loss,
                "accuracy_pct": accuracy[i] * 100 if i < len(accuracy) else None,
                "epoch_time_s": seconds[i] if i < len(seconds) else None})
    if not records:
        return []
    found = []
    for number, where, data in _panels(rep, pd.DataFrame.from_records(records)):
        data = data.reset_index(drop=True)
        found.append(Chart(f"epochs-{number}", f"Per epoch: {where}", (
            f"{where}: training loss and training accuracy after each epoch, one line per run; "
            f"only runs of two epochs or more are drawn."), data, _epoch_figure(data)))
    return found


def _panels(rep: paper.Report, frame: pd.DataFrame):
    """A chart's records split one chart per machine, data set, device and profile:
    (number from 1, the words saying which, its records)."""
    for number, ((machine, dataset, device, profile), data) in enumerate(
            frame.groupby(["machine", "dataset", "device", "profile"], sort=False), start=1):
        where = f"{dataset}, {device}, {profile} profile" + (f", {machine}" if len(rep.sections) > 1 else "")
        yield number, where, data


class _Named:
    """A group's Series read by attribute, as an itertuples row is."""

    def __init__(self, series: pd.Series):
        self.__dict__.update(series.to_dict())


def _floats(values) -> list[float]:
    return [float(v) for v in values] if isinstance(values, (list, tuple, np.ndarray)) else []


def _epoch_figure(data: pd.DataFrame) -> go.Figure:
    has_accuracy = data["accuracy_pct"].notna().any()
    figure = make_subplots(rows=1, cols=2 if has_accuracy else 1, horizontal_spacing=0.09,
                           subplot_titles=["training loss"] + (["training accuracy, %"] if has_accuracy else []))
    shown = set()
    for (series, run_id), run in data.groupby(["series", "run_id"], sort=False):
        framework = run["framework"].iloc[0]
        common = dict(mode="lines+markers" if len(run) <= 12 else "lines", name=series,
                      legendgroup=series, line_color=colour(framework), marker_size=5)
        figure.add_trace(go.Scatter(
            x=run["epoch"], y=run["loss"], showlegend=series not in shown, customdata=[run_id[:8]] * len(run),
            hovertemplate=f"{series}<br>run %{{customdata}}<br>epoch %{{x}}: loss %{{y:.4g}}<extra></extra>",
            **common), row=1, col=1)
        if has_accuracy:
            figure.add_trace(go.Scatter(
                x=run["epoch"], y=run["accuracy_pct"], showlegend=False, customdata=[run_id[:8]] * len(run),
                hovertemplate=f"{series}<br>run %{{customdata}}<br>epoch %{{x}}: %{{y:.2f}}%<extra></extra>",
                **common), row=1, col=2)
        shown.add(series)
    losses = data["loss"][data["loss"] > 0]
    if len(losses) and losses.max() / losses.min() > 20:
        figure.update_yaxes(type="log", row=1, col=1)
    epochs = int(data["epoch"].max())
    figure.update_xaxes(title_text="epoch", tickformat="d",
                        **({"dtick": 1} if epochs <= 12 else {}))
    _layout(figure, height=420)
    return figure


# --- (4) accuracy under attack, where the rows have it ---

def robust_charts(rep: paper.Report) -> list[Chart]:
    """One chart per machine, data set, device and profile: each group's median accuracy
    against epsilon, a line through the clean images (epsilon 0) and FGSM's epsilons, and
    PGD as a diamond at its epsilon, in the group's colour."""
    found = rep.robustness
    if found is None or not len(found):
        return []
    ok = rep.rows[rep.rows["status"] == "ok"][["run_id", "group"]]
    found = found.merge(ok, on="run_id")
    groups = rep.groups.set_index("group")
    records = []
    for (group, attack, epsilon), part in found.groupby(["group", "attack", "epsilon"], sort=False):
        accuracy = pd.to_numeric(part["accuracy"]).dropna() * 100
        if not len(accuracy):
            continue                # no gradient to the input: the tables say why
        g = _Named(groups.loc[group])
        records.append(_group_keys(rep, g) | {
            "series": series_label(rep, g), "attack": attack, "epsilon": float(epsilon),
            "steps": int(part["steps"].max()), "images": int(part["images"].max()),
            "runs": int(part["run_id"].nunique()), "accuracy_pct": float(accuracy.median()),
            "accuracy_pct_min": float(accuracy.min()), "accuracy_pct_max": float(accuracy.max())})
    if not records:
        return []
    charts_found = []
    for number, where, data in _panels(rep, pd.DataFrame.from_records(records)):
        data = data.sort_values(["series", "attack", "epsilon"]).reset_index(drop=True)
        charts_found.append(Chart(f"robust-{number}", f"Accuracy under attack: {where}", (
            f"{where}: median accuracy of each group's runs on the attacked test images, "
            "against ε in the [0, 1] pixel scale; lines: the clean images (ε 0) and FGSM; "
            "diamonds: PGD (10 steps) at its ε."), data, _robust_figure(data)))
    return charts_found


def _robust_figure(data: pd.DataFrame) -> go.Figure:
    figure = go.Figure()
    for series, part in data.groupby("series", sort=False):
        framework = part["framework"].iloc[0]
        line = part[part["attack"].isin(["none", "fgsm"])].sort_values("epsilon")
        hover = (f"{series}<br>%{{customdata[0]}} ε %{{x:.4g}}: %{{y:.2f}}% "
                 "(median of %{customdata[1]} run(s) on %{customdata[2]} images)<extra></extra>")
        custom = ["attack", "runs", "images"]
        figure.add_trace(go.Scatter(
            x=line["epsilon"], y=line["accuracy_pct"], mode="lines+markers", name=series,
            legendgroup=series, line_color=colour(framework), customdata=line[custom].values,
            hovertemplate=hover))
        pgd = part[part["attack"] == "pgd"]
        if len(pgd):
            figure.add_trace(go.Scatter(
                x=pgd["epsilon"], y=pgd["accuracy_pct"], mode="markers", name=f"{series} · PGD",
                legendgroup=series, showlegend=False, customdata=pgd[custom].values,
                marker=dict(symbol="diamond", size=11, color=colour(framework)),
                hovertemplate=hover))
    figure.update_xaxes(title_text="ε, pixel scale [0, 1]", rangemode="tozero")
    figure.update_yaxes(title_text="accuracy, %", range=[0, 100.5])
    _layout(figure, height=420)
    return figure


def platform_charts(rep: paper.Report) -> list[Chart]:
    """One chart per machine, data set, device and profile: each group's deployed models, a
    point per platform, the median change of accuracy in points against the framework's own
    on the same test images (x) against the median latency per image at batch 1 (y), the
    framework's colour, a marker per platform; failed platforms are the tables' business."""
    found = rep.platforms
    if found is None or not len(found):
        return []
    ok = rep.rows[rep.rows["status"] == "ok"][["run_id", "group", "accuracy"]].rename(columns={"accuracy": "own"})
    found = found[found["status"] == "ok"].merge(ok, on="run_id")
    groups = rep.groups.set_index("group")
    records = []
    for (group, platform), part in found.groupby(["group", "platform"], sort=False):
        change = ((pd.to_numeric(part["accuracy"]) - pd.to_numeric(part["own"])) * 100).dropna()
        latency = pd.to_numeric(part["latency_ms"]).dropna()
        if not len(change) or not len(latency):
            continue
        g = _Named(groups.loc[group])
        size = pd.to_numeric(part["model_bytes"]).dropna()
        records.append(_group_keys(rep, g) | {
            "series": series_label(rep, g), "platform": platform, "runs": int(part["run_id"].nunique()),
            "accuracy_change_pts": float(change.median()), "latency_ms": float(latency.median()),
            "model_mb": float(size.median()) / 1e6 if len(size) else None})
    if not records:
        return []
    charts_found = []
    for number, where, data in _panels(rep, pd.DataFrame.from_records(records)):
        data = data.sort_values(["series", "platform"]).reset_index(drop=True)
        charts_found.append(Chart(f"platforms-{number}", f"Deployed models: {where}", (
            f"{where}: each trained model deployed after training, a point per platform: the "
            "median change of its accuracy in points against the framework's own on the same "
            "test images, against its median milliseconds per image at batch 1."), data,
            _platform_figure(data)))
    return charts_found


SYMBOLS = {"mobile": "circle", "mobile-int8": "circle-open", "onnx-int8": "square-open", "web": "diamond"}


def _platform_figure(data: pd.DataFrame) -> go.Figure:
    figure = go.Figure()
    for (series, platform), part in data.groupby(["series", "platform"], sort=False):
        framework = part["framework"].iloc[0]
        figure.add_trace(go.Scatter(
            x=part["accuracy_change_pts"], y=part["latency_ms"], mode="markers",
            name=f"{series} · {platform}", legendgroup=series, customdata=part[["runs", "model_mb"]].values,
            marker=dict(symbol=SYMBOLS.get(platform, "x"), size=12, color=colour(framework),
                        line=dict(width=2, color=colour(framework))),
            hovertemplate=(f"{series} on {platform}<br>accuracy %{{x:+.2f}} pts, %{{y:.3g}} ms per image, "
                           "%{customdata[1]:.2f} MB (median of %{customdata[0]} run(s))<extra></extra>")))
    figure.add_vline(x=0, line_color="#999", line_dash="dot")
    figure.update_xaxes(title_text="accuracy against the framework's own, points")
    figure.update_yaxes(title_text="ms per image, batch 1", type="log")
    _layout(figure, height=420)
    return figure


def scaling_charts(rep: paper.Report) -> list[Chart]:
    """One chart per machine, data set, device and profile with jobs of several workers
    (``views.scaling_records``): the speed-up over one worker against the workers, a line
    per framework and settings, solid for strong scaling, dotted for weak, beside the ideal
    (speed-up = workers)."""
    records = views.scaling_records(rep.rows)
    if not records:
        return []
    frame = pd.DataFrame.from_records([
        {"machine": machine_label(rep, r["section"]), "dataset": r["dataset"], "device": r["device"],
         "profile": r["profile"], "framework": r["framework"], "kind": r["kind"], "settings": r["label"],
         "workers": r["workers"], "nodes": r["nodes"], "runs": r["runs"], "speedup": r["speedup"]}
        for r in records if r["speedup"]])
    if frame.empty:
        return []
    found = []
    for number, where, data in _panels(rep, frame):
        data = data.sort_values(["framework", "kind", "settings", "workers"]).reset_index(drop=True)
        found.append(Chart(f"scaling-{number}", f"Distributed training: {where}", (
            f"{where}: the speed-up of each job trained over several workers against one worker, "
            "median over the runs: strong scaling (solid: the global batch the same, the training "
            "time's ratio) and weak scaling (dotted: each worker's batch the same, the images per "
            "second's ratio); the grey line is the ideal, a speed-up equal to the workers."),
            data, _scaling_figure(data)))
    return found


def _scaling_figure(data: pd.DataFrame) -> go.Figure:
    figure = go.Figure()
    most = int(data["workers"].max())
    figure.add_trace(go.Scatter(x=[1, most], y=[1, most], mode="lines", name="ideal",
                                line=dict(color="#999", dash="dot", width=1), hoverinfo="skip"))
    for (framework, kind, settings), line in data.groupby(["framework", "kind", "settings"], sort=False):
        figure.add_trace(go.Scatter(
            x=line["workers"], y=line["speedup"], mode="lines+markers",
            name=f"{framework} · {kind} · {settings}", customdata=line[["runs", "nodes"]].values,
            line=dict(color=colour(framework), dash="solid" if kind == "strong" else "dot"),
            hovertemplate=(f"{framework}, {kind} scaling ({settings})<br>%{{x}} worker(s) on "
                           "%{customdata[1]} node(s): speed-up %{y:.2f} (median of %{customdata[0]} "
                           "run(s))<extra></extra>")))
    figure.update_xaxes(title_text="workers", dtick=1)
    figure.update_yaxes(title_text="speed-up over one worker", rangemode="tozero")
    _layout(figure, height=380)
    return figure


# --- (5) transfer attacks, where runs kept their FGSM images ---

def transfer_charts(rep: paper.Report) -> list[Chart]:
    """One heat map per transfer matrix (report/transfer.py): rows the runs whose FGSM
    images are tried, columns the runs whose ONNX model is, colour the accuracy."""
    found = []
    for number, matrix in enumerate(rep.transfer, start=1):
        where = f"{matrix.dataset}, {matrix.profile} profile"
        if len(rep.sections) > 1:
            where += f", {machine_label(rep, matrix.section)}"
        data = pd.DataFrame.from_records(matrix.records())
        found.append(Chart(f"transfer-{number}", f"Transfer attacks: {where}", (
            f"{where}: accuracy of each column's model, exported to ONNX and run by onnxruntime, "
            "on each row's FGSM images at its ε (the latest ok run of each); the diagonal is a "
            "model on its own white-box images, about its own FGSM accuracy; a blank cell's "
            "reason shows on hovering."), data, _transfer_figure(matrix)))
    return found


def _transfer_figure(matrix) -> go.Figure:
    labels = [e.label for e in matrix.entries]
    z = [[None if v is None else 100 * v for v in row] for row in matrix.accuracy]
    text = [[("" if v is None else f"{v:.1f}") for v in row] for row in z]
    hover = [[f"images of {a.label}" + (f" (ε {a.epsilon:.4g}, {a.images} images)" if a.images else "")
              + f"<br>model of {b.label}: " + (f"{z[i][j]:.2f}%" if z[i][j] is not None
                                               else (matrix.reasons[i][j] or ""))
              for j, b in enumerate(matrix.entries)] for i, a in enumerate(matrix.entries)]
    figure = go.Figure(go.Heatmap(
        z=z, x=labels, y=labels, text=text, texttemplate="%{text}", hovertext=hover,
        hovertemplate="%{hovertext}<extra></extra>", zmin=0, zmax=100, colorscale="Viridis",
        colorbar=dict(title="accuracy, %")))
    figure.update_xaxes(title_text="ONNX model of", side="bottom")
    figure.update_yaxes(title_text="FGSM images of", autorange="reversed")
    _layout(figure, height=220 + 40 * len(labels))
    return figure


# --- resource traces, where recorded ---

TRACE_PANELS = [("cpu_percent", "CPU, %", 1.0), ("memory_bytes", "memory, GiB", 2**-30),
                ("gpu_util", "GPU use, %", 1.0), ("gpu_memory_bytes", "GPU memory, GiB", 2**-30)]


def trace_charts(rep: paper.Report) -> list[Chart]:
    if rep.traces is None:
        return []
    info = rep.rows.set_index("run_id")
    groups = rep.groups.set_index("group")
    frames = []
    for run_id, samples in rep.traces.groupby("run_id", sort=False):
        row = info.loc[run_id]
        g = _Named(groups.loc[row["group"]])
        keys = _group_keys(rep, g) | {"series": series_label(rep, g), "run_id": run_id}
        columns = ["t_s"] + [c for c, _, _ in TRACE_PANELS if c in samples.columns]
        frames.append(samples[columns].assign(**keys))
    frame = pd.concat(frames, ignore_index=True)
    found = []
    for number, ((machine, dataset, device, profile), data) in enumerate(
            frame.groupby(["machine", "dataset", "device", "profile"], sort=False)):
        where = f"{dataset}, {device}, {profile} profile" + (f", {machine}" if len(rep.sections) > 1 else "")
        panels = [p for p in TRACE_PANELS if p[0] in data.columns and data[p[0]].notna().any()]
        data = data[["machine", "framework", "dataset", "device", "profile", "settings", "threads",
                     "series", "run_id", "t_s"] + [c for c, _, _ in panels]].reset_index(drop=True)
        found.append(Chart(f"traces-{number + 1}", f"Resource use: {where}",
                           f"{where}: resources sampled while each job ran, one line per run.",
                           data, _trace_figure(data, panels)))
    return found


def _trace_figure(data: pd.DataFrame, panels: list) -> go.Figure:
    figure = make_subplots(rows=1, cols=len(panels), horizontal_spacing=0.07,
                           subplot_titles=[label for _, label, _ in panels])
    shown = set()
    for (series, run_id), run in data.groupby(["series", "run_id"], sort=False):
        tint = colour(run["framework"].iloc[0])
        for col, (column, label, scale) in enumerate(panels, start=1):
            unit = label.split(", ")[-1]
            figure.add_trace(go.Scatter(
                x=run["t_s"], y=pd.to_numeric(run[column]) * scale, mode="lines", name=series,
                legendgroup=series, showlegend=series not in shown and col == 1, line_color=tint,
                hovertemplate=f"{series}<br>run {run_id[:8]}<br>%{{x:.1f}} s: %{{y:.2f}} {unit}<extra></extra>"),
                row=1, col=col)
        shown.add(series)
    figure.update_xaxes(title_text="time since the job started, s")
    _layout(figure, height=380)
    return figure


# --- shared drawing ---

def _horizontal(data: pd.DataFrame, x: str, hover: str, custom: list[str], low: str | None = None,
                high: str | None = None, marker_only: bool = False) -> go.Figure:
    """One bar (or point) a row of ``data``, a row of the chart each, one trace a framework
    so the legend toggles frameworks; the first row on top."""
    figure = go.Figure()
    rank = {name: i for i, name in enumerate(catalog.names())}
    for framework in sorted(data["framework"].unique(), key=lambda f: (rank.get(f, len(rank)), f)):
        part = data[data["framework"] == framework]
        tint = colour(framework)
        error = None
        if low and high and (part[high] > part[low]).any():      # a spread to show
            error = dict(type="data", symmetric=False, array=part[high] - part[x],
                         arrayminus=part[x] - part[low], color="#333", thickness=1.2, width=4)
        common = dict(x=part[x], y=part["series"], name=framework, customdata=part[custom].to_numpy(),
                      hovertemplate=hover, orientation="h", error_x=error)
        if marker_only:
            common.pop("orientation")
            figure.add_trace(go.Scatter(mode="markers", marker=dict(size=12, color=tint,
                                                                    line=dict(color="#222", width=1)),
                                        **common))
        else:
            figure.add_trace(go.Bar(marker_color=tint, opacity=0.85, **common))
    figure.update_yaxes(categoryorder="array", categoryarray=list(data["series"]), autorange="reversed",
                        automargin=True)
    figure.update_layout(barmode="overlay", bargap=0.3)
    _layout(figure, height=140 + ROW_HEIGHT * len(data))
    return figure


def _layout(figure: go.Figure, height: int) -> None:
    figure.update_layout(
        template="plotly_white", height=height, margin=dict(l=10, r=10, t=40, b=10),
        font=dict(family="system-ui, sans-serif", size=12), hoverlabel=dict(align="left"),
        legend=dict(title_text="click to hide or show", groupclick="togglegroup"))
    figure.update_xaxes(automargin=True)


# --- the varied settings against the measures, where a campaign varied any ---

def setting_charts(rep: paper.Report) -> list[Chart]:
    """One chart per machine whose rows vary a setting (report/correlations.py): small
    multiples, a row per setting and a column per measure, the median of each value, one
    line per framework and data set."""
    found = rep.correlations
    if found is None or not len(found):
        return []
    drawn = []
    for section, part in found.groupby("section", sort=True):
        axes = list(dict.fromkeys(part["axis"]))
        measures = [m for m, (name, _) in correlations.MEASURES.items() if name in set(part["measure"])]
        rows = rep.rows[rep.rows["section"] == section]
        data = correlations.series(rows, [(axis, measure) for axis in axes for measure in measures])
        data = data[data.set_index(correlations.FAMILY + ["axis"]).index.isin(
            part.set_index(correlations.FAMILY + ["axis"]).index.unique())].reset_index(drop=True)
        where = machine_label(rep, int(section))
        title = "Settings against the measures" + (f": {where}" if where else "")
        drawn.append(Chart(f"settings-{int(section)}", title, (
            "The median of each measure at each value of each setting the runs varied (a row "
            "per setting, a column per measure), one line per framework and data set; the "
            "tables give the rank correlations."), data, _settings_figure(data, axes, measures)))
    return drawn


def _settings_figure(data: pd.DataFrame, axes: list[str], measures: list[str]) -> go.Figure:
    names = {m: correlations.MEASURES[m][0] for m in measures}
    scale = {"memory_peak_bytes": 2**-30, "accuracy": 100.0}
    units = {"train_time_s": "s", "accuracy": "%", "cpu_percent_mean": "%", "memory_peak_bytes": "GiB"}
    figure = make_subplots(rows=len(axes), cols=len(measures), horizontal_spacing=0.06,
                           vertical_spacing=min(0.12, 0.5 / max(len(axes), 1)),
                           subplot_titles=[f"{names[m]} by {a.removeprefix('hp.')}" for a in axes
                                           for m in measures])
    shown = set()
    for row, axis in enumerate(axes, start=1):
        for col, measure in enumerate(measures, start=1):
            part = data[(data["axis"] == axis) & (data["measure"] == measure)]
            for (framework, dataset), line in part.groupby(["framework", "dataset"], sort=True):
                line = line.sort_values("value", key=lambda v: v.map(correlations.value_order))
                name = f"{framework} {dataset}"
                figure.add_trace(go.Scatter(
                    x=[correlations.value_text(v) for v in line["value"]],
                    y=line["median"] * scale.get(measure, 1.0), mode="lines+markers", name=name,
                    legendgroup=name, showlegend=name not in shown, line_color=colour(framework),
                    customdata=line[["runs"]].values,
                    hovertemplate=f"{name}<br>%{{x}}: %{{y:.4g}} {units[measure]} "
                                  "(median of %{customdata[0]} run(s))<extra></extra>"),
                    row=row, col=col)
                shown.add(name)
            figure.update_yaxes(title_text=units[measure], row=row, col=col)
    figure.update_layout(height=260 * len(axes) + 80, margin=dict(t=60, b=40))
    return figure


def fair_charts(rep: paper.Report) -> list[Chart]:
    """One chart per machine and data set with fair runs (report/verification.py): each
    framework's loss at every logged step, and its difference from the first framework's,
    relative, on a log scale (where the frameworks part)."""
    data = verification.curves(rep.rows, rep.steps)
    drawn = []
    for (section, dataset), part in data.groupby(["section", "dataset"], sort=True):
        family = part[verification.FAMILY[2:]].drop_duplicates().iloc[0]   # the first family
        part = part[(part[verification.FAMILY[2:]] == family).all(axis=1)]
        part = part[["framework", "step", "loss"]].reset_index(drop=True)
        title = on_machine(rep, section, f"Fair profile, {dataset}: the loss step by step")
        drawn.append(Chart(f"fair-{int(section)}-{dataset}", title, (
            "The same network from the same weights on the same batches in every framework: "
            "the batch's loss at each step before its update (top), and its relative "
            "difference from the first framework's (bottom, log scale: 1e-7 is float32's "
            "rounding, 1e-3 the tolerance)."), part, _fair_figure(part)))
    return drawn


def _fair_figure(data: pd.DataFrame) -> go.Figure:
    figure = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                           subplot_titles=["loss", "relative difference from the first framework"])
    frameworks = list(dict.fromkeys(data["framework"]))
    first = data[data["framework"] == frameworks[0]].set_index("step")["loss"]
    for framework in frameworks:
        line = data[data["framework"] == framework].sort_values("step")
        figure.add_trace(go.Scatter(x=line["step"], y=line["loss"], mode="lines", name=framework,
                                    legendgroup=framework, line_color=colour(framework),
                                    hovertemplate=f"{framework}<br>step %{{x}}: loss %{{y:.6g}}"
                                                  "<extra></extra>"), row=1, col=1)
        if framework != frameworks[0]:
            against = first.reindex(line["step"]).to_numpy()
            difference = np.abs(line["loss"].to_numpy() - against) / np.abs(against)
            figure.add_trace(go.Scatter(x=line["step"], y=np.maximum(difference, 1e-9), mode="lines",
                                        name=framework, legendgroup=framework, showlegend=False,
                                        line_color=colour(framework),
                                        hovertemplate=f"{framework}<br>step %{{x}}: %{{y:.2e}}"
                                                      "<extra></extra>"), row=2, col=1)
    figure.update_yaxes(type="log", row=2, col=1)
    figure.update_xaxes(title_text="step", row=2, col=1)
    figure.update_layout(height=560, margin=dict(t=60, b=40))
    return figure


# the layers' colours in a stacked bar (by kind: convolutions warm, dense layers cool)
LAYER_COLOURS = {"conv": ["#b2182b", "#d6604d", "#f4a582"], "linear": ["#2166ac", "#4393c3", "#92c5de"],
                 "pool": ["#1b7837", "#5aae61", "#a6dba0"], "relu": ["#762a83", "#9970ab", "#c2a5cf"]}
REST_COLOUR = "#bdbdbd"


def op_charts(rep: paper.Report) -> list[Chart]:
    """One stacked bar chart per machine and data set with timed fair runs
    (report/verification.op_times): per framework, each layer's forward and backward time
    stacked in the network's order, then the rest of the training's step."""
    data = verification.op_times(rep.rows, rep.ops)
    drawn = []
    for (section, dataset), part in data.groupby(["section", "dataset"], sort=True):
        title = on_machine(rep, section, f"Where the fair time goes, {dataset}")
        drawn.append(Chart(f"ops-{int(section)}-{dataset}", title, (
            "Each layer of the fair network timed alone at its training shape, its forward "
            "and backward pass stacked in the network's order (the same colour, the backward "
            "pass hatched); a bar marks the training's mean step, and the grey rest is what the "
            "step spends outside the layers timed alone (the loss, the update, feeding the "
            "batch, the framework's own work between layers). A diamond marks the network "
            "timed as one model."), part.drop(columns="section").reset_index(drop=True), _op_figure(part)))
    return drawn


def _op_figure(data: pd.DataFrame) -> go.Figure:
    frameworks = list(dict.fromkeys(data["framework"]))
    layers = (data[data["index"] >= 0].drop_duplicates("layer").sort_values("index", kind="stable"))
    figure = go.Figure()
    used = {}
    for layer in layers.itertuples():
        shades = LAYER_COLOURS.get(layer.kind, [OTHER])
        colour_ = shades[used.get(layer.kind, 0) % len(shades)]
        used[layer.kind] = used.get(layer.kind, 0) + 1
        rows = data[data["layer"] == layer.layer].set_index("framework").reindex(frameworks)
        for which, pattern in (("forward", ""), ("backward", "/")):
            values = rows[f"{which}_s"].clip(lower=0) * 1e3
            figure.add_trace(go.Bar(
                x=frameworks, y=values, name=layer.layer, marker_color=colour_,
                marker_pattern_shape=pattern, legendgroup=layer.layer, showlegend=which == "forward",
                hovertemplate=f"%{{x}}<br>{layer.layer} ({layer.kind}, {layer.shape}) {which}: "
                              "%{y:.2f} ms<extra></extra>"))
    steps = data[data["kind"] == "step"].set_index("framework").reindex(frameworks)["step_s"] * 1e3
    # the layers as the bars draw them (a pass below 0 as 0), so that with the rest they reach the step
    summed = (data[data["index"] >= 0][["forward_s", "backward_s"]].clip(lower=0)
              .groupby(data["framework"]).sum().sum(axis=1).reindex(frameworks) * 1e3)
    figure.add_trace(go.Bar(x=frameworks, y=(steps - summed).clip(lower=0), name="rest of the step",
                            marker_color=REST_COLOUR,
                            hovertemplate="%{x}<br>the step less the layers: %{y:.2f} ms<extra></extra>"))
    network = data[data["kind"] == "network"].set_index("framework").reindex(frameworks)
    figure.add_trace(go.Scatter(
        x=frameworks, y=(network["forward_s"] + network["backward_s"]) * 1e3, mode="markers",
        name="network, as one model", marker=dict(symbol="diamond", size=11, color="black"),
        hovertemplate="%{x}<br>the network forward and backward: %{y:.2f} ms<extra></extra>"))
    figure.add_trace(go.Scatter(
        x=frameworks, y=steps, mode="markers", name="training's step",
        marker=dict(symbol="line-ew", size=60, line=dict(width=3, color="black")),
        hovertemplate="%{x}<br>the training's mean step: %{y:.2f} ms<extra></extra>"))
    figure.update_layout(barmode="stack", height=520, margin=dict(t=40, b=40),
                         yaxis_title="milliseconds per step", legend=dict(traceorder="normal"))
    return figure
