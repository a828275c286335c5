"""One ``dlbench run``, carried out: the plan, the GPUs it names, the runtime (Docker
reached), the source archives of the images it must build, then its scheduler.

The command line turns its options into a ``Request`` (a plain value) and calls
``execute``; nothing else decides where a run goes.  The campaign file, if any,
is read once here (``campaign.read``): the plan, and the file's ``scheduler`` and
``[slurm]`` table, which options given on the command line replace.  A *scheduler*
says where and when the jobs run; a *runtime* (``runtimes/``) how each job executes.

    local   the job loop (``run.run_plan``) on this host, one job after another
    slurm   one Slurm job array (``schedulers/slurm.py``); each of its tasks runs
            that same job loop on its node
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import runtimes, store
from .build import BuildOptions
from .campaign import Campaign, read
from .display import NullDisplay
from .hostinfo import check_gpu
from .options import RunOptions
from .run import run_plan


@dataclass(frozen=True)
class SlurmRequest:
    """How a Slurm array is submitted, as given on the command line (None: not given)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    sbatch_options: tuple[str, ...] = ()
    detach: bool = False            # submit, return the array id, do not follow


@dataclass(frozen=True)
class Request:
    """Everything ``dlbench run`` was asked, checked by the command line's types."""

    options: RunOptions = field(default_factory=RunOptions)
    campaign: Path | None = None
    results: Path | None = None
    data_dir: Path | None = None
    build: BuildOptions = BuildOptions()    # how missing images are built
    runtime: str = "docker"
    python: str | None = None
    resume: bool = False
    fail_fast: bool = False
    scheduler: str | None = None    # local or slurm; None: the campaign file's, else local
    slurm: SlurmRequest = SlurmRequest()


@dataclass
class Executed:
    """What a run left: its rows (None for a Slurm array submitted detached, or with
    nothing left to run)."""

    results: Path
    records: list | None
    array_id: str | None = None     # the Slurm array, if one was submitted

    @property
    def not_ok(self) -> list:
        return [r for r in self.records or [] if r.status != "ok"]


def plan(request: Request) -> Campaign:
    """The plan of the request, touching nothing."""
    return read(request.campaign, request.options)


def execute(request: Request, display=None, say=print, campaign: Campaign | None = None) -> Executed:
    """Run the request's plan where it asks; every job's row is stored as it ends."""
    display = display or NullDisplay()
    campaign = campaign or plan(request)
    the_plan = campaign.plan
    scheduler = request.scheduler or campaign.scheduler or "local"
    if scheduler == "local":    # first: a GPU this host lacks is an error before any download
        for gpu in the_plan.gpus:       # (a Slurm task uses the GPU its scheduler gave it)
            check_gpu(gpu)
    # then the runtime: no Docker daemon is an error before anything is written
    runtime = runtimes.make(request.runtime, request.python, display, request.build)
    runtime.prepare(the_plan.images)     # the archives of the images to build, before any build
    results = store.results_dir(request.results)
    if scheduler == "local":
        return Executed(results, run_plan(
            the_plan, results, runtime, request.data_dir, display=display, resume=request.resume,
            fail_fast=request.fail_fast))
    from .schedulers import slurm

    given, table = request.slurm, campaign.slurm
    options = slurm.SlurmOptions(
        partition=given.partition or table.partition, account=given.account or table.account,
        qos=given.qos or table.qos, sbatch_options=[*table.sbatch_options, *given.sbatch_options])
    array_id, records = slurm.run_array(
        the_plan, results, options, runtime, given.detach, say, display, data_dir=request.data_dir,
        resume=request.resume)
    return Executed(results, records, array_id)
