"""Campaign files: a benchmark matrix written down, validated, expanded into the plan.

A campaign file is TOML::

    name = "lenet-sweep"            # required; stored in every row (column `campaign`)
    frameworks = ["caffe", "torch"]
    datasets = ["mnist"]
    profiles = ["quick"]
    threads = [1, 2]                # CPU counts: each pins its jobs like --cpus
    devices = ["cpu"]               # "cpu" or "gpu:N"
    repeats = 3
    seed = 1
    settings_from = ["own", "caffe"]    # GTDLBench's cross-settings: another framework's defaults

    [hyperparameters]               # every framework: a list is an axis, one value is fixed
    batch_size = [32, 64]

    [hyperparameters.caffe]         # only caffe's jobs (caffe counts iterations)
    max_iter = 50

    [limits]                        # every job
    memory = "4g"
    timeout = 1800

    [limits.torch]                  # only torch's jobs
    memory = "3g"

Every error is one line that names the file, the line and the key.  Options
given on the command line replace the file's value of the same axis.
"""

from __future__ import annotations

import datetime as dt
import re
import sys
from pathlib import Path
from typing import Annotated, Optional

from pydantic import (BaseModel, ConfigDict, Field, PlainValidator, StrictInt, ValidationError,
                      field_validator)

from . import catalog
from .errors import UsageError
from .plan import Axes, Limits, Plan, PlanError, expand, parse_memory

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


