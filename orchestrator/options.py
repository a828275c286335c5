"""A run's options: one model of its axes and limits, and every rule they obey, once.

``Axes`` is the matrix a run expands (``plan.expand``), one field for each axis that
``axes.AXES`` declares, and ``RunOptions`` the same axes as the command line gives them.
A campaign file fills one
(``campaign.CampaignFile.axes``); the command line fills a ``RunOptions``, its axes
as given, None where not given (``RunOptions.from_command_line``).  ``merge`` lays the
command line over the file: an axis given there replaces the file's value of it.

Both sources are checked here, after the merge, by the same rules: ``axis_problems``
(each value alone, and against the host) and ``limits_for`` (memory and time limits,
parsed once: memory travels on as bytes); ``plan.expand`` checks the rest against the
models.  A bad value is a ``PlanError`` naming its key, so that a campaign file can
point at its line; it carries the command line's wording where that names an option.
Every problem is found, one per key, not just the first.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from dlbench_runner import contract

from . import axes as axes_, catalog
from .axes import blas_library, device, names, onednn_switch, settings_source  # noqa: F401 (the parsers)
from .errors import UsageError

MIN_MEMORY_BYTES = 6 * 2**20        # Docker refuses smaller limits
MAX_MEMORY_BYTES = 2**50            # 1 PiB: far above any host, well within int64
MAX_TIMEOUT_S = 7 * 24 * 3600       # a week
MAX_GPU_INDEX = 1023
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$"      # "tune:<study>" for dlbench tune's trials
_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}

# Bounds written as types: a campaign file's problem is worded as pydantic words them.
CpuCount = Annotated[int, Field(ge=1)]
Timeout = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)]
_CPU_COUNT, _TIMEOUT = TypeAdapter(CpuCount), TypeAdapter(Timeout)


class PlanError(UsageError):
    """A bad axis value; ``key`` names it, e.g. ("hyperparameters", "caffe", "epochs"),
    so that a campaign file can point at its line.  ``option``: the message as the command
    line gives it, where it names the option differently (None: the same).  ``problems``:
    every problem found with this one, first to last (this one first)."""

    def __init__(self, message: str, key: tuple = (), option: str | None = None):
        super().__init__(message)
        self.key = key
        self.option = option
        self.problems = [self]

    @property
    def on_command_line(self) -> str:
        return self.option or str(self)


def raise_problems(problems: list[PlanError]) -> None:
    """Raise the first problem, carrying every problem, one per key (the first of each)."""
    if not problems:
        return
    keys, first_of_key = set(), []
    for problem in problems:
        if problem.key not in keys:
            keys.add(problem.key)
            first_of_key.append(problem)
    first_of_key[0].problems = first_of_key
    raise first_of_key[0]


# -- the model -----------------------------------------------------------------------------
class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")
    memory: str | None = None
    timeout: float | None = None


class _AxesBase(BaseModel):
    """What a matrix holds beside its axes (``axes.AXES``, the fields ``Axes`` adds)."""

    model_config = ConfigDict(extra="forbid")
    campaign: str | None = None
    hyperparameters: dict[str, list] = {}         # every framework: key -> its values
    framework_hyperparameters: dict[str, dict[str, list]] = {}   # one framework's only
    limits: Limits = Limits()
    framework_limits: dict[str, Limits] = {}


def axis_type(axis: axes_.Axis):
    """An axis's values as a matrix holds them: a list (None in it: each job's own), or one."""
    if not axis.many:
        return Optional[axis.item] if axis.default is None else axis.item
    one = Optional[axis.item] if axis.default is not None and None in axis.default else axis.item
    return Optional[list[one]] if axis.default is None else list[one]


Axes = create_model("Axes", __base__=_AxesBase,
                    __doc__="The matrix of a campaign, from a campaign file or from the command line.",
                    **{axis.name: (axis_type(axis), axis.default) for axis in axes_.AXES})


class _Given(BaseModel):
    """What the command line gives beside its axes."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    hyperparameters: dict[str, list] = {}
    memory: str | None = None
    timeout: float | None = None

    @classmethod
    def from_command_line(cls, *, name=None, frameworks=None, datasets=None, profile=None,
                          cpus=None, threads=None, gpu=None, devices=None, variant=None, set_=(),
                          sweep=(), batch_sizes=None, learning_rates=None, settings_from=None,
                          repeats=None, seed=None, memory=None, timeout=None, weights=None,
                          platforms=None, versions=(), **settings) -> "RunOptions":
        """``dlbench run``'s options as typed: comma lists and KEY=VALUE texts, read here;
        ``settings``: each compute setting's comma list (``--blas``, ``--onednn``)."""
        if cpus is not None and threads is not None:
            raise UsageError("give --cpus or --threads, not both")
        if gpu is not None and devices is not None:
            raise UsageError("give --gpu or --devices, not both")
        if unknown := sorted(set(settings) - {axis.name for axis in axes_.settings()}):
            raise TypeError(f"from_command_line() got an unexpected keyword argument {unknown[0]!r}")
        sweeps = parse_sweeps(sweep)
        sweeps.update({k: [v] for k, v in parse_overrides(set_).items()})
        for key, values in (("batch_size", numbers(batch_sizes, "--batch-sizes", int)),
                            ("learning_rate", numbers(learning_rates, "--learning-rates"))):
            if values is not None:
                sweeps[key] = values
        return cls(
            name=name, frameworks=names(frameworks), datasets=names(datasets),
            profiles=names(profile), repeats=repeats, seed=seed,
            memory=memory, timeout=timeout, variant=variant,
            threads=[cpus] if cpus is not None else numbers(threads, "--threads", int),
            devices=parse_gpus(gpu) if gpu is not None else (parse_devices(devices) if devices else None),
            settings_from=parse_settings_from(settings_from) if settings_from is not None else None,
            **{axis.name: _choices(settings.get(axis.name), axis.parse_one, axis.option, axis.what)
               for axis in axes_.settings()},
            weights=None if weights is None else str(weights), hyperparameters=sweeps,
            platforms=None if platforms is None else _platforms(platforms),
            versions=_versions(versions) if versions else None)


