"""Where frameworks come from, and what each offers.

A framework is a directory: its ``Dockerfile`` (and ``Dockerfile.gpu`` where it has a GPU
image), its ``adapter.py`` (the runner's adapter contract) and its ``models.json`` (its
models and their default hyper-parameters); any other file beside them goes into its
image's build context too.  ``frameworks()`` finds them, the only place that does, in two
ways:

1. Entry points of the group ``dlbench.frameworks``: the entry point's name is the
   framework's, its value ``package`` (the package's own folder is the framework's
   directory) or ``package:folder`` (a folder inside it).  dlbench's own six are
   registered so in its pyproject.toml, from the package ``dlbench_images``.
2. ``DLBENCH_FRAMEWORKS_PATH``, directories separated by ``os.pathsep``: an entry that
   holds a ``models.json`` is one framework's directory; any other is a folder of
   them, each of its sub-folders (but those whose names begin with ``.`` or ``_``) one.

A framework's name is its models.json's ``framework``.  Every directory found is checked
before anything uses it: a name given twice (by two directories), a missing file or a
models.json that breaks the contract is one ``FrameworkError`` line naming the path.
The study's frameworks come in the study's order (``STUDY_ORDER``), then dlbench's own
others (``TODAY_ORDER``), any others after them, sorted by name.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.resources
import json
import os
import re
import sys
from pathlib import Path
from typing import Callable, NamedTuple

from dlbench_runner import contract

from . import files
from .errors import FrameworkError, UsageError

ENTRY_POINTS = "dlbench.frameworks"
PATH_VARIABLE = "DLBENCH_FRAMEWORKS_PATH"
STUDY_ORDER = ("caffe", "tensorflow", "torch", "pytorch", "mxnet", "theano")
# dlbench's own frameworks beside the study's: the ones people choose today
TODAY_ORDER = ("pytorch2", "jax")
BUILT_IN = STUDY_ORDER + TODAY_ORDER
DATASETS = ("mnist", "cifar10")
PROFILES = contract.PROFILES
VARIANTS = ("cpu", "gpu")           # the images of a framework: build.image_tag(framework, variant)
# Where a run's jobs run, named here for the options (which come before the schedulers):
# ``schedulers.SCHEDULERS`` makes each
SCHEDULERS = ("local", "slurm")
REQUIRED_FILES = ("Dockerfile", "adapter.py", "models.json")
# A name is an image's name (dlbench/NAME:cpu), a folder of its build context and a key of
# a campaign file's tables; the base images' names and the runner's folder are taken.
NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
# The images the after-training stage runs a trained model in, not frameworks: each a folder
# of dlbench's image folder with its Dockerfile and image.json (its Debian suite, its version,
# its expected build time), built like a framework's CPU image (``build.Builder.tool``)
TOOLS = ("deploy", "web")
RESERVED = ("base", "root", "runner", *TOOLS)
# Where a trained model is deployed after training (``checks/platforms.py``), each run in
# the tool image that serves it, in the order their rows are stored.
PLATFORM_TOOLS = {"mobile": "deploy", "mobile-int8": "deploy", "onnx-int8": "deploy", "web": "web"}
PLATFORMS = tuple(PLATFORM_TOOLS)
MAX_MODELS_JSON = 1 << 20
# The Debian suite the study's frameworks' images are built on; a framework's models.json
# (``suite``) or a tool's image.json names another where its packages need one
SUITE = "bullseye"
DEBIAN_SUITE = re.compile(r"[a-z]{2,20}")


@dataclasses.dataclass(frozen=True)
class Framework:
    name: str
    directory: Path         # absolute
    origin: str             # where it was found, in words: an entry point or the path variable
    models: dict            # its models.json, checked


def frameworks() -> dict[str, Framework]:
    """Every framework found, by name: the study's in its order, then the others sorted;
    raises FrameworkError for the first directory that is not a complete framework."""
    found = _discover(os.environ.get(PATH_VARIABLE, ""), tuple(sys.path))
    if not any(name in found for name in STUDY_ORDER):
        # the entry points are written at install time: an install older than them has none
        raise FrameworkError("dlbench's own frameworks are not registered in this Python "
                             "(an install from before they were entry points?); reinstall "
                             "dlbench: scripts/setup, or pip install -e .")
    return found


def names() -> list[str]:
    return list(frameworks())


def default_names() -> list[str]:
    """The frameworks a run trains when it names none: every one found but those whose
    models.json says ``"run_by_default": false`` (trained when named: today's frameworks,
    whose images a first run of the study need not build)."""
    return [name for name in names() if models(name).get("run_by_default", True)]


def framework_dir(framework: str) -> Path:
    return _get(framework).directory


def models(framework: str) -> dict:
    """The framework's models.json (one dict for as long as the frameworks found stay the same)."""
    return _get(framework).models


