"""The command line: options in, one call into the pipeline, errors on one line.

    common     the Typer application, its consoles and the options several commands take
    running    build-images, run, tune
    results    results, status, compact, recover, upgrade, report, site, compare
    machine    datasets, doctor, version

Each command imports what it uses: ``dlbench --help`` loads none of store (pyarrow), execute
(the Docker SDK, the job loop), options (pydantic), datasets, downloads or sources.  Every
error a user can cause ends in ``_fail``: one line, a non-zero exit."""

from __future__ import annotations

import sys
import warnings

import typer
from typer.exceptions import TyperException

from ..interrupts import interrupted, received
from ..errors import (DeprecatedName, DlbenchError, StoreWarning, UsageError, docker_errors,
                      usage_message)
from . import common
from .common import _warn_line, app, err

# each module registers its commands, in the order --help lists them
from . import running  # noqa: E402,F401,I001
from . import results  # noqa: E402,F401
from . import machine  # noqa: E402,F401


def main():
    """The command line, once ``entry.main`` has taken over the stop signals."""
    warnings.showwarning = _warning
    code = 0
    try:
        with docker_errors("talking to Docker"):
            code = app(standalone_mode=False) or 0
    except typer.Exit as exc:
        code = exc.exit_code
    except TyperException as exc:   # option parsing: typer's usage errors
        _fail(usage_message(exc.format_message()), exc.exit_code)
    except DlbenchError as exc:
        _fail(str(exc), exc.exit_code, exc.detail, exc)
    except (KeyboardInterrupt, typer.Abort):
        code = 130
    if code == 130 or received:         # typer returns 130 for a KeyboardInterrupt
        code = interrupted()
    sys.exit(code)


_warned: set[str] = set()


def _warning(message, category, filename, lineno, file=None, line=None, _shown=warnings.showwarning):
    """A file the store left out, or a deprecated name, on one line, once (compaction meets
    a file at each of its steps); other warnings as Python shows them."""
    if not issubclass(category, (StoreWarning, DeprecatedName)):
        return _shown(message, category, filename, lineno, file, line)
    text = " ".join(str(message).split())
    if text not in _warned:
        _warned.add(text)
        _warn_line(text)


def _fail(message: str, code: int, detail: str | None = None, exc: DlbenchError | None = None):
    """Every error the user can act on ends here: one line (with --verbose, its detail
    after it), non-zero exit; an error of several problems (a campaign file's), one line
    each."""
    for line in getattr(exc, "lines", None) or [message]:
        err.print(f"dlbench: error: {' '.join(line.split())}", markup=False, highlight=False,
                  soft_wrap=not err.is_terminal)      # in a terminal, wrapped between words
    if detail and common._details:         # --verbose (its callback sets it)
        err.print(f"dlbench: detail: {detail}", markup=False, highlight=False, soft_wrap=not err.is_terminal)
    sys.exit(code)


__all__ = ["app", "main", "UsageError"]
