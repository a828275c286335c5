"""What a run sets up before its first job, written once: the local job loop (``run.py``)
and the Slurm submitter (``schedulers/slurm.py``) both start here.

    1. the data sets, verified (downloaded where missing)
    2. the images: each framework and variant the plan runs in, resolved to its target
       (``stream``: the runtime builds or finds it), once, each as soon as it is ready;
       the job loop starts a framework's jobs as its target comes, the Slurm submitter
       takes them all first (``resolve``); a Slurm task is given its submitter's targets
    3. each job's id, which names what it runs: definition, image and data (``Prepared.job_id``)
    4. with ``--resume``, the jobs already stored as ok left out (``Prepared.stored``)

The runtime was made before (``execute``: Docker reached before anything is written).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import datasets, store
from .display import NullDisplay
from .errors import BuildError
from .plan import Job, Plan
from .runtimes import Runtime, Target

Targets = dict[tuple[str, str], Target]     # (framework, variant) -> what its jobs run on


@dataclass(frozen=True)
class Prepared:
    data: dict                          # data set name -> datasets.VerifiedDataset
    done: frozenset | None = None       # with --resume: the ids of the jobs stored as ok

    def job_id(self, job: Job, target: Target | None) -> str:
        """The job's id on its target (None for a job planned unsupported: it has none)."""
        return job.job_id(None if job.unsupported or target is None else target.id,
                          self.data[job.dataset].sha256)

    def stored(self, job_id: str) -> bool:
        """``--resume``: the job is stored as ok already, and is left out."""
        return self.done is not None and job_id in self.done

    def todo(self, jobs: list[Job], targets: Targets, display) -> list[tuple[Job, str]]:
        """Every job with its id, in the plan's order, those already stored left out (and
        said, ``resumed``): the Slurm submitter's way, with every target resolved."""
        todo = [(job, self.job_id(job, None if job.unsupported else targets[job.framework, job.variant]))
                for job in jobs]
        left = [(job, job_id) for job, job_id in todo if not self.stored(job_id)]
        if self.done is not None:
            resumed(display, len(todo) - len(left), len(left))
        return left


def stream(plan: Plan, runtime: Runtime) -> Iterator[tuple[tuple[str, str], Target]]:
    """The image stage: the target of each (framework, variant) the plan's jobs run in (a
    job planned unsupported runs in none), each yielded as soon as it is ready; a runtime
    that resolves several at once (the Docker runtime builds missing images side by side)
    is given them all."""
    several = getattr(runtime, "targets", None)
    if several is not None:
        yield from several(list(plan.images))
        return
    for framework, variant in plan.images:
        yield (framework, variant), runtime.target(framework, variant)


def resolve(plan: Plan, runtime: Runtime) -> Targets:
    """Every target at once; an image that could not be built stops the run here, as its
    build said (the Slurm submitter needs every image before it submits)."""
    targets = dict(stream(plan, runtime))
    for target in targets.values():
        if target.error is not None:
            raise BuildError(target.error)
    return targets


def prepare(plan: Plan, results: Path, data_dir=None, display=None,
            resume: bool = False) -> Prepared:
    """The data verified, and with ``resume`` the ids of the jobs stored as ok."""
    display = display or NullDisplay()
    data = datasets.prepare(plan.datasets, data_dir, progress=display.download_progress())
    done = frozenset(store.ok_job_ids(results, plan.campaign)) if resume else None
    return Prepared(data, done)


def resumed(display, stored: int, left: int) -> None:
    """``--resume``: how many jobs were left out as stored, said once every id is known."""
    display.say(f"resume: {stored} job(s) already stored as ok, {left} to run")