RunOptions = create_model("RunOptions", __base__=_Given,
                          __doc__="The axes and limits given on the command line; None: not given.",
                          **{axis.name: (Optional[axis_type(axis)], None) for axis in axes_.AXES})


# -- the merge -----------------------------------------------------------------------------
def merge(axes: Axes, options: RunOptions) -> Axes:
    """The file's axes with the command line's on top: a given axis replaces the file's."""
    changes = {}
    if options.name is not None:
        changes["campaign"] = options.name
    for axis in axes_.AXES:
        if getattr(options, axis.name) is not None:
            changes[axis.name] = getattr(options, axis.name)
    if options.hyperparameters:
        changes["hyperparameters"] = {**axes.hyperparameters, **options.hyperparameters}
        changes["framework_hyperparameters"] = {
            fw: {k: v for k, v in table.items() if k not in options.hyperparameters}
            for fw, table in axes.framework_hyperparameters.items()}
    given = {k: v for k, v in (("memory", options.memory), ("timeout", options.timeout)) if v is not None}
    if given:
        changes["limits"] = axes.limits.model_copy(update=given)
        changes["framework_limits"] = {fw: own.model_copy(update={k: None for k in given})
                                       for fw, own in axes.framework_limits.items()}
    for field, known in (("frameworks", catalog.names), ("datasets", lambda: catalog.DATASETS),
                         ("profiles", lambda: catalog.PROFILES)):
        names_ = changes.get(field, getattr(axes, field))
        if names_:          # as the catalog spells them, whatever their case (Caffe: caffe)
            changes[field] = [catalog.spelled(name, known()) for name in names_]
    return axes.model_copy(update=changes)


def from_file(key: tuple, options: RunOptions) -> bool:
    """Whether the value a PlanError names came from the file (not the command line)."""
    if not key:
        return False
    if key[0] == "hyperparameters":
        return key[-1] not in options.hyperparameters
    if key[0] == "limits":
        return getattr(options, key[-1], None) is None
    return getattr(options, key[0], None) is None


