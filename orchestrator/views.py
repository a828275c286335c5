"""What the report shows, already formatted: its tables as views that every renderer
(text.py for the terminal, Markdown, CSV and JSON; html.py for the page) draws alike."""

from __future__ import annotations

import dataclasses

import pandas as pd

from . import compare


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
