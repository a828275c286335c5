"""Runtimes: how one job executes, behind one protocol (``base.Runtime``).

    docker   each job in its own hardened container of its framework's image
    native   each job as a process of a Python on this host, no Docker

The job loop (``run.py``) picks one with ``make`` and never looks inside it.
"""

from __future__ import annotations

from .base import Outcome, Runtime, Target, follow_output, gpu_device

RUNTIMES = ("docker", "native")


def make(runtime: str, builder_options: dict | None = None, python: str | None = None,
         display=None, given=None) -> Runtime:
    """The runtime of that name, ready to run jobs (docker: ``given``, the images a Slurm
    task was given, see ``docker.DockerRuntime``)."""
    if runtime == "docker":
        from .docker import DockerRuntime
        return DockerRuntime(builder_options, display, given)
    from .native import NativeRuntime
    return NativeRuntime(python)


__all__ = ["Runtime", "Outcome", "Target", "follow_output", "gpu_device", "RUNTIMES", "make"]
