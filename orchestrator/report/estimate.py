"""How long jobs will take on this machine: each job's work over a measured speed.

A job's work is the training images it processes and the test images of its final pass,
counted from its hyper-parameters and its model's ``settings`` in models.json:
- a model whose length is in epochs trains epochs x (the model's ``train_images``, or with a
  ``train_subset`` that subset less the images the model holds out of the training split for
  validation: Theano's LeNet5 validates on the last 10,000 of what it is given), each epoch
  cut to ``max_batches`` x ``batch_size`` where it has one;
- a model whose length is in iterations trains (its longest length key) x ``batch_size``;
- its final test pass tests ``test_subset`` images, else the whole test set.

A speed is a model's median ``train_images_per_s`` and ``test_images_per_s`` over the ok rows
of one device class, batch size and number type (``dtype``, where the model has one), whatever
their length of training: this machine's rows where the results directory holds some, else
the reference rows' (``reference_rows.LOCATION``), scaled by this machine's speed ratio where
its rows and the reference rows share a model.

Assumptions: training costs the same per image at full length as in the rows measured (a
quick run's first steps, with their warm-up, weigh more in a short run: the estimate errs
long); a paper run's periodic work (Caffe's and Theano's test and validation passes, the
Torch scripts' test pass after each epoch, TensorFlow's evaluations and checkpoints,
snapshots) is left out, as is early stopping (Theano's patience), setup and image builds.
"""
from __future__ import annotations

import dataclasses
import json
import math
import socket
from pathlib import Path

import pandas as pd

from .. import catalog, hostinfo, store
from ..errors import StoreError
from . import reference_rows

TRAIN_IMAGES = {"mnist": 60_000, "cifar10": 50_000}
TEST_IMAGES = {"mnist": 10_000, "cifar10": 10_000}
KEYS = ["framework", "dataset", "model", "device"]     # and batch size and dtype: ``key``
THIS_MACHINE, SCALED, REFERENCE = "this machine's rows", "scaled reference rows", "reference rows"


def work(framework: str, dataset: str, params: dict) -> tuple[float, float]:
    """(training images processed, test images of the final pass) of a job."""
    settings = catalog.models(framework)["models"][dataset]["settings"]
    batch = params["batch_size"]
    if settings["length"][0] == "epochs":
        per_epoch = settings["train_images"]
        if params.get("train_subset"):
            held_out = TRAIN_IMAGES[dataset] - settings["train_images"]
            per_epoch = max(0, params["train_subset"] - held_out)
        if params.get("max_batches"):
            per_epoch = min(per_epoch, params["max_batches"] * batch)
        trained = params["epochs"] * per_epoch
    else:
        trained = max(params[key] for key in settings["length"]) * batch
    return float(trained), float(params.get("test_subset") or TEST_IMAGES[dataset])


def paper_hyperparameters(framework: str, dataset: str, device: str = "cpu") -> dict:
    """The paper profile's hyper-parameters of a framework's model on a device class."""
    from dlbench_runner import contract

    return contract.resolve_hyperparameters(catalog.models(framework), dataset, contract.PAPER_PROFILE,
                                            device=device)


@dataclasses.dataclass(frozen=True)
class Speed:
    train_images_per_s: float
    test_images_per_s: float | None
    source: str                 # THIS_MACHINE, SCALED or REFERENCE

    def seconds(self, framework: str, dataset: str, params: dict) -> float:
        trained, tested = work(framework, dataset, params)
        test = tested / self.test_images_per_s if self.test_images_per_s else 0.0
        return trained / self.train_images_per_s + test


def key(framework: str, dataset: str, model: str, device: str, params: dict) -> tuple:
    """What a speed is of: a model on a device class, its batch size and number type."""
    return framework, dataset, model, device, params.get("batch_size"), params.get("dtype")


def _key(row) -> tuple:
    try:
        params = json.loads(row.hyperparameters)
    except (TypeError, ValueError):
        params = {}
    return key(row.framework, row.dataset, row.model, row.device, params)


def speeds(frame: pd.DataFrame | None, source: str, factor: float = 1.0) -> dict[tuple, Speed]:
    """Each speed (``key``) in stored rows: the medians over the ok rows; ``factor`` divides
    them (a time ratio: above 1, slower)."""
    if frame is None or not len(frame):
        return {}
    rows = frame[(frame["status"] == "ok")
                 & (pd.to_numeric(frame["train_images_per_s"], errors="coerce") > 0)]
    rows = rows.assign(_key=[_key(r) for r in rows.itertuples()])
    found = {}
    for key_, part in rows.groupby("_key", sort=False):
        test = pd.to_numeric(part["test_images_per_s"], errors="coerce").dropna()
        found[key_] = Speed(float(part["train_images_per_s"].median()) / factor,
                           float(test.median()) / factor if len(test) else None, source)
    return found