def _get(framework: str) -> Framework:
    found = frameworks()
    name = spelled(framework, found)
    if name not in found:
        raise unknown("framework", framework, found)
    return found[name]


def spelled(name: str, known) -> str:
    """A name as the catalog spells it, whatever its case (``Caffe``: ``caffe``); an
    unknown name as it is."""
    return next((k for k in known if k.lower() == name.lower()), name)


def unknown(what: str, name: str, known) -> UsageError:
    """An unknown name's one line: the nearest known name as a guess, then the choices."""
    close = difflib.get_close_matches(name.lower(), list(known), n=1, cutoff=0.6)
    guess = f"did you mean {close[0]}? " if close else ""
    return UsageError(f"unknown {what} {name!r} ({guess}choose from {', '.join(known)})")


def tool_info(tool: str) -> dict:
    """A tool image's image.json: ``suite`` (Debian's), ``version`` and ``build_s``."""
    if tool not in TOOLS:
        raise unknown("tool image", tool, TOOLS)
    return _tool_info(str(images_dir() / tool / "image.json"))


@functools.lru_cache(maxsize=8)
def _tool_info(path: str) -> dict:
    return json.loads(Path(path).read_text())


def images_dir() -> Path:
    """dlbench's own image folder: the base image's Dockerfile, the runner, the built-in frameworks."""
    return Path(str(importlib.resources.files("dlbench_images")))


@functools.lru_cache(maxsize=8)
def _discover(path_variable: str, sys_path: tuple) -> dict[str, Framework]:
    found: dict[str, Framework] = {}
    for directory, origin, name in _entry_point_dirs() + _path_dirs(path_variable):
        framework = _load(directory, origin)
        if name is not None and name != framework.name:
            raise FrameworkError(f"{directory / 'models.json'}: framework is {framework.name!r}, "
                                 f"but {origin} names it {name!r}")
        other = found.get(framework.name)
        if other is not None and other.directory != framework.directory:
            raise FrameworkError(f"framework {framework.name!r} is found twice: {other.directory} "
                                 f"({other.origin}) and {framework.directory} ({origin})")
        found.setdefault(framework.name, framework)
    order = {name: i for i, name in enumerate(BUILT_IN)}
    return {name: found[name] for name in sorted(found, key=lambda n: (order.get(n, len(order)), n))}


def _entry_point_dirs() -> list[tuple[Path, str, str]]:
    """(directory, origin, the entry point's name) of every entry point of the group."""
    import importlib.metadata       # here: dlbench --help, which needs no framework, starts without it

    dirs = []
    for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        origin = f"entry point {entry.name} = {entry.value}"
        package, _, folder = entry.value.partition(":")
        try:
            root = Path(str(importlib.resources.files(package.strip())))
        except (ImportError, TypeError, ValueError) as exc:
            raise FrameworkError(f"{origin} (group {ENTRY_POINTS}): cannot import "
                                 f"{package.strip()!r}: {exc}") from None
        directory = root.joinpath(*folder.strip().split(".")) if folder.strip() else root
        if not directory.is_dir():
            raise FrameworkError(f"{directory}: no such directory ({origin}, group {ENTRY_POINTS})")
        dirs.append((directory.absolute(), origin, entry.name))
    return dirs


def _path_dirs(variable: str) -> list[tuple[Path, str, None]]:
    """(directory, origin, None) of every framework directory the path variable names."""
    dirs = []
    for entry in (e for e in variable.split(os.pathsep) if e):
        path = Path(entry).expanduser().absolute()
        origin = f"{PATH_VARIABLE} entry {entry}"
        if not path.is_dir():
            raise FrameworkError(f"{path}: no such directory ({PATH_VARIABLE})")
        if (path / "models.json").exists():
            dirs.append((path, origin, None))
            continue
        dirs += [(sub, origin, None) for sub in sorted(path.iterdir())
                 if sub.is_dir() and not sub.name.startswith((".", "_"))]
    return dirs


