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
    verdicts: set[int] = dataclasses.field(default_factory=set)   # verdict columns, coloured
    wrap: set[int] = dataclasses.field(default_factory=lambda: {4})   # the settings column


RESOURCE_HEADINGS = {"memory_peak_bytes": "peak memory GiB", "cpu_percent_mean": "CPU %",
                     "gpu_util_mean": "GPU %", "gpu_memory_peak_bytes": "GPU memory GiB"}
SPAN_HEADINGS = {"paper_train_time_s": "paper span train s", "paper_test_time_s": "paper span test s"}
SETTINGS = ["framework", "data", "device", "profile", "settings", "threads"]


def section_views(rep: compare.Report, section: compare.Section) -> list[View]:
    groups = rep.groups[rep.groups["section"] == section.index]
    return [_measured(groups, rep.resources), _against_paper(groups), _ratios(groups)]


def _setting_cells(g) -> list[str]:
    return [g.framework, g.dataset, g.device, g.profile, g.settings,
            "-" if pd.isna(g.threads) else str(g.threads)]


def _measured(groups: pd.DataFrame, resources: list[str]) -> View:
    metrics = [("train_time_s", _seconds), ("test_time_s", _seconds), ("accuracy_pct", _pct),
               ("train_images_per_s", _rate), ("test_images_per_s", _rate)]
    columns = SETTINGS + ["runs", "train s", "test s", "accuracy %", "train img/s", "test img/s"]
    spans = [m for m in ("paper_train_time_s", "paper_test_time_s")
             if groups[f"{m}_median"].notna().any()]      # shown where the rows measured them
    metrics += [(m, _seconds) for m in spans]
    columns += [SPAN_HEADINGS[m] for m in spans]
    columns += [RESOURCE_HEADINGS[c] for c in resources]
    rows = []
    for g in groups.itertuples():
        runs = f"{g.ok}/{g.runs} ok" + (f" ({g.not_ok})" if g.not_ok else "")
        cells = _setting_cells(g) + [runs] + [_stat(g, metric, fmt) for metric, fmt in metrics]
        cells += [_stat(g, c, _gib if c.endswith("bytes") else _percent) for c in resources]
        rows.append(cells)
    return View("Measured: median [min–max] over the ok runs", columns, rows,
                numeric=set(range(len(SETTINGS) + 1, len(columns))))


def _against_paper(groups: pd.DataFrame) -> View:
    """The group's accuracy and times beside the published cell: the times held against the
    published ones are the paper spans where the group has them (the "span" column says)."""
    columns = SETTINGS[:5] + ["accuracy %", "published accuracy %", "Δ points", "accuracy verdict",
                              "caveats", "train s", "published train s", "test s",
                              "published test s †", "times held against the paper"]
    rows = []
    for g in groups.itertuples():
        train = "paper_train_time_s" if g.train_time_span == compare.PAPER_SPAN else "train_time_s"
        test = "paper_test_time_s" if g.test_time_span == compare.PAPER_SPAN else "test_time_s"
        rows.append([g.framework, g.dataset, g.device, g.profile, g.settings] + [
            _num(g.accuracy_pct_median, _pct), _num(g.published_accuracy_pct, _pct),
            _num(g.accuracy_diff_points, lambda v: f"{v:+.2f}"), g.accuracy_verdict,
            _caveats(g.accuracy_caveats),
            _num(getattr(g, f"{train}_median"), _seconds), _num(g.published_train_time_s, _published),
            _num(getattr(g, f"{test}_median"), _seconds),
            _num(g.published_test_time_s, _published)
            + (" †" if compare.present(g.published_test_time_note) else ""),
            _spans(g)])
    return View("Against the paper (GTDLBench, Server1)", columns, rows,
                numeric={5, 6, 7, 10, 11, 12, 13}, verdicts={8}, wrap={4, 8, 9})


def _spans(g) -> str:
    if g.train_time_span == compare.PAPER_SPAN and g.test_time_span == compare.PAPER_SPAN:
        return compare.PAPER_SPAN
    return f"train: {g.train_time_span}; test: {g.test_time_span}"


def _ratios(groups: pd.DataFrame) -> View:
    """Every group's training-time ratio and its verdict; a group in no ratio set (alone on its
    device, or with other settings) shows only why it is not comparable."""
    columns = ["framework", "data", "device", "profile", "settings", "threads", "span", "train s",
               "÷ baseline here", "÷ baseline in paper", "here ÷ paper", "ratio verdict", "caveats"]
    rows = []
    for g in groups.itertuples():
        if compare.present(g.ratio_baseline):
            train = "paper_train_time_s" if g.ratio_span == compare.PAPER_SPAN else "train_time_s"
            measured = [g.ratio_span, _num(getattr(g, f"{train}_median"), _seconds),
                        f"{_ratio(g.train_time_ratio)} (÷ {g.ratio_baseline})",
                        _num(g.published_train_time_ratio, _ratio), _num(g.ratio_vs_published, _ratio)]
        else:
            measured = ["-"] * 5
        rows.append(_setting_cells(g) + measured + [g.ratio_verdict, _caveats(g.ratio_caveats)])
    return View("Training-time ratios: times differ across machines, ratios compare", columns, rows,
                numeric={7, 8, 9, 10}, verdicts={11}, wrap={4, 11, 12})


def _caveats(caveats) -> str:
    return "; ".join(caveats) if len(caveats) else "-"


def _stat(g, metric: str, fmt) -> str:
    median, low, high = (getattr(g, f"{metric}_{s}") for s in ("median", "min", "max"))
    if not compare.present(median):
        return "-"
    text = fmt(median)
    if g.ok > 1 and high > low:
        text += f" [{fmt(low)}–{fmt(high)}]"
    return text


def _num(value, fmt) -> str:
    return fmt(value) if compare.present(value) else "-"


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
