"""Which stored rows a command shows: ``--where``, ``--framework`` and ``--dataset``.

A ``--where`` condition is ``COLUMN OP VALUE`` on a stored column (docs/schema.md), with
OP one of ``=``, ``!=``, ``<``, ``<=``, ``>``, ``>=``.  ``=`` and ``!=`` take a comma list
(any of); an empty value is a missing one (``campaign=``).  Values are compared as the
column stores them: numbers as numbers (accuracy is a fraction there), times as times,
true/false for yes-no columns, the rest as text.  Every condition must hold.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    import pandas as pd

_CONDITION = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(!=|<=|>=|=|<|>)(.*)$")


@dataclasses.dataclass(frozen=True)
class Condition:
    column: str
    op: str
    value: str

    def __str__(self) -> str:
        return f"{self.column}{self.op}{self.value}"


def parse(text: str) -> Condition:
    """One ``COLUMN OP VALUE``; the column is checked against the rows by ``apply``."""
    match = _CONDITION.match(text)
    if match is None:
        raise UsageError(f"--where {text!r}: not COLUMN OP VALUE (OP one of = != < <= > >=), "
                         "e.g. framework_version=2.20.0")
    column, op, value = match.groups()
    return Condition(column, op, value.strip())


def conditions(where: list[str] | None, framework: str | None = None,
               dataset: str | None = None) -> list[Condition]:
    """The conditions of the three options; ``--framework x,y`` is ``--where framework=x,y``."""
    found = [parse(text) for text in where or []]
    found += [Condition(column, "=", value) for column, value in
              (("framework", framework), ("dataset", dataset)) if value is not None]
    return found


def apply(frame: pd.DataFrame, chosen: list[Condition]) -> pd.DataFrame:
    """The rows of ``frame`` that meet every condition (pandas' types: imported here, where a
    command gives conditions)."""
    import pandas as pd

    keep = pd.Series(True, index=frame.index)
    for condition in chosen:
        keep &= _holds(frame, condition)
    return frame[keep]


def _holds(frame: pd.DataFrame, c: Condition) -> pd.Series:
    import pandas as pd

    if c.column not in frame.columns:
        close = difflib.get_close_matches(c.column, frame.columns, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else " (the columns: docs/schema.md)"
        raise UsageError(f"--where {c}: no stored column {c.column}{hint}")
    column = frame[c.column]
    if c.value == "":
        if c.op not in ("=", "!="):
            raise UsageError(f"--where {c}: an empty value goes with = or != (missing or not)")
        return column.isna() if c.op == "=" else column.notna()
    if c.op in ("=", "!="):
        values = [_typed(column, v.strip(), c) for v in c.value.split(",")]
        found = column.isin(values) & column.notna()
        return found if c.op == "=" else ~found
    value = _typed(column, c.value, c)
    if not (pd.api.types.is_numeric_dtype(column) or pd.api.types.is_datetime64_any_dtype(column)):
        raise UsageError(f"--where {c}: {c.op} compares numbers and times; {c.column} is text")
    compare = {"<": column.lt, "<=": column.le, ">": column.gt, ">=": column.ge}[c.op]
    return compare(value).fillna(False).astype(bool)


def _typed(column: pd.Series, value: str, c: Condition):
    """``value`` as the column stores it."""
    import pandas as pd

    if pd.api.types.is_bool_dtype(column) or (column.dtype == object and column.dropna().map(
            lambda v: isinstance(v, bool)).all() and column.notna().any()):
        if value.lower() not in ("true", "false"):
            raise UsageError(f"--where {c}: {c.column} is true or false")
        return value.lower() == "true"
    if pd.api.types.is_numeric_dtype(column):
        try:
            return float(value)
        except ValueError:
            raise UsageError(f"--where {c}: {c.column} holds numbers, not {value!r}") from None
    if pd.api.types.is_datetime64_any_dtype(column):
        try:
            stamp = pd.Timestamp(value)
        except ValueError:
            raise UsageError(f"--where {c}: {c.column} holds times (e.g. 2026-11-25 or "
                             f"2026-11-25T15:00), not {value!r}") from None
        return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp
    return value
