"""What a run sets up before its first job, written once: the local job loop (``run.py``)
and the Slurm submitter (``schedulers/slurm.py``) both start here.

    1. the data sets, verified (downloaded where missing)
    2. the images: each framework and variant the plan runs in, resolved to its target
       (``resolve``: the runtime builds or finds it), once; a Slurm task is given its
       submitter's targets instead
    3. each job's id, which names what it runs: definition, image and data
    4. with ``--resume``, the jobs already stored as ok left out

The runtime was made before (``execute``: Docker reached before anything is written).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import datasets, store
from .display import NullDisplay
from .plan import Job, Plan
from .runtimes import Runtime, Target

Targets = dict[tuple[str, str], Target]     # (framework, variant) -> what its jobs run on


@dataclass(frozen=True)
class Prepared:
    data: dict                          # data set name -> datasets.VerifiedDataset
    targets: Targets
    todo: list[tuple[Job, str]]         # (job, job id), in the plan's order


def resolve(plan: Plan, runtime: Runtime) -> Targets:
    """The image stage: the target of each (framework, variant) the plan's jobs run in (a
    job planned unsupported runs in none); a runtime that resolves several at once (the
    Docker runtime builds missing images side by side) is given them all."""
    several = getattr(runtime, "targets", None)
    if several is not None:
        return several(list(plan.images))
    return {(framework, variant): runtime.target(framework, variant)
            for framework, variant in plan.images}


def prepare(plan: Plan, results: Path, runtime: Runtime, data_dir=None, display=None,
            resume: bool = False, targets: Targets | None = None) -> Prepared:
    """The data, the targets (resolved here unless given), each job with its id, and with
    ``resume`` only the jobs not yet stored as ok."""
    display = display or NullDisplay()
    data = datasets.prepare(plan.datasets, data_dir, progress=display.download_progress())
    if targets is None:
        targets = resolve(plan, runtime)
    todo = [(job, job.job_id(None if job.unsupported else targets[job.framework, job.variant].id,
                             data[job.dataset].sha256)) for job in plan.jobs]
    if resume:
        todo = not_stored(results, plan.campaign, todo, display)
    return Prepared(data, targets, todo)


def not_stored(results: Path, campaign: str | None, todo: list, display) -> list:
    """``--resume``: the (job, job id) pairs not yet stored as ok."""
    done = store.ok_job_ids(results, campaign)
    left = [(job, job_id) for job, job_id in todo if job_id not in done]
    display.say(f"resume: {len(todo) - len(left)} job(s) already stored as ok, {len(left)} to run")
    return left
