"""The plan: the options expanded into a plain list of jobs, without touching Docker.

A campaign is a matrix (``Axes``): frameworks x data sets x profiles x
hyper-parameter values x thread counts x devices, repeated.  ``expand`` turns it
into the plain list of ``Job`` values that ``run`` carries out one after another
and ``--dry-run`` prints.  Repeats are the outer loop: every job of the matrix
runs once before any runs a second time, so an interrupted campaign holds whole
rounds.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
from pathlib import Path
from typing import ClassVar, Optional

from pydantic import BaseModel, ConfigDict, create_model, model_validator

from dlbench_runner import contract

from . import axes as axes_, catalog
from .errors import UsageError
from .options import (Axes, PlanError, axis_problems, check_seeds, limits_for, parse_memory,
                      raise_problems)

MAX_JOBS = 100_000                  # a plan's size; DLBENCH_MAX_JOBS overrides it
MAX_JOBS_VARIABLE = "DLBENCH_MAX_JOBS"


def max_jobs() -> int:
    """The largest plan dlbench makes: MAX_JOBS, or $DLBENCH_MAX_JOBS."""
    text = os.environ.get(MAX_JOBS_VARIABLE)
    if text is None:
        return MAX_JOBS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"{MAX_JOBS_VARIABLE}={text!r}: give a whole number of jobs, 1 or more")
    return value


class _Job(BaseModel):
    """One container run: everything that defines what is measured, and its limits; and
    a field for each compute setting (``axes.settings()``: ``blas``, ``onednn``; None:
    the image's or the framework's default), added by ``Job``."""

    model_config = ConfigDict(frozen=True)
    framework: str
    dataset: str
    model: str
    profile: str
    hyperparameters: dict
    overrides: dict = {}
    threads: int
    cpus: int | None = None        # CPU limit (and cpuset first_cpu..first_cpu+cpus-1); None: no limit
    first_cpu: int = 0             # where its CPU set starts: GPU jobs side by side get disjoint ones
    gpu: int | None = None
    image_variant: str | None = None   # the image it runs in; None: its device's (see variant)
    seed: int = 1
    repeat: int = 0
    campaign: str | None = None    # the campaign's name, stored in the row
    unsupported: str | None = None     # why it cannot run (decided while planning): stored as such
    memory: str | None = None      # memory limit, as given (e.g. "4g"); None: none
    memory_bytes: int | None = None    # the same limit in bytes, as the runtime applies it
    timeout: float | None = None   # seconds; None: none
    settings_from: str | None = None   # trained with this framework's defaults (cross-settings)
    weights: str | None = None         # a fair job's initial weights file; None: its seed's draw
    weights_sha256: str | None = None  # the digest of that file's weights
    platforms: tuple[str, ...] = ()    # where the trained model is deployed after training
    version: str | None = None         # the framework's release; None: its default (models.json)


    # Not part of the identity: how a job was asked for, and the limits it ran under.
    NOT_IDENTITY: ClassVar[frozenset] = frozenset({"overrides", "campaign", "memory", "memory_bytes",
                                                   "timeout", "first_cpu", "unsupported", "weights",
                                                   "platforms"})
    # Part of the identity where given: a job that leaves them at the default keeps the
    # id it had before they existed (every compute setting, added by ``Job``).
    IDENTITY_WHERE_GIVEN: ClassVar[frozenset] = frozenset({"weights_sha256", "version"})

    @model_validator(mode="after")
    def _memory_in_bytes(self):
        """A job read from a file written before jobs carried ``memory_bytes`` (a Slurm
        array file, say) keeps its memory limit: the bytes are parsed from it."""
        if self.memory is not None and self.memory_bytes is None:
            object.__setattr__(self, "memory_bytes", parse_memory(self.memory))
        return self

    @property
    def device(self) -> str:
        return contract.device_of(self.gpu)

    @property
    def thread_environment(self) -> dict[str, str]:
        """The variables every BLAS and OpenMP runtime honours, set to the job's threads
        (OpenMP's to its ``omp_threads`` where that is given)."""
        return contract.thread_environment(self.threads, self.hyperparameters)

    @property
    def variant(self) -> str:
        """The image variant the job runs in: the GPU image for a GPU job, the CPU image
        for a CPU job unless it asked for the GPU one (``--variant gpu``: a check that
        a GPU image trains on the CPU too); another release's is ``cpu-<release>``."""
        return catalog.versioned(self.image_variant or ("cpu" if self.gpu is None else "gpu"), self.version)

    @property
    def label(self) -> str:
        return f"{self.framework}/{self.dataset}/{self.profile}"

    @property
    def images(self) -> list[tuple[str, str]]:
        """The images the job needs: its framework's, then the tool images of its platforms
        (after training: ``checks/platforms.py``)."""
        return [(self.framework, self.variant),
                *((tool, "cpu") for tool in dict.fromkeys(catalog.PLATFORM_TOOLS[p] for p in self.platforms))]

    @property
    def cpu_list(self) -> list[int] | None:
        """The CPUs the job is pinned to; None: not pinned."""
        return list(range(self.first_cpu, self.first_cpu + self.cpus)) if self.cpus else None

    @property
    def cpuset(self) -> str | None:
        """The CPUs the job is pinned to, as Docker's --cpuset-cpus takes them."""
        if not self.cpus:
            return None
        last = self.first_cpu + self.cpus - 1
        return str(last) if self.cpus == 1 else f"{self.first_cpu}-{last}"

    def job_id(self, image_id: str | None, dataset_sha256: str | None) -> str:
        """Stable identity: the same definition on the same image and data, the same id."""
        defining = self.model_dump(exclude=set(self.NOT_IDENTITY) | {
            k for k in self.IDENTITY_WHERE_GIVEN if getattr(self, k) is None})
        defining.update(image_id=image_id, dataset_sha256=dataset_sha256)
        blob = json.dumps(defining, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def settings(self) -> dict:
        """The compute settings the job asks for, by axis (None: the default)."""
        return {axis.name: getattr(self, axis.name) for axis in axes_.settings()}

    def spec(self, run_id: str, job_id: str) -> dict:
        """The job spec the runner reads."""
        return {"framework": self.framework, "dataset": self.dataset, "profile": self.profile,
                "overrides": self.overrides, "threads": self.threads, "device": self.device,
                "seed": self.seed, "run_id": run_id, "job_id": job_id, **self.settings,
                **({"fair_weights": contract.FAIR_WEIGHTS_FILE} if self.profile == contract.FAIR_PROFILE
                   else {})}


Job = create_model("Job", __base__=_Job, __doc__=_Job.__doc__,
                   **{axis.name: (Optional[axis.item], None) for axis in axes_.settings()})
Job.IDENTITY_WHERE_GIVEN = _Job.IDENTITY_WHERE_GIVEN | {axis.name for axis in axes_.settings()}


class Plan(BaseModel):
    jobs: list[Job]
    skipped: list[str] = []
    campaign: str | None = None

    @property
    def frameworks(self) -> list[str]:
        return list(dict.fromkeys(j.framework for j in self.jobs))

    @property
    def images(self) -> list[tuple[str, str]]:
        """The (framework, variant) images the plan's jobs run in (an unsupported job runs
        in none), and the tool images their platforms are deployed in."""
        return list(dict.fromkeys(image for j in self.jobs if j.unsupported is None for image in j.images))

    @property
    def datasets(self) -> list[str]:
        return list(dict.fromkeys(j.dataset for j in self.jobs))

    @property
    def gpus(self) -> list[int]:
        """The GPUs the plan's jobs use: its lanes, one job on each at a time."""
        return sorted({j.gpu for j in self.jobs if j.gpu is not None})


def expand(axes: Axes, host_cpus: int | None = None) -> Plan:
    """The matrix as a plain list of jobs; every bad value is a PlanError naming its key,
    raised with the others found (``PlanError.problems``): first each value alone, then,
    those all good, the values against each framework's models."""
    host_cpus = host_cpus or os.cpu_count() or 1
    problems = axis_problems(axes, host_cpus)
    frameworks = axes.frameworks or catalog.default_names()
    limits = {framework: limits_for(axes, framework, problems) for framework in frameworks}
    raise_problems(problems)
    problems += compute_problems(axes, frameworks)
    raise_problems(problems)
    datasets = axes.datasets or list(catalog.DATASETS)
    weights = fair_weights(axes, datasets)
    _check_size(axes, frameworks, datasets)
    cells, skipped = [], []
    settings = [axis.name for axis in axes_.settings()]
    for framework in frameworks:
        models = catalog.models(framework)
        grid = {k: v for k, v in axes.hyperparameters.items()
                if k not in axes.framework_hyperparameters.get(framework, {})}
        grid.update(axes.framework_hyperparameters.get(framework, {}))
        for dataset in datasets:
            if dataset not in models["models"]:
                skipped.append(f"{framework} has no {dataset} model")
                continue
            seeds = {profile: axes.seed if axes.seed is not None else
                     contract.default_seed(models, dataset, profile) for profile in axes.profiles}
            for seed in set(seeds.values()):
                try:
                    check_seeds(seed, axes.repeats)
                except PlanError as exc:
                    problems.append(exc)
            for profile, source, values in itertools.product(
                    axes.profiles, _sources(axes, framework, dataset), itertools.product(*grid.values())):
                seed = seeds[profile]
                overrides = dict(zip(grid, values))
                if source is not None:     # the other framework's settings, yours on top
                    try:
                        overrides = {**cross_settings(source, framework, dataset, profile), **overrides}
                    except PlanError as exc:
                        problems.append(exc)
                        continue
                params = {}                # on the CPU, on a GPU (a model may differ there)
                releases = (axes.versions or {}).get(framework) or (None,)
                for version, threads, gpu, *chosen in itertools.product(
                        releases, axes.threads, axes.devices, *(getattr(axes, name) for name in settings)):
                    on_gpu = gpu is not None
                    if on_gpu not in params:
                        params[on_gpu] = _resolve(axes, models, framework, dataset, profile,
                                                  overrides, contract.device_of(gpu), problems)
                    if params[on_gpu] is None:
                        continue
                    cells.append(dict(
                        framework=framework, dataset=dataset, profile=profile,
                        model=contract.model_name(models, dataset, profile), hyperparameters=params[on_gpu],
                        overrides=overrides, threads=threads or host_cpus, cpus=threads,
                        gpu=gpu, image_variant=axes.variant, campaign=axes.campaign,
                        settings_from=source, seed=seed, version=version, **dict(zip(settings, chosen)),
                        platforms=_platforms(axes, profile, params[on_gpu]),
                        **(weights if profile == contract.FAIR_PROFILE else {}),
                        **limits[framework]))
    raise_problems(problems)
    if not cells:
        raise UsageError("nothing to run: " + "; ".join(skipped) if skipped else "nothing to run")
    if axes.datasets and skipped:
        raise UsageError("; ".join(skipped))
    cells = share_cpus(cells, host_cpus)
    cells = [Job(**cell) for cell in cells]
    why = functools.cache(catalog.job_unsupported)      # decided while planning, once a kind of job
    cells = [job.model_copy(update={"unsupported": why(job.framework, job.dataset, job.variant, job.gpu,
                                                       tuple(job.settings.items()), job.profile)})
             for job in cells]
    cells = [job if job.unsupported else job.model_copy(update={"unsupported": split_unsupported(job)})
             for job in cells]
    jobs = [job.model_copy(update={"seed": job.seed + repeat, "repeat": repeat})
            for repeat in range(axes.repeats) for job in cells]
    return Plan(jobs=jobs, skipped=skipped, campaign=axes.campaign)


def split_unsupported(job: Job) -> str | None:
    """Why a job of several workers cannot split its batch among them (each takes a share of
    every global batch, at least one image), or None."""
    batch = job.hyperparameters.get("batch_size")
    if job.workers and batch is not None and batch < job.workers:
        return (f"{job.framework}/{job.dataset}: a batch of {batch} cannot be split over {job.workers} "
                f"workers (--set batch_size=N, N at least {job.workers})")
    return None


def _platforms(axes: Axes, profile: str, params: dict) -> tuple[str, ...]:
    """Where the job deploys its model after training: the platforms asked for, else its
    profile's; none for a job that exports no model (``export_onnx=0``: nothing to deploy,
    and no tool image to build for it)."""
    if not params.get("export_onnx", 1):
        return ()
    return axes.platforms if axes.platforms is not None else default_platforms(profile)


def default_platforms(profile: str) -> tuple[str, ...]:
    """Where a job of ``profile`` deploys its trained model unless told (``--platforms``):
    a paper job everywhere (a minute of deployment beside minutes to hours of training);
    a quick job nowhere, as the deployment would cost it several times its training
    (docs: Platforms, what they cost); a fair job nowhere, as it measures the framework
    alone."""
    return catalog.PLATFORMS if profile == contract.PAPER_PROFILE else ()


def fair_weights(axes: Axes, datasets: list[str]) -> dict:
    """The fair jobs' ``weights`` and ``weights_sha256`` from the user's file, checked against
    the network (a one-line error naming the layer that does not fit); {}: none given."""
    if axes.weights is None:
        return {}
    if len(datasets) != 1:
        raise PlanError("a weights file holds one data set's network: give one data set",
                        ("weights",), f"--weights {axes.weights}: a weights file holds one data "
                                      "set's network: run it with --datasets mnist or cifar10")
    from .checks import fair    # numpy: only for a run that gives weights
    path = Path(axes.weights).expanduser().resolve()
    try:
        arrays = fair.user_weights(path, datasets[0])
    except fair.networks.WeightsError as exc:
        raise PlanError(str(exc), ("weights",), f"--weights {axes.weights}: {exc}") from None
    return {"weights": str(path), "weights_sha256": fair.networks.weights_digest(arrays)}


def share_cpus(cells: list[dict], host_cpus: int) -> list[dict]:
    """GPU jobs on several GPUs run side by side, one on each GPU at a time (``run.py``);
    each GPU's jobs get a CPU set of their own, disjoint from the others': the host's
    CPUs split evenly, or ``--cpus`` each, and thread counts to match.  With one GPU,
    or none, the cells are as they were."""
    gpus = sorted({c["gpu"] for c in cells if c["gpu"] is not None})
    if len(gpus) < 2:
        return cells
    given = {c["cpus"] for c in cells if c["gpu"] is not None and c["cpus"]}
    share = max(given) if given else host_cpus // len(gpus)
    if share < 1 or share * len(gpus) > host_cpus:
        raise PlanError(f"{len(gpus)} GPUs side by side need {max(share, 1)} CPUs each, "
                        f"{max(share, 1) * len(gpus)} in all; this host has {host_cpus}", ("devices",))
    return [dict(c, cpus=c["cpus"] or share, threads=c["cpus"] or share,
                 first_cpu=gpus.index(c["gpu"]) * share) if c["gpu"] is not None else c
            for c in cells]


def compute_problems(axes: Axes, frameworks: list[str]) -> list[PlanError]:
    """The compute settings asked for (the BLAS libraries, the oneDNN switches), against the
    frameworks (``catalog.check_setting``): a value that a framework having the setting does
    not offer, or a setting that no framework of the run has, is a usage error; a framework
    without the setting at all gets ``unsupported`` rows (``catalog.job_unsupported``)."""
    found = []
    for axis in axes_.settings():
        for value in dict.fromkeys(v for v in getattr(axes, axis.name) if v is not None):
            refused = [catalog.check_setting(fw, axis.name, value) for fw in frameworks]
            if all(r is not None and not r.usage for r in refused):
                found.append(PlanError(catalog.offered_nowhere(axis.name, value, frameworks), (axis.name,)))
            found += [PlanError(r.why, (axis.name,)) for r in refused if r is not None and r.usage]
    return found


def _sources(axes: Axes, framework: str, dataset: str) -> list[str | None]:
    """Whose defaults the framework's jobs on the data set use: its own (None), another
    framework's (``caffe``), or a framework's for one data set (``caffe/mnist``)."""
    def own(source):
        fw, _, of = source.partition("/")
        return fw == framework and of in ("", dataset)
    return list(dict.fromkeys(None if s is None or own(s) else s for s in axes.settings_from))


def cross_settings(source: str, target: str, dataset: str, profile: str) -> dict:
    """The overrides that give ``target``'s model ``source``'s default settings.

    GTDLBench's cross-settings runs train each framework's own model with another
    framework's batch size, learning rate and length of training.  Each model
    declares in models.json (``settings``) which of its hyper-parameters hold these:
    ``length`` (epochs, or iterations over ``train_images``: the first key is the one
    that ends training, any others keep their proportion to it, as Caffe's second
    learning-rate phase does), ``learning_rate`` (the first key, others scaled with it).
    Length is carried over in passes over the training set: a model counting
    iterations trains ceil(epochs x images / batch size) of them; one counting
    epochs trains the nearest whole number, at least one.  Schedules, momentum,
    weight decay and the rest stay the target's own."""
    def model(framework, of):
        entry = catalog.models(framework)["models"].get(of)
        if entry is None or "settings" not in entry:
            raise PlanError(f"--settings-from {source}: {framework} has no {of} settings to "
                            "carry over", ("settings_from",))
        params = contract.resolve_hyperparameters(catalog.models(framework), of, profile)
        return entry["settings"], params

    framework, _, of = source.partition("/")
    (theirs, their_params), (ours, our_params) = model(framework, of or dataset), model(target, dataset)
    batch_size = their_params["batch_size"]
    epochs = _epochs(theirs, their_params)
    if ours["length"][0] == "epochs":
        length = max(1, round(epochs))
    else:
        length = max(1, math.ceil(epochs * ours["train_images"] / batch_size))
    rate = their_params[theirs["learning_rate"][0]]
    overrides = {"batch_size": batch_size}
    overrides.update(scaled(ours["length"], our_params, length, whole=True))
    overrides.update(scaled(ours["learning_rate"], our_params, rate, whole=False))
    return overrides


def _epochs(settings: dict, params: dict) -> float:
    """Passes over the training set: epochs, or the longest iteration count x batch / images."""
    length = max(params[key] for key in settings["length"])
    if settings["length"][0] == "epochs":
        return float(length)
    return length * params["batch_size"] / settings["train_images"]


def scaled(keys: list[str], params: dict, value, whole: bool) -> dict:
    """The first key set to ``value``, the others kept in proportion to it."""
    factor = value / params[keys[0]] if params[keys[0]] else 1.0
    scaled = {keys[0]: value}
    for key in keys[1:]:
        scaled[key] = max(1, round(params[key] * factor)) if whole else params[key] * factor
    return scaled


def _check_size(axes: Axes, frameworks: list[str], datasets: list[str]) -> None:
    """Refuse a plan larger than max_jobs() before making it."""
    cells = 0
    for framework in frameworks:
        grid = {**axes.hyperparameters, **axes.framework_hyperparameters.get(framework, {})}
        releases = len((axes.versions or {}).get(framework) or (None,))
        per_dataset = releases * math.prod(map(len, grid.values())) * math.prod(
            len(getattr(axes, axis.name)) for axis in axes_.AXES if axis.many and not axis.outer)
        cells += per_dataset * sum(d in catalog.models(framework)["models"] for d in datasets)
    limit = max_jobs()
    if cells * axes.repeats > limit:
        raise PlanError(f"the plan has {cells * axes.repeats:,} jobs ({cells:,} x {axes.repeats:,} "
                        f"repeats), more than {limit:,}; set {MAX_JOBS_VARIABLE} to allow more",
                        ("repeats",))


def _resolve(axes: Axes, models: dict, framework: str, dataset: str, profile: str,
             overrides: dict, device: str, problems: list[PlanError]) -> dict | None:
    """The hyper-parameters of one cell on its device; None where a key the model lacks,
    or a value of the wrong type, joins ``problems``: a PlanError naming framework/data set
    and the key."""
    def resolve(values: dict) -> dict:
        if profile == contract.FAIR_PROFILE:     # the same network in every framework
            return contract.fair_hyperparameters(dataset, values)
        return contract.resolve_hyperparameters(models, dataset, profile, values, device)

    bad = len(problems)
    for key, value in overrides.items():
        alone = {key: value} | {k: overrides[k] for k in contract.CHECKED_WITH.get(key, ()) if k in overrides}
        try:
            resolve(alone)
        except contract.SpecError as exc:
            own = key in axes.framework_hyperparameters.get(framework, {})
            where = ("hyperparameters",) + ((framework,) if own else ()) + (key,)
            message = str(exc)
            if not message.startswith(f"{framework}/"):
                message = f"{framework}/{dataset}: {message}"
            problems.append(PlanError(message, where))
    if len(problems) > bad:
        return None
    try:        # each value good alone, and together (robust_images against test_subset)
        return resolve(overrides)
    except contract.SpecError as exc:
        problems.append(PlanError(f"{framework}/{dataset}: {exc}", ("hyperparameters",)))
        return None
