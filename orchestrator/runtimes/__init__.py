"""Runtimes: how one job executes, behind one protocol (``base.Runtime``).

    docker   each job in its own hardened container of its framework's image
    native   each job as a process of a Python on this host, no Docker

The job loop (``run.py``) picks one with ``make`` and never looks inside it.
"""

from __future__ import annotations

from .base import Outcome, Runtime, Target, follow_output, gpu_device

RUNTIMES = ("docker", "native")


def make(runtime: str, python: str | None = None, display=None, build=None) -> Runtime:
    """The runtime of that name, ready to run jobs: docker builds the images it lacks as
    ``build`` (a ``build.BuildOptions``) says; native runs ``python``."""
    if runtime == "docker":
        from .docker import DockerRuntime
        return DockerRuntime(display, build)
    from .native import NativeRuntime
    return NativeRuntime(python)


__all__ = ["Runtime", "Outcome", "Target", "follow_output", "gpu_device", "RUNTIMES", "make"]
