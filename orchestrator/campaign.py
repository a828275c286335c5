"""Campaign files: a benchmark matrix written down, validated, expanded into the plan.

A campaign file is TOML::

    name = "lenet-sweep"            # required; stored in every row (column `campaign`)
    frameworks = ["caffe", "torch"]
    datasets = ["mnist"]
    profiles = ["quick"]
    threads = [1, 2]                # CPU counts: each pins its jobs like --cpus
    devices = ["cpu"]               # "cpu" or "gpu:N"
    variant = "gpu"                 # the images: cpu, gpu (default: each job's device's)
    repeats = 3
    seed = 1                        # default: each model's own (1; Theano LeNet5: 23455)
    settings_from = ["own", "caffe"]    # GTDLBench's cross-settings: another framework's defaults
                                    # ("caffe/mnist": its MNIST defaults on every data set)
    blas = ["openblas", "blis"]     # the BLAS library (default: each image's own)
    onednn = ["on", "off"]          # TensorFlow's and MXNet's oneDNN kernels
                                    # (each axis is declared once: axes.AXES)

    [hyperparameters]               # every framework: a list is an axis, one value is fixed
    batch_size = [32, 64]

    [hyperparameters.caffe]         # only caffe's jobs (caffe counts iterations)
    max_iter = 50

    [limits]                        # every job
    memory = "4g"
    timeout = 1800

    [limits.torch]                  # only torch's jobs
    memory = "3g"

    [[matrix]]                      # several matrices: each the file's, its own axes on top
    label = "one thread"            # ([[variants]], the old name, is read too)
    threads = [1]

Every problem is one line that names the file, the line and the key; a file with
several problems gets them all, first to last (at most ``MAX_PROBLEMS``), in one error.
The values are checked by the same rules as the command line's (``options``), after
options given on the command line have replaced the file's value of the same axis.

A campaign file is a regular file of at most ``MAX_BYTES``, checked before it is
read (a FIFO or ``/dev/zero`` would be read for ever), with arrays and inline tables
nested at most ``MAX_NESTING`` deep and dotted keys of at most as many parts, checked
before it is parsed (the standard library's TOML reader recurses into the first and
takes quadratic time in the second).
"""

from __future__ import annotations

import bisect
import datetime as dt
import functools
import json
import re
import sys
import warnings
from pathlib import Path
from typing import Annotated, Literal, NamedTuple, Optional

from dlbench_runner import contract
from pydantic import (BaseModel, ConfigDict, Field, PlainValidator, StrictInt, ValidationError,
                      create_model, model_validator)

from . import axes as axes_, catalog, files
from .errors import DeprecatedName, UsageError, UsageErrors
from .options import Axes, Limits, PlanError, RunOptions, from_file, merge
from .plan import Job, Plan, expand

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MAX_BYTES = 1 << 20         # a campaign of thousands of jobs takes a few kB
MAX_NESTING = 32            # arrays and inline tables within each other, parts of a key; a campaign needs 3
MAX_PROBLEMS = 20           # the problems of one file shown; the rest are counted
OLD_MATRIX = "variants"     # the old name of [[matrix]], still read


# -- the file's schema ----------------------------------------------------------------------
def _values(value) -> list:
    """A hyper-parameter: one value, or a list of values (an axis)."""
    values = value if isinstance(value, list) else [value]
    for item in values:
        if isinstance(item, dict):
            raise ValueError("a table here must be named after a framework "
                             f"({', '.join(catalog.names())})")
        if not isinstance(item, (bool, int, float, str)) or isinstance(item, (dt.date, dt.time)):
            raise ValueError(f"{item!r}: a hyper-parameter is a number, a string or a boolean")
    return values


Values = Annotated[list, PlainValidator(_values)]


class FileLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")
    memory: Optional[str] = None            # checked and parsed by options.limits_for
    timeout: Optional[float] = None


class Hyperparameters(BaseModel):
    """``[hyperparameters]``: every framework's (the extra keys), and a table for each
    framework (the fields ``file_model`` adds)."""
    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Values]


class SlurmTable(BaseModel):
    """``[slurm]``: how ``scheduler = "slurm"`` submits the campaign's job array."""

    model_config = ConfigDict(extra="forbid")
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    sbatch_options: list[str] = []