# -- the rules: the merged matrix, whichever source each value came from -------------------
def axis_problems(axes: Axes, host_cpus: int) -> list[PlanError]:
    """Every bad value of the matrix, each alone and against this host."""
    found = []

    def check(rule, *args):
        try:
            rule(*args)
        except PlanError as exc:
            found.append(exc)

    if axes.campaign is not None:
        check(check_name, axes.campaign)
    for key, names_, rule in (("frameworks", axes.frameworks, catalog.check_frameworks),
                              ("datasets", axes.datasets, catalog.check_datasets)):
        for name in names_ or ():
            try:
                rule([name])
            except UsageError as exc:
                found.append(PlanError(str(exc), (key,)))
    for profile in axes.profiles:
        check(check_profile, profile)
    for index, cpus in enumerate(axes.threads):
        if cpus is not None:
            check(check_cpus, cpus, host_cpus, index)
    for gpu in axes.devices:
        if gpu is not None:
            check(check_gpu, gpu)
    if axes.variant is not None:
        check(check_variant, axes.variant)
    if axes.variant == "cpu" and any(gpu is not None for gpu in axes.devices):
        found.append(PlanError("--variant cpu: the CPU images cannot run GPU jobs (the gpu images "
                               "run both)", ("variant",)))
    if axes.weights is not None and contract.FAIR_PROFILE not in axes.profiles:
        found.append(PlanError("weights go with the fair profile", ("weights",),
                               f"--weights goes with --profile {contract.FAIR_PROFILE}"))
    if contract.FAIR_PROFILE in axes.profiles and any(s is not None for s in axes.settings_from):
        found.append(PlanError("the fair profile fixes every framework's settings: leave out "
                               "settings_from or the fair profile", ("settings_from",),
                               "--settings-from: the fair profile fixes every framework's settings "
                               "(run it without --settings-from)"))
    if axes.versions and axes.frameworks is not None:
        for framework in axes.versions:
            if framework not in axes.frameworks:
                found.append(PlanError(f"releases of {framework} are given, but it is not one of the "
                                       f"run's frameworks ({', '.join(axes.frameworks)})", ("versions",)))
    if axes.repeats < 1:
        found.append(PlanError("--repeats must be at least 1", ("repeats",)))
    elif axes.seed is not None:
        check(check_seeds, axes.seed, axes.repeats)
    tables = [((), axes.hyperparameters)] + [((fw,), table) for fw, table in
                                             axes.framework_hyperparameters.items()]
    for where, table in tables:
        for key, values in table.items():
            if not values:
                found.append(PlanError(f"hyper-parameter {key!r} has no values",
                                       ("hyperparameters",) + where + (key,)))
    return found


def _choose(value: str, allowed, what: str, option: str) -> str:
    allowed = list(allowed)
    if value not in allowed:
        close = difflib.get_close_matches(value.lower(), allowed, n=1, cutoff=0.6)
        guess = f"did you mean {close[0]}? " if close else ""
        raise PlanError(f"unknown {what} {value!r} ({guess}choose from {', '.join(allowed)})",
                        (what + "s",), f"{option} {value!r}: {guess}choose from {', '.join(allowed)}")
    return value


def check_name(name: str) -> str:
    """A campaign's name: it names files and container labels."""
    if not re.fullmatch(NAME_PATTERN, name):
        raise PlanError(f"{name!r}: letters, digits, '.', '_', ':' and '-' only", ("name",),
                        f"--name {name!r}: letters, digits, '.', '_', ':' and '-' only")
    return name


def check_profile(name: str) -> str:
    return _choose(name, catalog.PROFILES, "profile", "--profile")


def check_variant(name: str) -> str:
    """An image variant (``dlbench run --variant``, ``dlbench build-images --variant``)."""
    if name not in catalog.VARIANTS:
        raise PlanError(f"--variant {name!r}: choose from {', '.join(catalog.VARIANTS)}", ("variant",))
    return name


def check_cpus(cpus: int, host_cpus: int, index: int = 0) -> int:
    """A CPU count: at least 1, at most the host's."""
    try:
        _CPU_COUNT.validate_python(cpus)
    except ValidationError as exc:
        raise PlanError(exc.errors()[0]["msg"], ("threads", index),
                        f"--cpus/--threads {cpus}: this host has {host_cpus} CPUs") from None
    if cpus > host_cpus:
        raise PlanError(f"--cpus/--threads {cpus}: this host has {host_cpus} CPUs", ("threads",))
    return cpus


def check_gpu(gpu: int) -> int:
    if not 0 <= gpu <= MAX_GPU_INDEX:
        raise PlanError(f"--gpu {gpu}: a GPU index is 0 or more, at most {MAX_GPU_INDEX}", ("devices",))
    return gpu


def check_seeds(first: int, repeats: int) -> None:
    """The seeds of a job's repeats, first to last, are seeds every framework takes."""
    last = first + repeats - 1
    for seed in (first, last):
        try:
            contract.check_seed(seed)
        except contract.SpecError:
            raise PlanError(f"--seed {first}" + (f" with {repeats} repeats (the last seed is {last})"
                                                if seed != first else "")
                            + f": a seed is a whole number from 0 to {contract.MAX_SEED}",
                            ("seed",)) from None