def _load(directory: Path, origin: str) -> Framework:
    """The framework in ``directory``, its files and its models.json checked."""
    for name in REQUIRED_FILES:
        if not (directory / name).is_file():
            raise FrameworkError(f"{directory}: not a framework directory, {name} is missing ({origin})")
    path = directory / "models.json"
    try:
        info = json.loads(files.read_regular(path, MAX_MODELS_JSON))
    except (OSError, files.Refused) as exc:
        raise FrameworkError(f"{path}: cannot read it: {exc}") from None
    except ValueError as exc:       # JSONDecodeError, UnicodeDecodeError
        raise FrameworkError(f"{path}: not valid JSON: {exc}") from None
    problem = _models_problem(info)
    if problem:
        raise FrameworkError(f"{path}: {problem}")
    if info.get("fair") and not (directory / "fair.py").is_file():
        raise FrameworkError(f"{path}: fair lists fair networks, but fair.py is missing ({origin})")
    return Framework(info["framework"], directory, origin, info)


def _models_problem(info) -> str | None:
    """What breaks the models.json contract (see docs/frameworks/adding.md), or None."""
    if not isinstance(info, dict):
        return "not a JSON object"
    name = info.get("framework")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return (f"framework {name!r}: a name is a lower-case letter, then up to 39 lower-case "
                "letters, digits or underscores")
    if name in RESERVED:
        return f"framework {name!r}: the name is taken ({', '.join(RESERVED)} are dlbench's own)"
    if not isinstance(info.get("version"), str) or not info["version"]:
        return "version: give the framework's version as a string"
    for key, kind in (("variants", dict), ("sources", list), ("native", dict)):
        if not isinstance(info.get(key, kind()), kind):
            return f"{key}: must be a JSON {'object' if kind is dict else 'array'}"
    if not isinstance(info.get("run_by_default", True), bool):
        return "run_by_default: true or false (false: its jobs run only when it is named)"
    if not DEBIAN_SUITE.fullmatch(str(info.get("suite", SUITE))):
        return "suite: the Debian suite its images are built on, e.g. trixie (default: bullseye)"
    native = info.get("native", {})
    if not all(isinstance(native.get(key, ""), str) for key in ("module", "unsupported")):
        return "native: module and unsupported are strings"
    offered = info.get("blas", [])
    if not isinstance(offered, list) or any(b not in contract.blas.LIBRARIES for b in offered):
        return (f"blas: a list of the BLAS libraries its image holds, the default first "
                f"(from {', '.join(contract.blas.LIBRARIES)})")
    onednn = info.get("onednn", {})
    if not isinstance(onednn, dict) or not isinstance(onednn.get("variable", ""), str):
        return "onednn: {\"variable\": the environment variable that turns oneDNN on (1) or off (0)}"
    engine = info.get("distributed", {})
    if not isinstance(engine, dict) or (engine and not all(
            isinstance(engine.get(key), str) and engine[key] for key in ("engine", "backend"))):
        return "distributed: {\"engine\": its data-parallel engine, \"backend\": what carries its messages}"
    fair = info.get("fair", [])
    if not isinstance(fair, list) or any(d not in DATASETS for d in fair):
        return f"fair: a list of the data sets whose fair network fair.py builds (from {', '.join(DATASETS)})"
    model_set = info.get("models")
    if not isinstance(model_set, dict) or not model_set:
        return "models: give at least one data set's model"
    for dataset, entry in model_set.items():
        problem = _model_problem(info, dataset, entry)
        if problem:
            return f"models.{dataset}: {problem}"
    return None


