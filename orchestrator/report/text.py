"""The report and the comparison as text: tables for the terminal, Markdown, CSV and JSON
(the stored runs, ``dlbench results``: runs.py).

Every function returns the text; the CLI prints it.  Text is drawn for a terminal ``width``
columns wide (None: a file or a pipe), in colour where ``color_system`` names one (rich's
names: "standard", "256", "truecolor"; None for plain text); draw.py draws the tables.
"""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
from rich.markup import escape
from rich.text import Text

from ..terminal import shown
from . import compare, paper, reference_rows, tta, verification
from .draw import _console, check_columns, draw
from .views import (COMPARISON_KEYS, REPORT_KEYS, comparison_view, correlation_records,
                    correlation_views, fair_views, plan_view, platform_records, platform_views,
                    reference_lines, robustness_records, robustness_views, scaling_views, section_views,
                    transfer_records, transfer_views)



# A spreadsheet reads a cell that begins with one of these as a formula (OWASP's list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# Markdown shows these as they are, never as HTML.
MD_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def csv_text(frame: pd.DataFrame) -> str:
    """The frame as CSV, every text cell that a spreadsheet would take for a formula
    prefixed with a single quote (a job writes framework_version, device_name, its log's
    tail).  Numbers stay numbers: only strings are touched, so -0.5 in a numeric column is
    -0.5."""
    text = [name for name in frame.columns if not _numbers_or_times(frame[name])]
    return frame.assign(**{name: frame[name].map(_inert_cell) for name in text}).to_csv(index=False)


def _numbers_or_times(column: pd.Series) -> bool:
    types = pd.api.types
    return (types.is_numeric_dtype(column) or types.is_bool_dtype(column)
            or types.is_datetime64_any_dtype(column) or types.is_timedelta64_dtype(column))


def _inert_cell(value):
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_STARTS) else value


def md_text(text) -> str:
    """Text of the rows as Markdown shows it, never as markup: ``<``, ``>`` and ``&`` as
    entities (MkDocs would pass raw HTML, a ``<script>`` too, through to the page), and
    no live link: a link's ``](``, a URL's ``://`` and ``www.`` broken with an entity
    (shown as the character; ``[a, b]`` alone is no link and stays as it is)."""
    return (str(text).translate(MD_ESCAPES).replace("](", "]&#40;").replace("://", "&#58;//")
            .replace("www.", "www&#46;"))


def plan_text(jobs, seconds, width: int | None = 80, color_system: str | None = None) -> str:
    """A plan as a table (``views.plan_view``), fitted to a terminal ``width`` wide."""
    console = _console(width, color_system)
    draw(console, plan_view(jobs, seconds), fit=width is not None,
         hint="(--format json shows every field)")
    return console.file.getvalue()


# --- the comparison report ---

def report_table(rep: paper.Report, width: int | None = 80, color_system: str | None = None,
                 columns: list[str] | None = None, wide: bool = False, explain: bool = False) -> str:
    """The report's tables for the terminal (fitted to ``width``) or a file (whole); the
    rules behind them (``rep.notes()``) with ``explain``, else a line that says how."""
    if columns is not None:
        check_columns(columns, REPORT_KEYS)
    console = _console(width, color_system)
    console.print(f"[bold]dlbench report[/bold]: {len(rep.rows)} stored run(s) on "
                  f"{len(rep.sections)} machine(s) / schema version(s)")
    for section in rep.sections:
        console.print(f"\n[bold cyan]Rows from[/bold cyan] {escape(section.title)}")
        for view in section_views(rep, section):
            if columns is not None:
                view = view.only(columns)
                if not view.keys:
                    continue
            draw(console, view, fit=width is not None and not wide, drop=columns is None)
        if columns is None:
            for view in (tta.views(rep, section) + robustness_views(rep, section)
                         + transfer_views(rep, section) + platform_views(rep, section)
                         + scaling_views(rep, section) + correlation_views(rep, section)
                         + fair_views(rep, section)):
                draw(console, view, fit=width is not None and not wide)
        heading, lines = reference_lines(rep, section)
        if lines and columns is None:
            console.print(f"\n[bold]{escape(heading)}[/bold]")
            for line in lines:
                console.print(f"- {line}", markup=False)
    if not explain:        # a command to copy: never wrapped
        console.print()
        console.print(Text(EXPLAIN_LINE, style="dim", no_wrap=True, overflow="ignore"), crop=False)
    for note in rep.notes() if explain else []:
        console.print(f"- {note}", markup=False)
    return console.file.getvalue()


EXPLAIN_LINE = "The rules behind these verdicts and statistics: dlbench report --explain"