def limits_for(axes: Axes, framework: str, found: list[PlanError]) -> dict:
    """The framework's own limits where it has them, else the campaign's: memory as given
    and in bytes (parsed here, once), the time limit in seconds; a bad one joins ``found``."""
    own = axes.framework_limits.get(framework, Limits())
    limits = {"memory": None, "memory_bytes": None, "timeout": None}
    for name, check in (("memory", parse_memory), ("timeout", check_timeout)):
        value = getattr(own, name)
        where = ("limits", framework, name) if value is not None else ("limits", name)
        if value is None:
            value = getattr(axes.limits, name)
        if value is None:
            continue
        try:
            parsed = check(value)
        except PlanError as exc:
            exc.key = where
            found.append(exc)
            continue
        limits[name] = value
        if name == "memory":
            limits["memory_bytes"] = parsed
    return limits


# -- the parsers: one value, the same from the command line and from a file -------------------
def parse_memory(text: str) -> int:
    """A memory size as Docker takes it (``512m``, ``4g``, ``4GiB``, bytes) -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)(?:i?b)?\s*", str(text), re.IGNORECASE)
    why = "give a size such as 512m or 4g"
    if match:
        size = float(match.group(1)) * _UNITS[match.group(2).lower()]
        why = ("Docker needs at least 6m" if size < MIN_MEMORY_BYTES
               else None if size <= MAX_MEMORY_BYTES else "at most 1024t")
    if why:
        raise PlanError(f"memory {text!r}: {why}", ("limits", "memory"), f"--memory {text!r}: {why}")
    return int(size)


def check_timeout(timeout: float) -> float:
    """A time limit in seconds: finite, more than 0, at most a week."""
    try:
        return _TIMEOUT.validate_python(timeout)
    except ValidationError as exc:
        raise PlanError(exc.errors()[0]["msg"], ("limits", "timeout"),
                        f"--timeout {timeout:g}: a time limit is more than 0 and at most "
                        f"{MAX_TIMEOUT_S} seconds (7 days)") from None


def numbers(text: str | None, option: str, kind=float) -> list | None:
    """A comma list of numbers; None where not given."""
    if text is None:
        return None
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{option} takes comma-separated numbers, not {text!r}") from None


def _each(text: str, parse, prefix: str) -> list:
    """A comma-separated option, each item read as the campaign file's key reads it."""
    values = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        try:
            values.append(parse(item))
        except ValueError as exc:
            raise UsageError(f"{prefix}{exc}") from None
    return values


def _platforms(text: str) -> tuple[str, ...]:
    try:
        return axes_.platform_list(text)
    except ValueError as exc:
        raise UsageError(f"--platforms: {exc}") from None


def _versions(texts) -> dict:
    try:
        return axes_.version_table(list(texts))
    except ValueError as exc:
        raise UsageError(f"--versions: {exc}") from None


def _choices(text: str | None, parse, option: str, what: str) -> list | None:
    """A comma list of named choices, each once; None where not given."""
    if text is None:
        return None
    values = list(dict.fromkeys(_each(text, parse, option + " ")))
    if not values:
        raise UsageError(f"{option} takes {what}")
    return values


def parse_devices(text: str) -> list[int | None]:
    return _each(text, device, "--devices: ")


def parse_gpus(text: str) -> list[int]:
    """``--gpu 0`` or ``--gpu 0,1,2,3``: the GPUs, as the devices gpu:0, gpu:1, ..."""
    gpus = numbers(str(text), "--gpu", int)
    if not gpus:
        raise UsageError("--gpu takes GPU indices, e.g. 0 or 0,1")
    return list(dict.fromkeys(gpus))


def parse_settings_from(text: str) -> list[str | None]:
    sources = _each(text, settings_source, "--settings-from ")
    if not sources:
        raise UsageError("--settings-from takes own or a framework name, e.g. caffe")
    return sources


def parse_overrides(items) -> dict:
    """KEY=VALUE pairs; values are read as JSON where they parse (numbers, booleans)."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--set takes KEY=VALUE, not {item!r}")
        overrides[key.strip()] = _value(value)
    return overrides


def parse_sweeps(items) -> dict[str, list]:
    """KEY=V1,V2,... pairs (--sweep): each key becomes an axis of those values."""
    sweeps = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise UsageError(f"--sweep takes KEY=VALUE,VALUE,..., not {item!r}")
        sweeps[key.strip()] = [_value(v) for v in values.split(",") if v.strip()]
    return sweeps


def _value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        pass
    if text.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
        return float(text)          # refused as not finite, by name, when it is resolved
    return text.strip()
