"""The local scheduler: this process runs the plan's jobs on this host, one after another
(GPU jobs one a GPU, side by side), in the job loop (``run.run_plan``)."""

from __future__ import annotations

from ..hostinfo import check_gpu
from ..run import run_plan
from .base import Executed


class LocalScheduler:
    name = "local"

    def check(self, plan) -> None:
        """A GPU this host lacks is an error before any download."""
        for gpu in plan.gpus:
            check_gpu(gpu)

    def run(self, campaign, results, runtime, request, display, say) -> Executed:
        return Executed(results, run_plan(
            campaign.plan, results, runtime, request.data_dir, display=display,
            resume=request.resume, fail_fast=request.fail_fast))
