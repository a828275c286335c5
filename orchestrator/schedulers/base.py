"""What every scheduler shares: the ``Scheduler`` protocol ``execute`` sees them through,
and what a run left (``Executed``).

    class Scheduler(Protocol):
        name: str                        # local or slurm: the choice of --scheduler
        def check(plan)                  # first, before the runtime is made and anything is
                                         # downloaded or written: what this host must have
                                         # (local: the GPUs the plan names)
        def run(campaign, results, runtime, request, display, say) -> Executed
                                         # carry out the campaign's plan with the runtime
                                         # ``execute`` made; ``request``: the ``execute.Request``
                                         # (data, resume, fail-fast, Slurm's options)

A scheduler says where and when the jobs run; a runtime (``runtimes/``) how each one
executes.  Both schedulers end in the one job loop (``run.run_plan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..campaign import Campaign
    from ..plan import Plan
    from ..runtimes import Runtime


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


class Scheduler(Protocol):
    name: str

    def check(self, plan: Plan) -> None: ...

    def run(self, campaign: Campaign, results: Path, runtime: Runtime, request, display,
            say) -> Executed: ...
