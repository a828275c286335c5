"""The views (``View``: one table, already formatted), how they write their numbers, and a
view drawn for the terminal.  No pandas: ``dlbench results`` draws its rows without it.

A table for a terminal fits its width: a column wraps only between words, so a number is
never cut; where the columns do not fit even so, those of the view's ``drop`` list are left
out in its order (a line under the table names them), unless ``columns`` chose them
(``--columns``) or ``wide`` asked for every one (``--wide``); where even that is too wide,
each row is drawn as a block of its own, a line per column (heading, value), never wider
than the terminal.  A reason that a verdict column repeats is shown once, under the table,
as a numbered footnote.  In a file or a pipe every table is drawn whole, however wide, and
no line is wrapped.
"""

from __future__ import annotations

import dataclasses
import difflib
import io

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import UsageError
from ..terminal import shown

GAP = 2     # the space between two columns of a table


@dataclasses.dataclass
class View:
    """One table of the report, already formatted: what every renderer shows."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    numeric: set[int]
    verdicts: set[int] = dataclasses.field(default_factory=set)   # verdict columns, coloured
    wrap: set[int] = dataclasses.field(default_factory=lambda: {4})   # the settings column
    keys: list[str] = dataclasses.field(default_factory=list)   # each column's --columns name
    # the keys left out first where a terminal is too narrow; the others are always shown
    drop: list[str] = dataclasses.field(default_factory=list)

    def only(self, keys) -> View:
        """The view with the columns of ``keys`` only, in its own order."""
        kept = [i for i, key in enumerate(self.keys) if key in keys]
        where = {old: new for new, old in enumerate(kept)}
        return dataclasses.replace(
            self, columns=[self.columns[i] for i in kept], keys=[self.keys[i] for i in kept],
            rows=[[row[i] for i in kept] for row in self.rows],
            numeric={where[i] for i in self.numeric if i in where},
            verdicts={where[i] for i in self.verdicts if i in where},
            wrap={where[i] for i in self.wrap if i in where},
            drop=[key for key in self.drop if key in keys])


# -- how the views write their numbers --------------------------------------------------------
def _seconds(v: float) -> str:
    return f"{v:,.1f}" if v >= 100 else f"{v:.2f}"


def _published(v: float) -> str:
    return f"{v:,.2f}"


def _pct(v: float) -> str:
    return f"{v:.2f}"


def _fixed2(v: float) -> str:
    return f"{v:.2f}"


def _percent(v: float) -> str:
    return f"{v:.0f}"


def _rate(v: float) -> str:
    return f"{v:,.0f}"


def _gib(v: float) -> str:
    return f"{v / 2**30:.2f}"


def _ratio(v) -> str:
    return f"{v:.2f}×"


# -- a view drawn ------------------------------------------------------------------------------
def check_columns(columns: list[str], known: list[str]) -> None:
    """``--columns``: every name one the table knows."""
    for name in columns:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            raise UsageError(f"--columns: no column {name!r}" + (
                f" (did you mean {', '.join(close)}?)" if close else f"; choose from {', '.join(known)}"))


def _console(width: int | None, color_system: str | None) -> Console:
    """A console that draws into a string, as the CLI's own would: a terminal ``width``
    columns wide wraps prose at words; a file or a pipe (None) wraps nothing."""
    return Console(file=io.StringIO(), width=width or 100_000, color_system=color_system,
                   force_terminal=color_system is not None, soft_wrap=width is None,
                   highlight=False)


HINT = "(--wide shows every column, --columns chooses)"


def draw(console: Console, view: View, fit: bool, drop: bool = True, hint: str = HINT) -> None:
    """A view as a table: fitted to the console (``fit``: repeated verdict reasons as
    footnotes, leaving out the view's ``drop`` columns where it must and ``drop`` allows,
    else a block per row) or whole."""
    whole, left_out, widths, notes = view, [], None, []
    if fit:
        view, notes = footnoted(view)
        whole = view
        for candidate in (view, lifted(view)):      # as it is, then without one-value columns
            view, left_out = _fitted(candidate, console.width, drop)
            widths = _widths(view, console.width)
            if widths is not None:
                break
        if widths is None:
            _blocks(console, whole)
            _footnotes(console, notes)
            return
    if widths is None:                   # whole, however wide
        view, left_out, widths = whole, [], _widths(whole, None)
    table = _table(view, widths)
    width = console.width
    console.width = max(width, sum(widths) + GAP * (len(widths) - 1))
    try:
        console.print(table)
    finally:
        console.width = width
    if left_out:
        console.print(f"[dim]left out to fit {width} columns: {escape(', '.join(left_out))} "
                      f"{escape(hint)}[/dim]")
    _footnotes(console, notes)


def _fitted(view: View, width: int, drop: bool) -> tuple[View, list[str]]:
    """The view with its ``drop`` columns left out in order (where ``drop`` allows) until it
    fits ``width``, and the headings left out; as few as possible."""
    left_out = []
    for key in [k for k in view.drop if k in view.keys] if drop else []:
        if _widths(view, width) is not None:
            break
        left_out.append(view.columns[view.keys.index(key)])
        view = view.only([k for k in view.keys if k != key])
    return view, left_out


def lifted(view: View) -> View:
    """The view without the columns that hold one value in every row (of two rows or
    more): a value is named once in the title instead ("every row: data mnist"), a column
    empty in every row ("-") is left out."""
    if len(view.rows) < 2:
        return view
    same = [i for i in range(len(view.columns)) if len({row[i] for row in view.rows}) == 1]
    if not same or len(same) == len(view.columns):
        return view
    named = [f"{view.columns[i]} {view.rows[0][i]}" for i in same if view.rows[0][i] not in ("", "-")]
    kept = dataclasses.replace(view, title=view.title + (f" (every row: {', '.join(named)})"
                                                         if named else ""))
    return kept.only([k for i, k in enumerate(view.keys) if i not in same])


FOOTNOTE_AFTER = 2      # a reason shown this many times in a column or more becomes a footnote


def footnoted(view: View) -> tuple[View, list[str]]:
    """The view with each reason that its verdict columns repeat (the text after a
    verdict's "kind: ") replaced by a footnote's number, and the footnotes in order."""
    counts: dict[str, int] = {}
    for row in view.rows:
        for i in view.verdicts:
            kind, _, reason = row[i].partition(": ")
            if reason:
                counts[reason] = counts.get(reason, 0) + 1
    notes = [reason for reason, n in counts.items() if n >= FOOTNOTE_AFTER]
    if not notes:
        return view, []
    number = {reason: n for n, reason in enumerate(notes, 1)}
    rows = []
    for row in view.rows:
        row = list(row)
        for i in view.verdicts:
            kind, _, reason = row[i].partition(": ")
            if reason in number:
                row[i] = f"{kind} [{number[reason]}]"
        rows.append(row)
    return dataclasses.replace(view, rows=rows), notes


def _footnotes(console: Console, notes: list[str]) -> None:
    if not notes:
        return
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, justify="right")
    grid.add_column(ratio=1)
    for n, reason in enumerate(notes, 1):
        grid.add_row(f"[{n}]", shown(reason))
    console.print(grid)


def _blocks(console: Console, view: View) -> None:
    """A view too wide for the console even without its ``drop`` columns: its title, then
    each row as a block of lines, a column's heading beside its value (wrapped between
    words); empty cells ("-", "") are left out."""
    console.print(f"[italic]{escape(view.title)}[/italic]")
    rendered = [[_cell(view, row, i) for i in range(len(row))] for row in view.rows]
    for n, (row, cells) in enumerate(zip(view.rows, rendered)):
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=False, max_width=max(8, console.width // 3), style="bold")
        grid.add_column(ratio=1)
        for i, heading in enumerate(view.columns):
            if row[i] not in ("", "-"):
                grid.add_row(escape(heading), cells[i])
        console.print(("\n" if n else "") + f"[dim]({n + 1} of {len(view.rows)})[/dim]")
        console.print(grid)
    console.print()


def _widths(view: View, width: int | None) -> list[int] | None:
    """Each column's width for a table ``width`` wide (None: as wide as its cells), or None
    where it cannot fit so.  A cell of a ``wrap`` column may break between words, any other
    cell is on one line; headings break between words.  Room beyond that goes to the
    wrapping columns first, then to the headings."""
    texts = [[view.columns[i]] + [row[i] for row in view.rows] for i in range(len(view.columns))]
    words = [max(cell_len(w) for text in col for w in text.split() or [""]) for col in texts]
    cells = [max([cell_len(text) for text in col[1:]] + [words[i]]) for i, col in enumerate(texts)]
    words = [w if i in view.wrap else cells[i] for i, w in enumerate(words)]   # one value a line
    whole = [max(cells[i], cell_len(col[0])) for i, col in enumerate(texts)]
    if width is None:
        return whole
    room = width - GAP * (len(texts) - 1)
    if sum(whole) <= room:
        return whole
    if sum(words) > room:
        return None
    widths, spare = list(words), room - sum(words)
    for targets, order in ((cells, sorted(view.wrap)), (whole, range(len(texts)))):
        while spare > 0:
            wanting = [i for i in order if i < len(widths) and widths[i] < targets[i]]
            if not wanting:
                break
            for i in wanting[:spare]:
                widths[i] += 1
                spare -= 1
    return widths


def _table(view: View, widths: list[int]) -> Table:
    table = Table(title=escape(view.title), title_justify="left", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False, collapse_padding=True)
    for i, (heading, width) in enumerate(zip(view.columns, widths)):
        table.add_column(escape(heading), justify="right" if i in view.numeric else "left",
                         width=width)
    for row in view.rows:
        table.add_row(*(_cell(view, row, i) for i in range(len(row))))
    return table


def _cell(view: View, row: list[str], i: int) -> str:
    """A cell as rich markup: a verdict coloured, a status not ok in red, anything else as
    it is."""
    if i in view.verdicts:
        return _coloured(row[i])
    return _status(row[i]) if view.keys[i:i + 1] == ["status"] else shown(row[i])


def _status(status: str) -> str:
    return escape(status) if status == "ok" else f"[red]{escape(status)}[/red]"


def _coloured(verdict: str) -> str:
    from . import paper         # its verdicts' kinds: only the views with verdicts have any

    colour = {paper.REPRODUCED: "green", paper.NOT_REPRODUCED: "red"}.get(paper.kind(verdict), "dim")
    return f"[{colour}]{escape(verdict)}[/{colour}]"