def report_markdown(rep: paper.Report) -> str:
    lines = ["# dlbench report", "",
             f"{len(rep.rows)} stored run(s) on {len(rep.sections)} machine(s) / schema version(s).", ""]
    for section in rep.sections:
        lines += [f"## Rows from {md_text(section.title)}", ""]
        for view in (section_views(rep, section) + tta.views(rep, section)
                     + robustness_views(rep, section) + transfer_views(rep, section)
                     + platform_views(rep, section) + scaling_views(rep, section)
                     + correlation_views(rep, section)
                     + fair_views(rep, section)):
            lines += [f"### {md_text(view.title)}", "", _md_row(view.columns),
                      "|" + "|".join("---:" if i in view.numeric else "---"
                                     for i in range(len(view.columns))) + "|"]
            lines += [_md_row(row) for row in view.rows] + [""]
        heading, found = reference_lines(rep, section)
        if found:
            lines += [f"### {md_text(heading)}", ""] + [f"- {md_text(line)}" for line in found] + [""]
    lines += ["## Notes", ""] + [f"- {md_text(note)}" for note in rep.notes()]
    return "\n".join(lines) + "\n"


def _md_row(cells) -> str:
    return "| " + " | ".join(md_text(c).replace("|", "\\|") for c in cells) + " |"


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
#   3  "disturbed_left_out" (runs left out by --exclude-disturbed); a group's "disturbed", its
#      ok runs the noise rule marks (report/noise.py), counted in its statistics.
#      Added later, as a key that readers of 3 may ignore: "reference_rows", present only where
#      the report holds quick groups (their verdicts against dlbench's reference rows).
#      Added later too, likewise: "robustness", present only where the rows have any: one
#      record per group, attack and epsilon (accuracy_median/_min/_max over its ok runs,
#      time_s_median, images, runs, reasons where the accuracy is empty).
#      Added later too, likewise: "transfer", present only where a run kept FGSM images:
#      one record per cell of each transfer matrix (section, dataset, profile, images_of
#      with its run id, epsilon, images and own_fgsm_accuracy, model_of with its run id,
#      accuracy, reason where it is empty).
#      Added later too, likewise: "correlations", present only where a family of ok runs
#      varies a setting: one record per family, axis and measure (report/correlations.py:
#      section, framework, dataset, model, device, profile, axis, measure, runs, values,
#      statistic rho or epsilon2, value, best).
#      Added later too, likewise: "fair", present only where the rows hold fair-profile runs
#      (report/verification.py): "logits" (section, dataset, framework, runs, logit_error,
#      within), "losses" (section, dataset, device, fair_weights_sha256, settings,
#      framework, other, steps, first_difference, parts_at) and "speeds" (section, dataset,
#      device, settings, threads, framework, runs, train_time_s, images_per_s, ratio);
#      and, added later, "ops" (section, dataset, framework, layer, index, kind, shape,
#      flops, forward_s, backward_s, step_s: report/verification.op_times); and "reference"
#      (section, dataset, framework, ties, runs, steps, difference, tolerance, within, reason:
#      report/verification.references).
#      Added later too, likewise: "time_to_accuracy", present only where ok runs have
#      per-epoch accuracies: one record per group (report/tta.groups: section, group,
#      framework, dataset, model, device, profile, settings, target_pct, runs, reached,
#      epoch_median, time_s_median/_min/_max, best_accuracy_pct, epochs_max); and each
#      group's tta_target_pct, tta_reached, tta_epoch_median, tta_time_s_median/_min/_max.
JSON_FORMAT_VERSION = 3
# the quick groups' columns against the reference rows, as the CSV and JSON name them
REFERENCE_COLUMNS = {"verdict": "reference_verdict", "reference_accuracy_pct": "reference_accuracy_pct",
                     "diff_points": "reference_diff_points",
                     "tolerance_points": "reference_tolerance_points",
                     "reference_train_time_s": "reference_train_time_s",
                     "speed_ratio": "reference_speed_ratio", "reference_runs": "reference_runs"}


# a group's time to accuracy in the CSV and the JSON groups, prefixed tta_ (report/tta.py)
TTA_COLUMNS = ["target_pct", "reached", "epoch_median", "time_s_median", "time_s_min", "time_s_max"]


def report_frame(rep: paper.Report, join_lists: bool = True) -> pd.DataFrame:
    """One flat row per group, with its machine: the CSV form (lists joined with "; ")."""
    machines = pd.DataFrame([{"section": s.index, "host_name": s.host_name,
                              "host_cpu_model": s.host_cpu_model, "schema_version": s.schema_version}
                             for s in rep.sections])
    frame = rep.groups.drop(columns=CSV_DROP)
    if join_lists:
        frame = frame.assign(**{c: frame[c].map("; ".join) for c in LISTS})
    if len(machines):
        frame = machines.merge(frame, on="section")
    found = tta.groups(rep)
    if len(found):          # each group's time to accuracy, as tta_* columns
        frame = frame.merge(found[["group", *TTA_COLUMNS]].rename(
            columns={c: f"tta_{c}" for c in TTA_COLUMNS}), on="group", how="left")
    return frame.assign(tolerance_points=rep.tolerance, ratio_tolerance_factor=rep.ratio_tolerance)


