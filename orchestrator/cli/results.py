"""The commands over stored runs: ``results``, ``status``, ``compact``, ``recover``,
``upgrade``, ``report``, ``site``, ``compare``."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import (ColumnsOpt, DatasetFilter, DisturbedOpt, Format, FrameworkFilter, ResultsOpt,
                     WhereOpt, WideOpt, _names, _screen, _warn_line, _write, app, err, out)


@app.command()
def results(results: ResultsOpt = None,
            format: Annotated[Format, typer.Option("--format", help="table, csv or json.")] = Format.table,
            where: WhereOpt = [], framework: FrameworkFilter = None, dataset: DatasetFilter = None,
            columns: ColumnsOpt = None, wide: WideOpt = False):
    """Show the stored runs."""
    from .. import store
    from ..report import load_table, runs, select     # pyarrow; pandas for CSV, JSON and conditions

    rows = load_table(store.results_dir(results), select.conditions(where, framework, dataset))
    _write(runs.results_text(rows, format.value, _screen(), out.color_system, _names(columns), wide))


@app.command()
def status(results: ResultsOpt = None):
    """A Slurm campaign's jobs by state: queued, running, stored ok, failed..."""
    from .. import store
    from ..schedulers import slurm

    target = store.results_dir(results)
    found = slurm.status(target)
    if not found:
        out.print(f"{target}: no Slurm arrays submitted", highlight=False)
    for array in found:
        states = ", ".join(f"{n} {s}" for s, n in sorted(array["states"].items()))
        out.print(f"array {array['array']}" + (f" ({array['campaign']})" if array["campaign"] else "")
                  + f": {array['jobs']} job(s): {states}", highlight=False)


@app.command()
def compact(results: ResultsOpt = None):
    """Merge a results directory's many small files (one a job) into one for rows, one for
    traces and one for robustness: reading and reporting become fast; nothing is lost."""
    from .. import store

    target = store.results_dir(results)
    out.print(f"{target}: merged {store.counted(store.compact(target))}", highlight=False)


@app.command()
def recover(results: ResultsOpt = None):
    """Store the rows a run could not write (a full or read-only disk) and kept aside
    in RESULTS/_rescued/."""
    from .. import store

    target = store.results_dir(results)
    count, problems = store.recover(target)
    for line in problems:
        _warn_line(line)
    out.print(f"{target}: recovered {count} row(s)", highlight=False)
    if problems:
        raise typer.Exit(1)


@app.command()
def upgrade(results: ResultsOpt = None):
    """Rewrite a results directory's older files in the current layout and schema, so that
    any Parquet reader reads RESULTS/runs whole; nothing is lost."""
    from .. import store

    target = store.results_dir(results)
    out.print(f"{target}: upgraded {store.counted(store.rewrite(target))} to schema version "
              f"{store.SCHEMA_VERSION}", highlight=False)


class ReportFormat(str, enum.Enum):
    table = "table"
    md = "md"
    csv = "csv"
    json = "json"


@app.command("report")
def report_(results: ResultsOpt = None,
            format: Annotated[Optional[ReportFormat], typer.Option(
                "--format", help="table (default), md, csv or json.")] = None,
            html: Annotated[Optional[Path], typer.Option(
                "--html", help="Write a self-contained HTML page with plots to DIR/index.html.",
                metavar="DIR")] = None,
            tolerance: Annotated[Optional[float], typer.Option(
                help="Accuracy within this many percentage points of the paper counts as "
                     "reproduced (default: the report's, 1 point).")] = None,
            where: WhereOpt = [], framework: FrameworkFilter = None, dataset: DatasetFilter = None,
            columns: ColumnsOpt = None, wide: WideOpt = False, exclude_disturbed: DisturbedOpt = False,
            data_dir: Annotated[Optional[Path], typer.Option(
                "--data-dir", help="Local copy of the data sets, for the fair runs' reference "
                                   "training (default: $DLBENCH_DATA_DIR, else the user cache; "
                                   "never downloaded).")] = None,
            target: Annotated[Optional[str], typer.Option(
                "--target", metavar="T", help="Time to accuracy: the training accuracy to reach, a "
                "fraction (0.99) or a percent (99%) (default: each model's, docs/reports.md).")] = None,
            explain: Annotated[bool, typer.Option(
                "--explain", help="Print the rules behind the verdicts, spans, statistics and "
                                  "disturbed runs after the tables.")] = False):
    """Compare the stored runs with the published GTDLBench numbers: statistics, verdicts, plots."""
    from .. import store
    from ..report import make_report, select, tta

    goal = tta.parse_target(target)
    text, page = make_report(
        store.results_dir(results), format and format.value, html, tolerance, _screen(),
        out.color_system, select.conditions(where, framework, dataset), _names(columns),
        wide, exclude_disturbed, data_dir=data_dir, target=goal, explain=explain)
    if text is not None:
        _write(text)
    if page is not None:
        err.print(f"report written to {page}", highlight=False, soft_wrap=True)