def _file_type(axis: axes_.Axis):
    """An axis's values as a campaign file writes them: a list of at least one (or one
    value), each read as the command line reads it (``Axis.parse``)."""
    if axis.parse is not None or axis.setting:
        one = Annotated[Optional[axis.item], PlainValidator(axis.parse_one)]
    else:
        one = StrictInt if axis.item is int else axis.item
    if not axis.many:
        return (Optional[one], None) if axis.default is None else (one, axis.default)
    field = Field(axis.default, min_length=1)
    return (Optional[list[one]] if axis.default is None else list[one]), field


class _Matrix(BaseModel):
    """``[[matrix]]``: one of several matrices in one file, each the file's axes with its
    own on top (an axis it gives replaces the file's; its hyper-parameters join the file's,
    every framework's).  ``dlbench tune --write`` writes the best trial beside the default
    so.  The axes it may give are ``Matrix``'s fields."""

    model_config = ConfigDict(extra="forbid")
    label: str = ""                         # what it is, for the reader (not stored)
    hyperparameters: dict[str, Values] = {}


Matrix = create_model("Matrix", __base__=_Matrix, __doc__=_Matrix.__doc__,
                      **{axis.name: (Optional[_file_type(axis)[0]], Field(None, min_length=1))
                         for axis in axes_.AXES if axis.matrix})


class _CampaignFile(BaseModel):
    """A campaign file, as written: these keys, and one for each axis (``CampaignFile``)."""

    model_config = ConfigDict(extra="forbid")
    name: str                               # the values: checked with the merged axes (options)
    description: str = ""
    hyperparameters: Hyperparameters = Hyperparameters()     # their tables for each framework:
    limits: FileLimits = FileLimits()                         # the subclass ``file_model`` makes
    scheduler: Optional[Literal[catalog.SCHEDULERS]] = None     # where it runs (default: local)
    slurm: SlurmTable = SlurmTable()
    matrix: list[Matrix] = []               # several matrices, each the file's with its own on top

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data):
        """``backend``, the old name of ``scheduler``, still read for one more release."""
        if isinstance(data, dict) and "backend" in data:
            if "scheduler" in data:
                raise ValueError("give scheduler, not backend as well (its old name)")
            warnings.warn("the campaign key backend is deprecated: it is now scheduler (the old "
                          "name goes in the next release)", DeprecatedName)
            data = {("scheduler" if k == "backend" else k): v for k, v in data.items()}
        return data

    def matrices(self) -> list[Axes]:
        """The file's matrix, or one for each of its ``[[matrix]]`` tables."""
        axes = self.axes()
        if not self.matrix:
            return [axes]
        found = []
        for matrix in self.matrix:
            given = {axis.name: _unique(axis, getattr(matrix, axis.name)) for axis in axes_.AXES
                     if axis.matrix and getattr(matrix, axis.name) is not None}
            if matrix.hyperparameters:
                given["hyperparameters"] = {**axes.hyperparameters, **matrix.hyperparameters}
                given["framework_hyperparameters"] = {
                    fw: {k: v for k, v in table.items() if k not in matrix.hyperparameters}
                    for fw, table in axes.framework_hyperparameters.items()}
            found.append(axes.model_copy(update=given))
        return found

    def axes(self) -> Axes:
        hp = self.hyperparameters
        limits = {fw: Limits(**value.model_dump()) for fw, value in self.limits
                  if fw not in FileLimits.model_fields and value is not None}
        return Axes(campaign=self.name, hyperparameters=dict(hp.__pydantic_extra__ or {}),
                    framework_hyperparameters={fw: value for fw, value in hp
                                               if fw in type(hp).model_fields and value},
                    limits=Limits(memory=self.limits.memory, timeout=self.limits.timeout),
                    framework_limits=limits,
                    **{axis.name: _unique(axis, getattr(self, axis.name)) for axis in axes_.AXES})


def _unique(axis: axes_.Axis, values):
    return list(dict.fromkeys(values)) if axis.unique and values is not None else values


CampaignFile = create_model("CampaignFile", __base__=_CampaignFile, __doc__=_CampaignFile.__doc__,
                            **{axis.name: _file_type(axis) for axis in axes_.AXES})


@functools.cache
def file_model(frameworks: tuple[str, ...]) -> type[CampaignFile]:
    """The campaign file's schema where these are the frameworks: a ``[limits.FRAMEWORK]``
    and a ``[hyperparameters.FRAMEWORK]`` table for each."""
    limits = create_model("CampaignLimits", __base__=FileLimits,
                          **{fw: (Optional[FileLimits], None) for fw in frameworks})
    hyperparameters = create_model("FrameworkHyperparameters", __base__=Hyperparameters,
                                   **{fw: (dict[str, Values], {}) for fw in frameworks})
    return create_model("CampaignFile", __base__=CampaignFile,
                        hyperparameters=(hyperparameters, hyperparameters()), limits=(limits, limits()))


