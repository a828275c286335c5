"""`dlbench report`: load the stored runs, compare them with the published study, and
render the comparison as text (text.py) or as an HTML page (html.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .. import store
from ..errors import StoreError, UsageError
from . import select

if TYPE_CHECKING:
    import pyarrow as pa

    from . import paper


def make_report(results: Path, fmt: str | None, html_dir: Path | None, tolerance: float | None = None,
                width: int | None = 80, color_system: str | None = None,
                where: list[select.Condition] = (), columns: list[str] | None = None,
                wide: bool = False, exclude_disturbed: bool = False,
                reference: Path | None = None, data_dir: Path | None = None,
                target: float | None = None, explain: bool = False) -> tuple[str | None, Path | None]:
    """The whole `dlbench report`: load, choose, compare, render; returns (text, page written).
    ``width`` None draws for a file or a pipe (tables whole, nothing wrapped).  Quick groups
    are held against the reference rows (``reference_rows.LOCATION`` unless ``reference``).
    Fair runs' step losses are held against a reference training on the data sets of
    ``data_dir`` (``datasets.default_root``; never downloaded here).  Times to accuracy are
    to ``target`` (a fraction), else to each model's default (tta.py)."""
    from . import text

    rep = build_report(results, tolerance, where, exclude_disturbed, reference, data_dir, target,
                       traces=html_dir is not None)     # only the page plots the traces
    page = None
    if html_dir is not None:
        from . import html     # plotly: imported only for the page
        page = html.write_page(rep, html_dir)
    rendered = None
    if fmt is not None or html_dir is None:
        rendered = text.render_report(rep, fmt or "table", width, color_system, columns, wide, explain)
    return rendered, page


def build_report(results: Path, tolerance: float | None = None, where: list[select.Condition] = (),
                 exclude_disturbed: bool = False, reference: Path | None = None,
                 data_dir: Path | None = None, target: float | None = None,
                 traces: bool = False) -> paper.Report:
    """The report of the stored rows of ``results`` that meet ``where``, with everything
    that the text and the page show (``traces``: the resource samples too)."""
    from .. import datasets
    from . import correlations, paper, reference_rows, transfer, tta, verification

    tolerance = paper.TOLERANCE_POINTS if tolerance is None else tolerance
    if not 0 <= tolerance <= 100:
        raise UsageError(f"--tolerance {tolerance:g}: a tolerance is 0 points or more, at most 100")
    frame = load(results, where)
    rep = paper.build(frame, store.load_traces(results) if traces else None, tolerance,
                        exclude_disturbed=exclude_disturbed)
    rep.against_reference = reference_rows.judge(rep, reference)
    rep.robustness = store.load_robustness(results, rep.rows["run_id"])
    if "platforms" in rep.rows and rep.rows["platforms"].notna().any():
        rep.platforms = store.load_side(results, store.PLATFORMS, rep.rows["run_id"])
    rep.transfer = transfer.matrices(results, rep)
    rep.correlations = correlations.table(rep.rows)
    if len(verification.fair_rows(rep.rows)):
        rep.steps = store.load_steps(results, rep.rows["run_id"])
        rep.ops = store.load_ops(results, rep.rows["run_id"])
        rep.fair_reference = verification.references(rep.rows, rep.steps, datasets.default_root(data_dir)[0])
    rep.time_to_accuracy = tta.runs(rep, target)
    return rep


def load(results: Path, where: list[select.Condition] = ()):
    """The stored rows of ``results`` that meet ``where``; none is an error."""
    frame = _some(results, store.load(results))
    return _met(results, select.apply(frame, list(where)), where, len(frame))


def load_table(results: Path, where: list[select.Condition] = ()) -> pa.Table:
    """``load``'s rows as pyarrow's table; without conditions, without pandas (``select``
    holds rows to them in pandas' types, and the table keeps the rows it chose)."""
    table = _some(results, store.load_table(results))
    if not where:
        return table
    chosen = select.apply(store.frame(table), list(where))
    return _met(results, table.take(chosen.index.to_numpy()), where, len(table))


def _some(results: Path, rows):
    if not len(rows):
        raise StoreError(f"{results}: no stored runs (run `dlbench run` first)")
    return rows


def _met(results: Path, chosen, where: list[select.Condition], of: int):
    if not len(chosen):
        raise StoreError(f"{results}: no stored run meets {' and '.join(map(str, where))} (of {of})")
    return chosen
