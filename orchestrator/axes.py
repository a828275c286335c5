"""The axes a run sweeps, each declared once.

An ``Axis`` is a key of a campaign file and a field of the matrix (``options.Axes``),
of the command line's ``RunOptions`` and of the campaign file's models
(``campaign.CampaignFile``, ``campaign.Matrix``): each is made from ``AXES`` here, so
an axis added is an ``Axis`` added.  A compute setting (``setting``: the BLAS library,
oneDNN) is more: every planned ``Job`` carries it (in its identity where given), the
spec hands it to the runner, ``dlbench run`` takes it as an option of its own
(``--NAME V1,V2``), ``catalog.check_setting`` checks it against each framework, and
``dlbench tune`` may search it (``search``).

This module imports no pydantic: the command line reads the settings' options from it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

from dlbench_runner import contract

from . import catalog


@dataclasses.dataclass(frozen=True)
class Axis:
    """One axis: ``item`` the type of one value, ``many`` whether it is a list (an axis
    proper) or one value, ``default`` where not given (None in a list: each job's own,
    e.g. the image's BLAS library), ``parse`` how one value reads from a comma list or a
    campaign file (a ValueError says why not; None: as ``item``), ``help`` and ``what``
    the command line's words for it."""

    name: str
    item: type = str
    many: bool = True
    default: Any = None
    parse: Callable[[Any], Any] | None = None
    help: str = ""
    what: str = ""                  # what --NAME takes, for its error: "on, off or both: on,off"
    outer: bool = False             # the plan's outer loops (frameworks, data sets): not a cell's
    matrix: bool = False            # a campaign file's [[matrix]] may give it
    unique: bool = False            # a value given twice is one
    setting: bool = False           # a compute setting: a job's field, checked against the framework
    search: str | None = None       # dlbench tune: "default" (searched unless --space says
                                    # otherwise), "asked" (only when --space names it), None

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse_one(self, value):
        """One value, as the command line and a campaign file read it; a setting's
        ``default`` is None (each image's or framework's own)."""
        if self.setting and value == "default":
            return None
        return self.parse(value) if self.parse is not None else self.item(value)


# -- how one value reads: the same from the command line and from a file ---------------------
def names(text: str | None) -> list[str] | None:
    """A comma list of names, as the command line gives them; None where not given."""
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


def device(value) -> int | None:
    """``cpu`` (None) or ``gpu:N`` (N): the command line's spelling (contract.py's
    ``DEVICES`` says where the others are read)."""
    if value == "cpu":
        return None
    match = re.fullmatch(r"gpu:(\d+)", str(value))
    if not match:
        raise ValueError(f"{value!r}: a device is \"cpu\" or \"gpu:N\"")
    return int(match.group(1))


def settings_source(value) -> str | None:
    """``own`` (each framework's defaults), a framework whose defaults the others use
    (``caffe``), or a framework's defaults for one data set, used on the other data sets
    too (``caffe/mnist``: GTDLBench's finding that defaults tuned on one data set may fail
    on another)."""
    if value == "own":
        return None
    framework, slash, dataset = str(value).partition("/")
    if framework not in catalog.names() or (slash and dataset not in catalog.DATASETS):
        raise ValueError(f"{value!r}: give own, a framework ({', '.join(catalog.names())}) or "
                         f"FRAMEWORK/DATASET ({', '.join(catalog.DATASETS)})")
    return value


def blas_library(value) -> str | None:
    """A BLAS library's name (``openblas``, ``blis-openmp``, ...) in full; ``default``
    (None): each image's own."""
    if value == "default":
        return None
    try:
        return contract.blas.canonical(value)
    except contract.blas.BlasError as exc:
        raise ValueError(f"{exc}, or default") from None


def onednn_switch(value) -> str | None:
    """``on`` or ``off``; ``default`` (None): as the framework has it."""
    if value == "default":
        return None
    if value not in ("on", "off"):
        raise ValueError(f"{value!r}: give on, off or default")
    return value


def worker_count(value) -> int | None:
    """How many workers train one model data-parallel (``docs: Distributed``): a whole
    number, 1 or more; 1 (None) is the plain job, one process without an engine."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r}: give a number of workers, 1 or more")
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r}: give a number of workers, 1 or more") from None
    if count < 1 or str(count) != str(value).strip():
        raise ValueError(f"{value!r}: give a number of workers, 1 or more")
    return None if count == 1 else count


def platform_list(value) -> tuple[str, ...]:
    """The platforms a trained model is deployed on after training: names of
    ``catalog.PLATFORMS`` as a comma list or a list, ``all`` or ``none``; in the catalog's
    order, each once."""
    given = [n.strip() for n in value.split(",")] if isinstance(value, str) else value
    if not isinstance(given, (list, tuple)) or not all(isinstance(n, str) for n in given):
        raise ValueError(f"{value!r}: give platforms as a comma list or a list of names")
    given = [n for n in given if n]
    if given in (["all"], ["none"]):
        return catalog.PLATFORMS if given == ["all"] else ()
    if unknown := [n for n in given if n not in catalog.PLATFORMS]:
        raise ValueError(f"unknown platform {unknown[0]!r} (choose from {', '.join(catalog.PLATFORMS)}, "
                         "all or none)")
    if not given:
        raise ValueError("give platforms, all or none")
    return tuple(n for n in catalog.PLATFORMS if n in given)


def version_table(value) -> dict[str, tuple[str | None, ...]]:
    """The releases to train each framework in (``docs: Releases``): ``FRAMEWORK=V1,V2``
    texts (the command line's, one a framework) or a table of lists (a campaign file's);
    each release as ``catalog.resolve_version`` reads it (None: the framework's default),
    each once, in the order given."""
    if isinstance(value, dict):
        given = [(fw, [v] if isinstance(v, str) else v) for fw, v in value.items()]
    elif isinstance(value, (list, tuple)) and all(isinstance(t, str) for t in value):
        given = []
        for text in value:
            framework, equals, releases = text.partition("=")
            if not equals or not framework.strip():
                raise ValueError(f"{text!r}: give FRAMEWORK=RELEASE,RELEASE, e.g. tensorflow=2.15,2.20")
            given.append((framework.strip(), releases.split(",")))
    else:
        raise ValueError(f"{value!r}: give a table of each framework's releases")
    table = {}
    for framework, releases in given:
        if framework not in catalog.names():
            raise ValueError(str(catalog.unknown("framework", framework, catalog.names())))
        if framework in table:
            raise ValueError(f"{framework}'s releases are given twice")
        if not isinstance(releases, list) or not all(isinstance(r, str) for r in releases) \
                or not [r for r in releases if r.strip()]:
            raise ValueError(f"{framework}: give its releases, e.g. {framework}={catalog.versions(framework)[0]}")
        table[framework] = tuple(dict.fromkeys(
            catalog.resolve_version(framework, r.strip()) for r in releases if r.strip()))
    return table


# -- the axes --------------------------------------------------------------------------------
AXES: list[Axis] = [
    Axis("frameworks", outer=True),                     # None: every framework that has an image
    Axis("datasets", outer=True),                       # None: both, where the framework has a model
    Axis("profiles", default=[contract.PAPER_PROFILE]),
    Axis("threads", int, default=[None], matrix=True),  # CPU counts; None: all, no limit
    Axis("devices", int, default=[None], parse=device),     # None: CPU; N: GPU N
    Axis("variant", many=False),                        # the image variant; None: each job's device's
    Axis("settings_from", default=[None], parse=settings_source),  # None: each framework's own
    Axis("blas", default=[None], parse=blas_library, matrix=True, unique=True, setting=True,
         search="default", what="BLAS libraries, e.g. openblas,blis",
         help="BLAS libraries to sweep, e.g. openblas,blis,atlas (Caffe, Theano, Torch7, "
              "PyTorch; default: each image's OpenBLAS)."),
    Axis("onednn", default=[None], parse=onednn_switch, matrix=True, unique=True, setting=True,
         what="on, off or both: on,off",
         help="TensorFlow's and MXNet's oneDNN kernels: on, off or on,off (default: as each "
              "framework has them)."),
    Axis("workers", int, default=[None], parse=worker_count, matrix=True, unique=True, setting=True,
         what="worker counts, e.g. 1,2",
         help="Train each model data-parallel over N workers with the framework's own engine, "
              "e.g. 1,2 (1: one process, the default; PyTorch; docs: Distributed)."),
    Axis("platforms", tuple, many=False, parse=platform_list,   # None: each profile's own
         help="Where each trained model is deployed after training: mobile, mobile-int8, "
              "onnx-int8, web, all or none (default: all for the paper profile, none for "
              "quick and fair: docs: Platforms)."),
    Axis("versions", dict, many=False, parse=version_table,    # None: each framework's default
         help="Train a framework in several of its releases, each in an image of its own: "
              "FRAMEWORK=RELEASE,... e.g. tensorflow=2.15,2.20 (repeatable; docs: Releases)."),
    Axis("weights", many=False),                        # the fair profile's initial weights file
    Axis("repeats", int, many=False, default=1),
    Axis("seed", int, many=False),                      # None: each model's own (contract.default_seed)
]


def named(name: str) -> Axis:
    return next(axis for axis in AXES if axis.name == name)


def settings() -> list[Axis]:
    """The compute settings, in their order (a job's fields, the spec's keys)."""
    return [axis for axis in AXES if axis.setting]