@app.command()
def site(dirs: Annotated[list[Path], typer.Argument(
             help="Results folders; a folder holding results folders stands for each of them.",
             metavar="DIR", show_default=False)],
         out: Annotated[Path, typer.Option(
             "-o", "--out", help="The site's folder (made if missing; its pages replaced).",
             metavar="OUT")],
         data_dir: Annotated[Optional[Path], typer.Option(
             "--data-dir", help="Local copy of the data sets, for the fair runs' reference "
                                "training (as report's; never downloaded).")] = None):
    """One static site over many results folders: an index by date, machine and profile, each
    folder's report page, and a history chart per framework, data set and profile."""
    from ..report import site as site_

    index = site_.build(dirs, out, data_dir)
    err.print(f"site written to {index}", highlight=False, soft_wrap=True)


class Metric(str, enum.Enum):
    train_time_s = "train_time_s"
    test_time_s = "test_time_s"
    accuracy = "accuracy"


@app.command("compare")
def compare_(a: Annotated[str, typer.Argument(
                 help="A: a results directory, a condition on the rows of --results "
                      "(framework_version=1.9.1), with --by a value of that setting, or a "
                      "campaign's name there.")],
             b: Annotated[str, typer.Argument(help="B, the same way.")],
             results: ResultsOpt = None,
             metric: Annotated[Metric, typer.Option(help="What to compare.")] = Metric.train_time_s,
             fail_on_slowdown: Annotated[Optional[str], typer.Option(
                 help="Exit with status 4 where a group of B is significantly slower than A's and "
                      "the interval's lower end is above this, e.g. 5%; else with status 5 where a "
                      "group cannot be judged (too few runs, one side only).")] = None,
             allow_inconclusive: Annotated[bool, typer.Option(
                 "--allow-inconclusive", help="With --fail-on-slowdown, let the groups that "
                                              "cannot be judged pass.")] = False,
             by: Annotated[Optional[str], typer.Option(
                 "--by", metavar="KEY", help="Compare across this setting (blas, onednn, a "
                 "hyper-parameter or framework_version): A and B may be its values, e.g. --by "
                 "blas blis openblas, --by framework_version 2.15 2.20.")] = None,
             ignore: Annotated[list[str], typer.Option(
                 "--ignore", metavar="KEY", help="Pair groups that differ in this setting "
                                                 "(repeatable).")] = [],
             format: Annotated[Optional[ReportFormat], typer.Option(
                 "--format", help="table (default), md, csv or json.")] = None,
             where: WhereOpt = [], framework: FrameworkFilter = None, dataset: DatasetFilter = None,
             columns: ColumnsOpt = None, wide: WideOpt = False, exclude_disturbed: DisturbedOpt = False):
    """Compare two sets of runs group by group: medians, B ÷ A with its confidence interval,
    a significance test and a verdict."""
    from .. import store
    from ..report import compare, select, text

    chosen, slowdown = select.conditions(where, framework, dataset), compare.threshold(fail_on_slowdown)
    first, second, across = compare.sides(a, b, store.results_dir(results), chosen, by, ignore)
    cmp = compare.build(first, second, metric.value, exclude_disturbed, slowdown, across,
                        allow_inconclusive)
    _write(text.render_comparison(cmp, format.value if format else "table", _screen(),
                                  out.color_system, _names(columns), wide))
    if cmp.exit_status:
        raise typer.Exit(cmp.exit_status)
