"""One ``dlbench run``, carried out: the plan, the scheduler's checks (the GPUs it names),
the runtime (Docker reached), what the images it must build need, then the scheduler.

The command line turns its options into a ``Request`` (a plain value) and calls
``execute``; nothing else decides where a run goes.  The campaign file, if any,
is read once here (``campaign.read``): the plan, and the file's ``scheduler`` and
``[slurm]`` table, which options given on the command line replace.  A *scheduler*
(``schedulers/``: local or slurm, found by name) says where and when the jobs run; a
*runtime* (``runtimes/``: docker or native, found by name) how each job executes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import runtimes, schedulers, store
from .build import BuildOptions
from .campaign import Campaign, read
from .display import NullDisplay
from .options import RunOptions
from .schedulers import Executed


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


def plan(request: Request) -> Campaign:
    """The plan of the request, touching nothing."""
    return read(request.campaign, request.options)


def execute(request: Request, display=None, say=print, campaign: Campaign | None = None) -> Executed:
    """Run the request's plan where it asks; every job's row is stored as it ends."""
    display = display or NullDisplay()
    campaign = campaign or plan(request)
    scheduler = schedulers.make(request.scheduler or campaign.scheduler or schedulers.DEFAULT)
    scheduler.check(campaign.plan)      # first: what this host lacks, before any download
    # then the runtime: no Docker daemon is an error before anything is written
    runtime = runtimes.make(request.runtime, request.python, display, request.build)
    runtime.prepare(campaign.plan.images)   # the archives of the images to build, before any build
    return scheduler.run(campaign, store.results_dir(request.results), runtime, request, display, say)
