"""What a terminal is shown of words dlbench did not write (a job's error, its log): never
markup, never a control sequence.  The live display and the report's tables both show them."""

from __future__ import annotations

import re

from rich.markup import escape

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(text) -> str:
    """A job's words as the terminal shows them, never as markup: rich's ``[link=...]``
    would be a live link, and a control character (an escape sequence) would drive the
    terminal."""
    return escape(CONTROL.sub("?", str(text)))