def _model_problem(info: dict, dataset: str, entry) -> str | None:
    if dataset not in DATASETS:
        return f"unknown data set (choose from {', '.join(DATASETS)})"
    if not isinstance(entry, dict):
        return "not a JSON object"
    if not isinstance(entry.get("model"), str) or not entry["model"]:
        return "model: give the model's name as a string"
    params = entry.get("hyperparameters")
    if not isinstance(params, dict) or "batch_size" not in params:
        return "hyperparameters: a JSON object with batch_size at least"
    for key in ("profiles", "gpu_hyperparameters"):
        if not isinstance(entry.get(key, {}), dict):
            return f"{key}: must be a JSON object"
    own = [p for p in PROFILES if p != contract.FAIR_PROFILE]     # the fair one is fair.py's
    if unknown := sorted(set(entry.get("profiles", {})) - set(own)):
        return f"profiles: unknown profile {unknown[0]!r} (choose from {', '.join(own)})"
    settings = entry.get("settings")
    if not isinstance(settings, dict):
        return "settings: a JSON object of length, learning_rate and train_images"
    for key in ("length", "learning_rate"):
        keys = settings.get(key)
        if not isinstance(keys, list) or not keys or not all(k in params for k in keys):
            return f"settings.{key}: a list of the hyper-parameters that hold it"
    images = settings.get("train_images")
    if isinstance(images, bool) or not isinstance(images, int) or images < 1:
        return "settings.train_images: the number of images a pass over the training set takes"
    for profile in own:
        for device in contract.DEVICES:
            try:
                contract.resolve_hyperparameters(info, dataset, profile, device=device)
            except (contract.SpecError, TypeError, ValueError) as exc:
                return f"the {profile} profile ({device}): {exc}"
    return None


def sources(framework: str, variant: str = "cpu") -> list[str]:
    """The pinned source repositories (``sources.py``'s registry) an image of the framework
    is built from: the framework's, then its variant's own (e.g. cutorch for Torch7's GPU);
    none for a tool image."""
    if framework in TOOLS:
        return []
    info = models(framework)
    return info.get("sources", []) + info.get("variants", {}).get(unversioned(variant)[0], {}).get("sources", [])


def compiles(framework: str, variant: str = "cpu") -> bool:
    """Whether building the image compiles code (a framework's pinned source archives, a
    tool image's crates: its image.json's ``compiles`` says what), not only installs it."""
    if framework in TOOLS:
        return bool(tool_info(framework).get("compiles"))
    return bool(sources(framework, variant))


def suite(name: str, variant: str = "cpu", default: str | None = SUITE) -> str | None:
    """The Debian suite an image is built on: a tool's image.json's; a framework's
    release's ``suite`` under ``versions``, else its models.json's; else ``default``."""
    if name in TOOLS:
        return tool_info(name)["suite"]
    info = models(name)
    version = unversioned(variant)[1]
    return info.get("versions", {}).get(version, {}).get("suite") or info.get("suite", default)


# -- releases: a framework's other versions, each an image of its own ----------------------
def versions(framework: str) -> list[str]:
    """The releases the framework has images of: its models.json's ``version`` (the
    default) first, then those it names under ``versions``, in their order."""
    info = models(framework)
    return [info["version"], *(v for v in info.get("versions", {}) if v != info["version"])]


def resolve_version(framework: str, text: str) -> str | None:
    """A release of the framework as given (``2.15.1``, or ``2.15`` where one release
    starts so): the release, None for its default one; a ValueError names the releases
    there are."""
    known = versions(framework)
    found = [v for v in known if v == text] or [v for v in known if v.startswith(f"{text}.")]
    if len(found) != 1:
        what = "more than one release" if found else "no image of release"
        raise ValueError(f"{framework} has {what} {text!r} (releases: {', '.join(known)}; another "
                         f"is added under \"versions\" in its models.json)")
    return None if found[0] == known[0] else found[0]


def versioned(variant: str, version: str | None) -> str:
    """The variant of a release's image: ``cpu-2.15.1`` (the default release: ``cpu``)."""
    return variant if version is None else f"{variant}-{version}"


def unversioned(variant: str) -> tuple[str, str | None]:
    """A variant's device variant and release: ``cpu-2.15.1`` is ("cpu", "2.15.1")."""
    base, _, version = variant.partition("-")
    return base, version or None


def dockerfile(framework: str, variant: str) -> Path:
    variant, _ = unversioned(variant)       # a release: the same Dockerfile, its own build arguments
    name = "Dockerfile" if variant == "cpu" else f"Dockerfile.{variant}"
    return framework_dir(framework) / name