def this_machine(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    """The rows measured on this machine (its host name and CPU model)."""
    if frame is None or not len(frame):
        return None
    mine = frame[(frame["host_name"] == socket.gethostname())
                 & (frame["host_cpu_model"] == hostinfo.cpu_model())]
    return mine if len(mine) else None


def machine_speeds(results: Path | None, reference: Path | None = None) -> dict[tuple, Speed]:
    """The speeds that estimate a job on this machine: its own rows in ``results`` first, then
    the reference rows, scaled by this machine's ratio where their models overlap."""
    frame = None
    if results is not None and store.row_file_count(results):
        try:
            frame = this_machine(store.load(results))
        except StoreError:
            frame = None
    ours = speeds(frame, THIS_MACHINE)
    rows = reference_rows.first_machine(reference_rows.load(reference))
    ref = speeds(rows, REFERENCE)
    shared = [k for k in ours if k in ref]
    if shared:        # this machine's training time ÷ the reference machine's, per image
        factor = math.exp(sum(math.log(ref[k].train_images_per_s / ours[k].train_images_per_s)
                              for k in shared) / len(shared))
        ref = speeds(rows, SCALED, factor)
    return {**ref, **ours}


@dataclasses.dataclass
class Estimate:
    seconds: float
    jobs: int                   # jobs estimated
    sources: dict[str, int]     # jobs by the source of their speed
    missing: list[str]          # jobs not estimated: no speed measured for their model

    def line(self, what: str) -> str:
        if not self.jobs:
            return (f"{what}: none (no speed measured for its models, neither in this machine's "
                    f"rows of the results directory nor in the reference rows)")
        how = ", ".join(f"{n} from {source}" for source, n in self.sources.items())
        if self.missing:
            named = list(dict.fromkeys(self.missing))
            how += (f"; {len(self.missing)} not estimated, no speed measured: "
                    + ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else ""))
        return f"{what}: about {duration(self.seconds)} on this machine ({how})"


def of_job(job, known: dict[tuple, Speed]) -> float | None:
    """The seconds of one job (as ``of_jobs`` reads it) at the ``known`` speeds; None where
    no speed of its model is known."""
    speed = known.get(key(job.framework, job.dataset, job.model, job.device, job.hyperparameters))
    return None if speed is None else speed.seconds(job.framework, job.dataset, job.hyperparameters)


def of_jobs(jobs, known: dict[tuple, Speed]) -> Estimate:
    """The time of ``jobs`` (each with framework, dataset, model, device, hyperparameters)
    at the ``known`` speeds."""
    total, sources, missing, count = 0.0, {}, [], 0
    for job in jobs:
        speed = known.get(key(job.framework, job.dataset, job.model, job.device,
                              job.hyperparameters))
        if speed is None:
            missing.append(f"{job.framework} {job.dataset} ({job.device})")
            continue
        total += speed.seconds(job.framework, job.dataset, job.hyperparameters)
        sources[speed.source] = sources.get(speed.source, 0) + 1
        count += 1
    return Estimate(total, count, sources, missing)


def of_plan(jobs, results: Path | None, reference: Path | None = None) -> Estimate:
    """A plan's time on this machine (``dlbench run --dry-run``); unsupported jobs run none."""
    return of_jobs([j for j in jobs if j.unsupported is None], machine_speeds(results, reference))


@dataclasses.dataclass(frozen=True)
class PaperJob:
    """A paper-profile job of a model, as ``of_jobs`` reads a job."""

    framework: str
    dataset: str
    model: str
    device: str
    hyperparameters: dict


def paper_jobs(models) -> list[PaperJob]:
    """The paper-profile job of each (framework, dataset, model, device) of ``models``."""
    return [PaperJob(f, d, m, v, paper_hyperparameters(f, d, v)) for f, d, m, v in models]


def duration(seconds: float) -> str:
    """A duration as a person reads it: 45 s, 12 min, 3 h 05 min, 2 d 4 h."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(round(seconds / 3600), 24)
    return f"{days} d {hours} h"