def report_json(rep: paper.Report) -> str:
    frame = report_frame(rep, join_lists=False)
    document = {
        "format_version": JSON_FORMAT_VERSION,
        "tolerance_points": rep.tolerance,
        "ratio_tolerance_factor": rep.ratio_tolerance,
        "disturbed_left_out": rep.disturbed_left_out,
        "reference": rep.reference.meta,
        "notes": rep.notes(),
        "machines": [dataclasses.asdict(s) | {"title": s.title} for s in rep.sections],
        "groups": json.loads(frame.to_json(orient="records", double_precision=15)),
    }
    robustness = robustness_records(rep)
    if robustness:
        document["robustness"] = robustness
    if rep.transfer:
        document["transfer"] = transfer_records(rep)
    found = platform_records(rep)
    if found:
        document["platforms"] = found
    found = correlation_records(rep)
    if found:
        document["correlations"] = found
    found = tta.records(rep)
    if found:
        document["time_to_accuracy"] = found
    if len(verification.fair_rows(rep.rows)):
        document["fair"] = verification.records(rep.rows, rep.steps, rep.ops, rep.fair_reference)
    judgement = rep.against_reference
    if judgement is not None and len(judgement.groups):
        quick = judgement.groups.assign(section=judgement.groups["group"].map(
            rep.groups.set_index("group")["section"]))
        document["reference_rows"] = {
            "machine": judgement.machine,
            "tolerance_points": reference_rows.TOLERANCE_POINTS,
            "spread_factor": reference_rows.SPREAD_FACTOR,
            "speed_ratio": {str(section): judgement.speed_ratio(part["group"])
                            for section, part in quick.groupby("section")},
            "groups": json.loads(quick[["section", "group", "verdict", "accuracy_pct",
                                        *list(REFERENCE_COLUMNS)[1:], "train_time_s"]].rename(
                columns=REFERENCE_COLUMNS).to_json(orient="records", double_precision=15)),
        }
    return json.dumps(document, indent=1, ensure_ascii=False)


def _csv(rep: paper.Report) -> str:
    """The CSV: ``report_frame``, and each quick group's verdict against the reference rows."""
    frame = report_frame(rep)
    judgement = rep.against_reference
    if judgement is not None:
        frame = frame.merge(judgement.groups[["group", *REFERENCE_COLUMNS]].rename(
            columns=REFERENCE_COLUMNS), on="group", how="left")
    return csv_text(frame)


def render_report(rep: paper.Report, fmt: str, width: int | None = 80,
                  color_system: str | None = None, columns: list[str] | None = None,
                  wide: bool = False, explain: bool = False) -> str:
    """The report as terminal tables (fmt 'table'; its rules with ``explain``), Markdown,
    CSV or JSON text (always with the rules)."""
    if fmt == "md":
        return report_markdown(rep)
    if fmt == "csv":
        return _csv(rep)
    if fmt == "json":
        return report_json(rep)
    return report_table(rep, width, color_system, columns, wide, explain)


# --- two sets of runs (`dlbench compare`) ---

def render_comparison(cmp: compare.Comparison, fmt: str, width: int | None = 80,
                      color_system: str | None = None, columns: list[str] | None = None,
                      wide: bool = False) -> str:
    """The comparison as a terminal table (fmt 'table'), Markdown, CSV or JSON text."""
    if fmt == "csv":
        return csv_text(comparison_frame(cmp))
    if fmt == "json":
        return json.dumps({"format_version": 2, "metric": cmp.metric, "a": cmp.a.label,
                           "b": cmp.b.label, "alpha": compare.ALPHA, "confidence": compare.CONFIDENCE,
                           "min_runs": compare.MIN_RUNS, "across": cmp.across,
                           "fail_on_slowdown": cmp.fail_on_slowdown,
                           "allow_inconclusive": cmp.allow_inconclusive,
                           "exit_status": cmp.exit_status, "tally": cmp.tally(),
                           "warnings": cmp.warnings(),
                           "exclude_disturbed": cmp.exclude_disturbed, "notes": cmp.notes(),
                           "groups": json.loads(comparison_frame(cmp).to_json(
                               orient="records", double_precision=15))}, indent=1, ensure_ascii=False)
    view = comparison_view(cmp)
    if fmt == "md":
        lines = [f"# dlbench compare", "", f"### {md_text(view.title)}", "", _md_row(view.columns),
                 "|" + "|".join("---:" if i in view.numeric else "---"
                                for i in range(len(view.columns))) + "|"]
        lines += [_md_row(row) for row in view.rows] + ["", "## Notes", ""]
        return "\n".join(lines + [f"- {md_text(note)}" for note in cmp.notes()]) + "\n"
    if columns is not None:
        check_columns(columns, COMPARISON_KEYS)
        view = view.only(columns)
    console = _console(width, color_system)
    draw(console, view, fit=width is not None and not wide, drop=columns is None)
    for note in cmp.notes():
        console.print(f"- {note}", markup=False)
    return console.file.getvalue()


def comparison_frame(cmp: compare.Comparison) -> pd.DataFrame:
    """One flat row per pair: the splits as a_host_name, b_image_id, ..."""
    frame = cmp.groups.copy()
    for name in ("a", "b"):
        splits = frame.pop(f"{name}_split")
        for key in cmp.split:
            frame[f"{name}_{key}"] = [s.get(key) if isinstance(s, dict) else None for s in splits]
    return frame
