"""`dlbench report`: load the stored runs, compare them with the published study, and
render the comparison as text (text.py) or as an HTML page (html.py)."""

from __future__ import annotations

from pathlib import Path

from .. import store
from ..errors import StoreError, UsageError
from . import compare, text


def make_report(results: Path, fmt: str | None, html_dir: Path | None, tolerance: float | None = None,
                width: int = 80, color_system: str | None = None) -> tuple[str | None, Path | None]:
    """The whole `dlbench report`: load, compare, render; returns (text, page written)."""
    tolerance = compare.TOLERANCE_POINTS if tolerance is None else tolerance
    if not 0 <= tolerance <= 100:
        raise UsageError(f"--tolerance {tolerance:g}: a tolerance is 0 points or more, at most 100")
    frame = store.load(results)
    if not len(frame):
        raise StoreError(f"{results}: no stored runs to report (run `dlbench run` first)")
    traces = store.load_traces(results) if html_dir is not None else None   # only the page plots them
    rep = compare.build(frame, traces, tolerance)
    page = None
    if html_dir is not None:
        from . import html     # matplotlib: imported only for the page
        page = html.write_page(rep, html_dir)
    rendered = None
    if fmt is not None or html_dir is None:
        rendered = text.render_report(rep, fmt or "table", width, color_system)
    return rendered, page