# -- reading a file, errors pointing at its lines --------------------------------------------
class Source:
    """A campaign file's text and where each of its keys is written."""

    def __init__(self, path: Path, text: str):
        self.path, self.text = path, text
        self.lines = key_lines(text)

    def line(self, key: tuple) -> int | None:
        """The line of the deepest written key that ``key`` starts with; None: not written."""
        names = tuple(k for k in key if isinstance(k, str))
        while names:
            if names in self.lines:
                return self.lines[names]
            names = names[:-1]
        return None

    def where(self, key: tuple) -> str:
        """``file:line`` of the deepest written key that ``key`` starts with."""
        line = self.line(key)
        return str(self.path) if line is None else f"{self.path}:{line}"

    def error(self, problems: list[tuple[tuple, str]]) -> UsageErrors | UsageError:
        """Every (key, message) problem, one line each, first line of the file first: the
        first line says how many more follow; past ``MAX_PROBLEMS``, the rest are counted."""
        at = [self.line(key) or 0 for key, _ in problems]
        problems = [problem for _, _, problem in sorted(zip(at, range(len(at)), problems))]
        lines = []
        for key, message in problems[:MAX_PROBLEMS]:
            dotted = _dotted(key)
            lines.append(f"{self.where(key)}: {dotted + ': ' if dotted else ''}{message}")
        more = len(problems) - 1
        if more:
            lines[0] += f" (and {more} more problem{'s' if more > 1 else ''})"
        if len(problems) > MAX_PROBLEMS:
            lines.append(f"{self.path}: {len(problems) - MAX_PROBLEMS} more problems not shown")
        return UsageErrors(lines) if len(lines) > 1 else UsageError(lines[0])


def _dotted(key: tuple) -> str:
    text = ""
    for part in key:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def key_lines(text: str) -> dict[tuple, int]:
    """Each table header and key of a TOML text -> its line (1-based), first occurrence.

    Read as TOML reads it, strings (multi-line ones too), comments, arrays and inline
    tables included, so that a ``[`` or ``=`` inside a value is never taken for a key.
    The standard library's reader keeps no positions; a text that is not valid TOML
    yields the keys found before the fault."""
    scan = _KeyScan(text)
    try:
        scan.document()
    except (IndexError, ValueError):
        pass
    return scan.lines


_MULTI_LINE = (r'"""(?:[^"\\]|\\.|"(?!""))*""""{0,2}',      # basic
               r"'''(?:[^']|'(?!''))*''''{0,2}")             # literal
_ONE_LINE = (r'"(?:[^"\\\n]|\\.)*"',                          # basic
             r"'[^'\n]*'")                                   # literal
_STRING = "|".join(_MULTI_LINE + _ONE_LINE)
_PART = "|".join((r"[A-Za-z0-9_-]+",) + _ONE_LINE)      # of a dotted key (or a number: 1.5)
_NESTING = re.compile("|".join(_MULTI_LINE) + rf"|((?:{_PART})(?:[ \t]*\.[ \t]*(?:{_PART}))*)"
                      r"|#[^\n]*|([\[{])|[\]}]")


def too_deep(text: str) -> tuple[int, str] | None:
    """Where a TOML text nests deeper than ``MAX_NESTING``, and how: (line, what), or None.
    Arrays and inline tables nest (table headers too), and so do the parts of a dotted key
    (the standard library's reader takes time quadratic in them: 20,000 parts, 6 s); what
    is inside a string or a comment does not count."""
    depth = 0
    for found in _NESTING.finditer(text):
        key, opening = found.group(1, 2)
        what = None
        if key is not None:
            if key.count(".") >= MAX_NESTING and len(re.findall(_PART, key)) > MAX_NESTING:
                what = f"a dotted key of more than {MAX_NESTING} parts"
        elif opening:
            depth += 1
            if depth > MAX_NESTING:
                what = f"arrays and inline tables nested more than {MAX_NESTING} deep"
        elif found.group() in ("]", "}"):
            depth = max(depth - 1, 0)
        if what:
            return text.count("\n", 0, found.start()) + 1, what
    return None


