"""The project's own errors, and the one place where Docker's are translated.

The CLI prints a DlbenchError's message on one line and exits non-zero (with
``--verbose``, its ``detail`` too: the library's exception, an URL); any other
exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"     # the Docker SDK's, without DOCKER_HOST


class DlbenchError(Exception):
    """An error the user can act on; the message is shown as it is, and ``detail``
    (what a library said, in full) only when asked for."""

    exit_code = 1

    def __init__(self, message: str = "", detail: str | None = None):
        super().__init__(message)
        self.detail = detail


class UsageError(DlbenchError):
    exit_code = 2


class UsageErrors(UsageError):
    """Several usage problems found together (a campaign file's): the CLI shows one line
    for each."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


class DatasetError(DlbenchError):
    pass


class DockerUnavailable(DlbenchError):
    pass


class BuildError(DlbenchError):
    pass


class FrameworkError(DlbenchError):
    """A framework directory that is not one (a file missing, a models.json that breaks
    the contract), or two of the same name; the message names the path."""


class GpuError(DlbenchError):
    pass


class StoreError(DlbenchError):
    pass


class StoreWarning(UserWarning):
    """A result file that could not be read and was left out; the CLI shows it on one line."""


class DeprecatedName(UserWarning):
    """An option or campaign key given by a name that is going away; the CLI shows it on one
    line, and the old name still works for one more release."""


@contextlib.contextmanager
def docker_errors(action):
    """Translate the Docker SDK's exceptions raised while doing ``action``.  The SDK is not
    imported here (it takes a fifth of a second, which every command would pay): an exception
    of it can only come once something has imported it."""
    try:
        yield
    except Exception as exc:
        translated = _docker_error(exc, action)
        if translated is None:
            raise
        raise translated from None


def _docker_error(exc: Exception, action: str) -> DlbenchError | None:
    """Our error for one of the Docker SDK's (or requests', which it talks through); None
    for any other exception."""
    docker_errors_ = sys.modules.get("docker.errors")
    requests_errors = sys.modules.get("requests.exceptions")
    if docker_errors_ is not None:
        if isinstance(exc, docker_errors_.BuildError):
            return BuildError(f"{action} failed: {exc.msg}")
        if isinstance(exc, docker_errors_.ImageNotFound):
            return DlbenchError(f"{action}: image not found: {exc.explanation}")
        if isinstance(exc, docker_errors_.APIError):
            return DlbenchError(f"{action}: Docker said: {exc.explanation or exc}")
    if docker_errors_ is not None and isinstance(exc, docker_errors_.DockerException) or \
            requests_errors is not None and isinstance(exc, requests_errors.ConnectionError):
        host = os.environ.get("DOCKER_HOST")
        where = f"{host} (DOCKER_HOST)" if host else DEFAULT_DOCKER_HOST
        return DockerUnavailable(
            f"cannot reach the Docker daemon at {where}: {reason(exc)}; is it running, and may "
            "this user use it? (dlbench run --runtime native runs the jobs without Docker)",
            detail=f"{action}: {type(exc).__name__}: {exc}")
    return None


def reason(exc: BaseException) -> str:
    """Why a library's call failed, in a few words: the innermost system error's text
    ("connection refused"), else the exception's first line."""
    inner, seen, found = exc, set(), None
    while inner is not None and id(inner) not in seen:
        seen.add(id(inner))
        if isinstance(inner, OSError) and inner.strerror:
            found = inner.strerror
        inner = inner.__cause__ or inner.__context__
    if found:
        return found[:1].lower() + found[1:]
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def usage_message(text: str) -> str:
    """The command-line parser's complaint in dlbench's words: a choice refused as the
    options checked here are (``--format 'xml': choose from table, csv, json``), without
    the "Value error, " its validation library puts in front."""
    text = text.replace("Value error, ", "")
    found = re.fullmatch(r"Invalid value for '([^']+)': '(.*)' is not one of (.*)\.", text.strip(), re.S)
    if found:
        choices = ", ".join(re.findall(r"'([^']*)'", found.group(3)))
        return f"{found.group(1)} {found.group(2)!r}: choose from {choices}"
    found = re.fullmatch(r"Invalid value for '([^']+)': Input should be a valid (integer|number).*",
                         text.strip(), re.S)
    if found:
        return f"{found.group(1)} takes a {'whole ' if found.group(2) == 'integer' else ''}number"
    return text