# -- the file's schema ----------------------------------------------------------------------
def _values(value) -> list:
    """A hyper-parameter: one value, or a list of values (an axis)."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ValueError("an empty list: give at least one value")
    for item in values:
        if isinstance(item, dict):
            raise ValueError("a table here must be named after a framework "
                             f"({', '.join(catalog.FRAMEWORKS)})")
        if not isinstance(item, (bool, int, float, str)) or isinstance(item, (dt.date, dt.time)):
            raise ValueError(f"{item!r}: a hyper-parameter is a number, a string or a boolean")
    return values


Values = Annotated[list, PlainValidator(_values)]


class FileLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")
    memory: Optional[str] = None
    timeout: Optional[float] = Field(None, gt=0)

    @field_validator("memory")
    @classmethod
    def _memory(cls, value):
        if value is not None:
            try:
                parse_memory(value, "memory")
            except PlanError as exc:
                raise ValueError(str(exc)) from None
        return value


class CampaignLimits(FileLimits):
    caffe: Optional[FileLimits] = None
    tensorflow: Optional[FileLimits] = None
    torch: Optional[FileLimits] = None
    pytorch: Optional[FileLimits] = None
    mxnet: Optional[FileLimits] = None
    theano: Optional[FileLimits] = None


class Hyperparameters(BaseModel):
    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Values]
    caffe: dict[str, Values] = {}
    tensorflow: dict[str, Values] = {}
    torch: dict[str, Values] = {}
    pytorch: dict[str, Values] = {}
    mxnet: dict[str, Values] = {}
    theano: dict[str, Values] = {}


def _device(value) -> int | None:
    if value == "cpu":
        return None
    match = re.fullmatch(r"gpu:(\d+)", str(value))
    if not match:
        raise ValueError(f"{value!r}: a device is \"cpu\" or \"gpu:N\"")
    return int(match.group(1))


def _settings_source(value) -> str | None:
    """``own`` (each framework's defaults) or a framework whose defaults the others use."""
    if value == "own":
        return None
    if value not in catalog.FRAMEWORKS:
        raise ValueError(f"{value!r}: give own or one of {', '.join(catalog.FRAMEWORKS)}")
    return value


def _each(text: str, parse, prefix: str) -> list:
    """A comma-separated option, each item read as the campaign file's key reads it."""
    values = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        try:
            values.append(parse(item))
        except ValueError as exc:
            raise UsageError(f"{prefix}{exc}") from None
    return values


def parse_settings_from(text: str) -> list[str | None]:
    sources = _each(text, _settings_source, "--settings-from ")
    if not sources:
        raise UsageError("--settings-from takes own or a framework name, e.g. caffe")
    return sources


class CampaignFile(BaseModel):
    """A campaign file, as written."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    frameworks: Optional[list[str]] = Field(None, min_length=1)
    datasets: Optional[list[str]] = Field(None, min_length=1)
    profiles: list[str] = Field(["paper"], min_length=1)
    threads: Optional[list[Annotated[StrictInt, Field(ge=1)]]] = Field(None, min_length=1)
    devices: list[Annotated[Optional[int], PlainValidator(_device)]] = Field([None], min_length=1)
    repeats: StrictInt = Field(1, ge=1)
    seed: StrictInt = 1
    settings_from: list[Annotated[Optional[str], PlainValidator(_settings_source)]] = Field(
        [None], min_length=1)
    hyperparameters: Hyperparameters = Hyperparameters()
    limits: CampaignLimits = CampaignLimits()

    @field_validator("frameworks", "datasets")
    @classmethod
    def _known_names(cls, names, info):
        """The catalogue's own checks, their UsageError turned into a validation error."""
        check = catalog.check_frameworks if info.field_name == "frameworks" else catalog.check_datasets
        if names is not None:
            try:
                check(names)
            except UsageError as exc:
                raise ValueError(str(exc)) from None
        return names

    @field_validator("profiles")
    @classmethod
    def _profiles(cls, names):
        for name in names:
            if name not in catalog.PROFILES:
                raise ValueError(f"unknown profile {name!r} (choose from {', '.join(catalog.PROFILES)})")
        return names

    def axes(self) -> Axes:
        hp = self.hyperparameters
        limits = {fw: Limits(**getattr(self.limits, fw).model_dump())
                  for fw in catalog.FRAMEWORKS if getattr(self.limits, fw) is not None}
        return Axes(campaign=self.name, frameworks=self.frameworks, datasets=self.datasets,
                    profiles=self.profiles, hyperparameters=dict(hp.__pydantic_extra__ or {}),
                    framework_hyperparameters={fw: getattr(hp, fw) for fw in catalog.FRAMEWORKS
                                               if getattr(hp, fw)},
                    threads=self.threads or [None], devices=self.devices,
                    repeats=self.repeats, seed=self.seed, settings_from=self.settings_from,
                    limits=Limits(memory=self.limits.memory, timeout=self.limits.timeout),
                    framework_limits=limits)


# -- reading a file, errors pointing at its lines --------------------------------------------
class Source:
    """A campaign file's text and where each of its keys is written."""

    def __init__(self, path: Path, text: str):
        self.path, self.text = path, text
        self.lines = key_lines(text)

    def where(self, key: tuple) -> str:
        """``file:line`` of the deepest written key that ``key`` starts with."""
        names = tuple(k for k in key if isinstance(k, str))
        while names:
            if names in self.lines:
                return f"{self.path}:{self.lines[names]}"
            names = names[:-1]
        return str(self.path)

    def error(self, key: tuple, message: str) -> UsageError:
        dotted = _dotted(key)
        return UsageError(f"{self.where(key)}: {dotted + ': ' if dotted else ''}{message}")


def _dotted(key: tuple) -> str:
    text = ""
    for part in key:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _split_key(text: str) -> tuple:
    """A TOML key (dotted, possibly quoted) as its parts."""
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"|\'([^\']*)\'|([A-Za-z0-9_-]+)', text)
    return tuple(next(p for p in part if p) if any(part) else "" for part in parts)


def key_lines(text: str) -> dict[tuple, int]:
    """Each table header and key of a TOML text -> its line (1-based), first occurrence."""
    lines: dict[tuple, int] = {}
    table: tuple = ()
    depth = 0           # open brackets of a multi-line array
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if depth:
            depth += line.count("[") - line.count("]")
            continue
        if not line or line.startswith("#"):
            continue
        header = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?", line)
        if header:
            table = _split_key(header.group(1))
            lines.setdefault(table, number)
            continue
        assignment = re.match(r"""^((?:"[^"]*"|'[^']*'|[A-Za-z0-9_.\- ])+?)\s*=(.*)$""", line)
        if assignment:
            lines.setdefault(table + _split_key(assignment.group(1)), number)
            value = assignment.group(2).split("#")[0]
            depth = max(value.count("[") - value.count("]"), 0)
    return lines


def load(path: Path) -> tuple[CampaignFile, Source]:
    """Read and validate a campaign file; every problem is one UsageError line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--campaign {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--campaign {path}: cannot read it ({exc})") from None
    source = Source(path, text)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = re.search(r"\s*\(at line (\d+), column \d+\)\s*$", message)
        if found:
            raise UsageError(f"{path}:{found.group(1)}: not valid TOML: {message[:found.start()]}") from None
        raise UsageError(f"{path}: not valid TOML: {message}") from None
    try:
        return CampaignFile.model_validate(document), source
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        more = exc.error_count() - 1
        raise source.error(tuple(first["loc"]), _message(first) + (
            f" (and {more} more problem{'s' if more > 1 else ''})" if more else "")) from None


def _message(error: dict) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    message = error["msg"]
    return message[len("Value error, "):] if message.startswith("Value error, ") else message


# -- the plan ------------------------------------------------------------------------------
class Options(BaseModel):
    """The axes given on the command line; None: not given."""

    name: Optional[str] = None
    frameworks: Optional[list[str]] = None
    datasets: Optional[list[str]] = None
    profiles: Optional[list[str]] = None
    threads: Optional[list[int]] = None
    devices: Optional[list[Optional[int]]] = None
    repeats: Optional[int] = None
    seed: Optional[int] = None
    settings_from: Optional[list[Optional[str]]] = None
    hyperparameters: dict[str, list] = {}
    memory: Optional[str] = None
    timeout: Optional[float] = None


def parse_devices(text: str) -> list[int | None]:
    return _each(text, _device, "--devices: ")


def make_plan(path: Path | None, options: Options, host_cpus: int | None = None) -> Plan:
    """The plan of a campaign file (if any) with the command line's axes on top."""
    source = None
    if path is not None:
        document, source = load(Path(path))
        axes = document.axes()
    else:
        axes = Axes()
    axes = _merge(axes, options)
    try:
        return expand(axes, host_cpus)
    except PlanError as exc:
        if source is None or not _from_file(exc.key, options):
            raise
        raise source.error(exc.key, str(exc)) from None


def _merge(axes: Axes, options: Options) -> Axes:
    changes = {}
    if options.name is not None:
        if not re.fullmatch(NAME_PATTERN, options.name):
            raise UsageError(f"--name {options.name!r}: letters, digits, '.', '_' and '-' only")
        changes["campaign"] = options.name
    for field in ("frameworks", "datasets", "profiles", "devices", "repeats", "seed", "settings_from"):
        if getattr(options, field) is not None:
            changes[field] = getattr(options, field)
    if options.threads is not None:
        changes["threads"] = options.threads
    if options.hyperparameters:
        changes["hyperparameters"] = {**axes.hyperparameters, **options.hyperparameters}
        changes["framework_hyperparameters"] = {
            fw: {k: v for k, v in table.items() if k not in options.hyperparameters}
            for fw, table in axes.framework_hyperparameters.items()}
    if options.memory is not None or options.timeout is not None:
        limits = axes.limits.model_copy(update={k: v for k, v in
                                                (("memory", options.memory), ("timeout", options.timeout))
                                                if v is not None})
        changes["limits"] = limits
        changes["framework_limits"] = {
            fw: own.model_copy(update={k: None for k in ("memory", "timeout")
                                       if getattr(options, k) is not None})
            for fw, own in axes.framework_limits.items()}
    return axes.model_copy(update=changes)


def _from_file(key: tuple, options: Options) -> bool:
    """Whether the value a PlanError names came from the file (not the command line)."""
    if not key:
        return False
    if key[0] == "hyperparameters":
        return key[-1] not in options.hyperparameters
    if key[0] == "limits":
        return getattr(options, key[-1], None) is None
    return getattr(options, key[0], None) is None
