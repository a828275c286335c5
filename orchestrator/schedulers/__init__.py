"""Schedulers: where and when a run's jobs run, behind one protocol (``base.Scheduler``).

    local    this process runs the plan's jobs one after another (``local.py``: the job
             loop, ``run.run_plan``)
    slurm    the plan becomes one Slurm job array; each task runs the same loop for
             one job on its node (``slurm.py``), and the submitter follows the array
             and stores a row for every task Slurm ended without one

``SCHEDULERS`` names each with its factory, which imports the scheduler's module only
when it is made; ``execute`` finds one by name with ``make``.  The names are the
choices of ``--scheduler`` and a campaign file's ``scheduler`` (``catalog.SCHEDULERS``,
which the options check without importing this package).  A scheduler added is a
module beside these and one line here and in ``catalog.SCHEDULERS``.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import UsageError
from .base import Executed, Scheduler

DEFAULT = "local"


def _local() -> Scheduler:
    from .local import LocalScheduler
    return LocalScheduler()


def _slurm() -> Scheduler:
    from .slurm import SlurmScheduler
    return SlurmScheduler()


SCHEDULERS: dict[str, Callable[[], Scheduler]] = {"local": _local, "slurm": _slurm}


def make(name: str) -> Scheduler:
    """The scheduler of that name."""
    try:
        factory = SCHEDULERS[name]
    except KeyError:
        raise UsageError(f"no scheduler {name!r}: one of {', '.join(SCHEDULERS)}") from None
    return factory()


__all__ = ["Scheduler", "Executed", "SCHEDULERS", "DEFAULT", "make"]