def variant_info(framework: str, variant: str) -> dict:
    """The variant's facts from models.json: version, source, cuda, cudnn and the image's
    build arguments (``build_args``); or ``unsupported``.  A release's (``cpu-2.15.1``): its
    entry under ``versions``, over the CPU image's."""
    info = models(framework)
    variant, version = unversioned(variant)
    if version is not None:
        entry = info.get("versions", {}).get(version)
        if entry is None:
            return {"unsupported": f"{framework} has no image of release {version}"}
        if variant != "cpu":
            return {"unsupported": f"{framework} {version} has a CPU image only"}
        return {**variant_info(framework, "cpu"), "version": version, **entry}
    if variant == "cpu":
        return {"version": info["version"], "source": info.get("source"), "cuda": "none"}
    return info.get("variants", {}).get(variant) or {"unsupported": f"{framework} has no {variant} image"}


def variant_unsupported(framework: str, variant: str) -> str | None:
    """Why the framework (or tool) has no image of this variant, or None."""
    if framework in TOOLS:
        return None if variant == "cpu" else f"{framework} has no {variant.upper()} image: it runs on the CPU"
    info = variant_info(framework, variant)
    if "unsupported" in info and unversioned(variant)[1] is not None:
        return info["unsupported"]
    if "unsupported" in info:
        return f"{framework} has no {variant.upper()} image: {info['unsupported']}"
    if not dockerfile(framework, variant).is_file():
        return f"{framework} has no {variant.upper()} image ({dockerfile(framework, variant).name} is missing)"
    return None


def gpu_unsupported(framework: str, dataset: str) -> str | None:
    """Why the framework's model of the data set cannot train on a GPU, or None."""
    reason = models(framework)["models"].get(dataset, {}).get("gpu_unsupported")
    return f"{framework}'s {dataset} model has no GPU version: {reason}" if reason else None


def job_unsupported(framework: str, dataset: str, variant: str, gpu: int | None,
                    settings: tuple[tuple[str, str | None], ...] = (),
                    profile: str | None = None) -> str | None:
    """Why a job cannot run whatever the runtime, decided while planning: its framework
    has no image of that variant, no fair network for the data set, its model no GPU
    version, or the framework no such compute setting (``settings``: (axis, value) pairs,
    ``check_setting``); None where it can."""
    if profile == contract.FAIR_PROFILE and dataset not in fair_offered(framework):
        return f"{framework} has no fair network for {dataset} (its fair.py builds none)"
    found = variant_unsupported(framework, variant) or (
        gpu_unsupported(framework, dataset) if gpu is not None else None)
    for axis, value in settings if found is None else ():
        refused = check_setting(framework, axis, value, variant)
        if refused is not None:
            return refused.why
    return found


# -- the compute settings: what each framework offers, read from its models.json -------------
class Refusal(NamedTuple):
    """Why a framework does not run a setting's value: ``usage`` where it has the setting
    but not that value (a usage error, before any job: ``plan.compute_problems``); else it
    has no such setting at all, and its jobs are stored as ``unsupported``."""

    why: str
    usage: bool


@dataclasses.dataclass(frozen=True)
class _Setting:
    """How models.json declares what a framework offers on a setting, and the words for it."""

    offered: Callable[[dict], list]
    cannot: str                     # the framework has no such setting: {framework}, {why}
    why: str                        # ... where its models.json's NAME_unsupported says nothing
    refused: str                    # the framework has it, not this value: {framework}, {value}, {offered}
    nowhere: str                    # no framework of the run has it: {value}, {frameworks}, {able}
    cpu_only: str | None = None     # only its CPU image switches: {framework}, {variant}
    accepts: Callable[[list, object], bool] = lambda values, value: value in values


_SETTINGS = {
    "blas": _Setting(
        offered=lambda info: list(info.get("blas", [])),
        cannot="{framework} cannot switch its BLAS library: {why}", why="its image offers none",
        refused="--blas {value}: {framework}'s image does not hold it (it holds {offered})",
        nowhere="--blas {value}: {frameworks} cannot switch BLAS libraries ({able} can)",
        cpu_only="{framework}'s {variant} image holds one BLAS library (its CPU image holds several)"),
    "onednn": _Setting(
        offered=lambda info: ["on", "off"] if info.get("onednn", {}).get("variable") else [],
        cannot="{framework} has no oneDNN switch: {why}", why="it runs no oneDNN kernels",
        refused="--onednn {value}: {framework} takes on or off",
        nowhere="--onednn: no oneDNN switch in {frameworks} (only in {able})"),
    "workers": _Setting(
        offered=lambda info: [info["distributed"]["engine"]] if info.get("distributed") else [],
        accepts=lambda engines, count: isinstance(count, int) and count >= 2,
        cannot="{framework} trains on one worker only: {why}",
        why="dlbench runs no data-parallel engine of it",
        refused="--workers {value}: give 2 or more",
        nowhere="--workers {value}: {frameworks} train on one worker only in dlbench ({able} can)",
        cpu_only="{framework}'s data-parallel training runs in its CPU image only (gloo)"),
}