class _KeyScan:
    _BARE = re.compile(r"[A-Za-z0-9_-]+")
    _STRING = re.compile(_STRING)
    _SCALAR = re.compile(r"[^,\]}#\n]*")
    _BLANK = re.compile(r"(?:[ \t]|#[^\n]*)*")
    _BLANK_LINES = re.compile(r"(?:[ \t]|#[^\n]*|\r?\n)*")

    def __init__(self, text: str):
        self.text, self.at, self.lines = text, 0, {}
        self.line_ends = [found.start() for found in re.finditer("\n", text)]

    def document(self) -> None:
        table: tuple = ()
        while self._skip(newlines=True) is not None:
            start = self.at
            if self.text.startswith("[", self.at):
                self.at += 2 if self.text.startswith("[[", self.at) else 1
                table = self._key()
                self.lines.setdefault(table, self._line(start))
                self._expect("]")
                if self.text.startswith("]", self.at):
                    self.at += 1
            else:
                self._pair(table)

    def _pair(self, prefix: tuple | None) -> None:
        start = self.at
        key = self._key()
        if prefix is not None:
            self.lines.setdefault(prefix + key, self._line(start))
        self._expect("=")
        self._value(None if prefix is None else prefix + key)

    def _value(self, prefix: tuple | None) -> None:
        self._skip()
        char = self.text[self.at]
        if char in "\"'":
            self._string()
        elif char == "[":               # an array: its values, over any number of lines
            self.at += 1
            while self._skip(newlines=True) is not None and self.text[self.at] != "]":
                self._value(None)
                if self._skip(newlines=True) is not None and self.text[self.at] == ",":
                    self.at += 1
            self.at += 1
        elif char == "{":               # an inline table: its keys below the key it is the value of
            self.at += 1
            while self._skip(newlines=True) is not None and self.text[self.at] != "}":
                self._pair(prefix)
                if self._skip(newlines=True) is not None and self.text[self.at] == ",":
                    self.at += 1
            self.at += 1
        else:                           # a number, boolean or date: up to what ends a value
            end = self._SCALAR.match(self.text, self.at).end()
            if end == self.at:
                raise ValueError("no value")
            self.at = end

    def _key(self) -> tuple:
        parts = []
        while True:
            self._skip()
            if self.text[self.at] in "\"'":
                parts.append(self._string())
            else:
                bare = self._BARE.match(self.text, self.at)
                if not bare:
                    raise ValueError("no key")
                parts.append(bare.group())
                self.at = bare.end()
            self._skip()
            if not self.text.startswith(".", self.at):
                return tuple(parts)
            self.at += 1

    def _string(self) -> str:
        found = self._STRING.match(self.text, self.at)
        if not found:
            raise ValueError("unterminated string")
        self.at = found.end()
        quoted = found.group()
        if quoted.startswith("\"") and not quoted.startswith('"""'):    # a key's escapes, as JSON's
            try:
                return json.loads(quoted)
            except ValueError:
                pass
        return quoted[1:-1]

    def _expect(self, char: str) -> None:
        self._skip()
        if not self.text.startswith(char, self.at):
            raise ValueError(f"no {char}")
        self.at += 1

    def _skip(self, newlines: bool = False) -> int | None:
        """Past blanks and comments (and line ends); the new offset, None at the end."""
        self.at = (self._BLANK_LINES if newlines else self._BLANK).match(self.text, self.at).end()
        return self.at if self.at < len(self.text) else None

    def _line(self, offset: int) -> int:
        return bisect.bisect_left(self.line_ends, offset) + 1    # counting each time: quadratic