def distributed(framework: str) -> dict:
    """The framework's data-parallel engine, as its models.json declares it (``engine``,
    ``backend``); {} where it has none."""
    return dict(models(framework).get("distributed") or {})


def _setting(axis: str) -> _Setting:
    """A setting models.json declares as ``blas`` is: a list of the values, under its name."""
    option = "--" + axis.replace("_", "-")
    return _SETTINGS.get(axis) or _Setting(
        offered=lambda info: list(info.get(axis, [])),
        cannot=f"{{framework}} has no {axis} setting: {{why}}", why=f"its models.json offers no {axis}",
        refused=f"{option} {{value}}: {{framework}} does not offer it (it offers {{offered}})",
        nowhere=f"{option} {{value}}: {{frameworks}} have no {axis} setting ({{able}} have)")


def offered(framework: str, axis: str) -> list:
    """The values of a compute setting a job of the framework may ask for, its default
    first; none where the framework has no such setting."""
    return _setting(axis).offered(models(framework))


def check_setting(framework: str, axis: str, value, variant: str = "cpu") -> Refusal | None:
    """Whether the framework runs a job on this value of a compute setting (None: each
    image's default, which every framework runs), in this image variant: None where it
    does, else why not.  The one place a setting is held against a framework: the planner
    asks it of every value (``plan.compute_problems``) and of every job (``job_unsupported``)."""
    if value is None:
        return None
    rule, info = _setting(axis), models(framework)
    values = rule.offered(info)
    if not values:
        why = info.get(f"{axis}_unsupported") or rule.why
        return Refusal(rule.cannot.format(framework=framework, why=why), usage=False)
    if rule.cpu_only and unversioned(variant)[0] != "cpu":
        return Refusal(rule.cpu_only.format(framework=framework, variant=variant.upper()), usage=False)
    if not rule.accepts(values, value):
        return Refusal(rule.refused.format(framework=framework, value=value, offered=", ".join(map(str, values))),
                       usage=True)
    return None


def offered_nowhere(axis: str, value, frameworks: list[str]) -> str:
    """The usage error of a setting's value that no framework of the run has the setting for."""
    able = [fw for fw in names() if offered(fw, axis)]
    return _setting(axis).nowhere.format(value=value, frameworks=", ".join(frameworks), able=", ".join(able))


def blas_offered(framework: str) -> list[str]:
    """The BLAS libraries a job of the framework may ask for (its CPU image holds them side
    by side, the first its default); none where the framework cannot switch."""
    return offered(framework, "blas")


def fair_offered(framework: str) -> list[str]:
    """The data sets whose fair network the framework's fair.py builds (the fair profile)."""
    return list(models(framework).get("fair", []))


def onednn_variable(framework: str) -> str | None:
    """The variable that turns the framework's oneDNN kernels on or off; None: it has none."""
    return models(framework).get("onednn", {}).get("variable") or None


def native_module(framework: str) -> tuple[str | None, str | None]:
    """(the module a host's Python must import to run the framework natively, None), or
    (None, why it cannot run natively): models.json's ``native``; the module is the
    framework's name unless it says otherwise."""
    native = models(framework).get("native", {})
    if native.get("unsupported"):
        return None, native["unsupported"]
    return native.get("module") or framework, None


def compiles_code(framework: str) -> bool:
    """Whether the framework compiles code at run time and loads it (its jobs then get
    an exec scratch directory, ``$DLBENCH_COMPILE_DIR``: their /tmp is noexec)."""
    return bool(models(framework).get("compiles_code"))


def check_frameworks(given: list[str]) -> list[str]:
    """The names, each a framework's, as the catalog spells them."""
    return [_get(name).name for name in given]


def check_datasets(names: list[str]) -> list[str]:
    """The names, each a data set's, as the catalog spells them."""
    spelt = [spelled(name, DATASETS) for name in names]
    for name, given in zip(spelt, names):
        if name not in DATASETS:
            raise unknown("data set", given, DATASETS)
    return spelt