def load(path: Path) -> tuple[dict, Source]:
    """Read and parse a campaign file, not yet validated; a file that cannot be read or
    parsed is a one-line UsageError."""
    try:
        text = files.read_regular(path, MAX_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"--campaign {path}: no such file") from None
    except files.Refused as exc:
        raise UsageError(f"--campaign {path}: {exc}: a campaign file is a regular file of at "
                         f"most {MAX_BYTES >> 20} MiB") from None
    except OSError as exc:
        raise UsageError(f"--campaign {path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"--campaign {path}: cannot read it ({exc})") from None
    deep = too_deep(text)
    if deep is not None:
        raise UsageError(f"{path}:{deep[0]}: {deep[1]}")
    source = Source(path, text)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = re.search(r"\s*\(at line (\d+), column \d+\)\s*$", message)
        if found:
            raise UsageError(f"{path}:{found.group(1)}: not valid TOML: {message[:found.start()]}") from None
        raise UsageError(f"{path}: not valid TOML: {message}") from None
    except ValueError as exc:       # Python's own: an integer of more than 4,300 digits
        raise UsageError(f"{path}: not valid TOML: {str(exc).split(';')[0]}") from None
    return document, source


def validate(document: dict) -> tuple[CampaignFile | None, list[tuple[tuple, str]]]:
    """The file as written, and its problems of form (unknown keys, wrong types), every
    one; with problems, the file less the keys they name (None where that cannot be made),
    so that its other values can be checked too.  ``[[variants]]``, the old name of
    ``[[matrix]]``, is read as it, its problems named as the file writes them."""
    old = OLD_MATRIX in document
    if old and "matrix" in document:
        return None, [((OLD_MATRIX,), f"give matrix, not {OLD_MATRIX} as well (its old name)")]
    if old:
        document = {("matrix" if key == OLD_MATRIX else key): value for key, value in document.items()}
    try:
        return file_model(tuple(catalog.names())).model_validate(document), []
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    problems = [((OLD_MATRIX,) + tuple(error["loc"])[1:] if old and error["loc"][:1] == ("matrix",)
                 else tuple(error["loc"]), _message(error)) for error in errors]
    if len(problems) > MAX_PROBLEMS:        # enough to show: the rest is not looked at
        return None, problems
    rest = _tables(document)
    for error in errors:
        if error["type"] == "missing" and error["loc"] == ("name",):
            rest["name"] = "campaign"       # a stand-in: the other values are still checked
        elif not _drop(rest, error["loc"]):
            return None, problems
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecatedName)     # said once, the first time
            return file_model(tuple(catalog.names())).model_validate(rest), problems
    except ValidationError:
        return None, problems


def _tables(document: dict) -> dict:
    """A copy of the document's tables, down to its values (which stay shared)."""
    return {key: _tables(value) if isinstance(value, dict) else value for key, value in document.items()}


def _drop(document: dict, loc: tuple) -> bool:
    """Remove the deepest table key on ``loc`` from the document; whether there was one."""
    node, table, name = document, None, None
    for part in loc:
        if isinstance(node, dict) and part in node:
            table, name, node = node, part, node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            break
    if table is None:
        return False
    del table[name]
    return True


def _message(error: dict) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    message = error["msg"]
    return message[len("Value error, "):] if message.startswith("Value error, ") else message


# -- the plan ------------------------------------------------------------------------------
class Campaign(NamedTuple):
    """What a campaign file and the command line ask for: the plan, and where it runs."""

    plan: Plan
    scheduler: str | None = None        # the file's ``scheduler`` (None: not written)
    slurm: SlurmTable = SlurmTable()    # the file's ``[slurm]`` table


def joined(plans: list[Plan]) -> Plan:
    """The plans of a file's matrices as one: their jobs in the file's order, repeats still
    the outer loop, a job two matrices both give once."""
    if len(plans) == 1:
        return plans[0]
    first: dict[str, Job] = {}
    for job in (job for plan in plans for job in plan.jobs):
        first.setdefault(job.model_dump_json(), job)
    jobs = list(first.values())
    jobs.sort(key=lambda job: job.repeat)       # stable: each round in the matrices' order
    return Plan(jobs=jobs, skipped=list(dict.fromkeys(s for p in plans for s in p.skipped)),
                campaign=plans[0].campaign)


def read(path: Path | None, options: RunOptions, host_cpus: int | None = None) -> Campaign:
    """The campaign file (if any), read once, with the command line's axes on top, checked
    by the command line's rules; a file's problems are listed together, each with its line.
    A bad value given on the command line is one line naming its option."""
    if path is None:
        try:
            return Campaign(expand(merge(Axes(), options), host_cpus))
        except PlanError as exc:
            raise UsageError(exc.on_command_line) from None
    document, source = load(Path(path))
    written, problems = validate(document)
    if written is None:
        raise source.error(problems)
    try:
        plan = joined([expand(merge(axes, options), host_cpus) for axes in written.matrices()])
    except PlanError as exc:
        given = [p for p in exc.problems if not from_file(p.key, options)]
        if given and not problems:
            raise UsageError(given[0].on_command_line) from None
        problems += [(p.key, str(p)) for p in exc.problems if from_file(p.key, options)]
    except UsageError:
        if not problems:
            raise
    if problems:
        raise source.error(problems)
    return Campaign(plan, written.scheduler, written.slurm)
