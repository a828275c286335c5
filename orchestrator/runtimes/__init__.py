"""Runtimes: where a job runs, behind one protocol (``base.Backend``).

    docker   each job in its own hardened container of its framework's image
    native   each job as a process of a Python on this host, no Docker

The job loop (``run.py``) picks one with ``make`` and never looks inside it.
"""

from __future__ import annotations

from .base import Backend, Outcome, Target, follow_output, gpu_device

RUNTIMES = ("docker", "native")


def make(runtime: str, builder_options: dict | None = None, python: str | None = None,
         display=None) -> Backend:
    """The runtime of that name, ready to run jobs."""
    if runtime == "docker":
        from .docker import DockerBackend
        return DockerBackend(builder_options, display)
    from .native import NativeBackend
    return NativeBackend(python)


__all__ = ["Backend", "Outcome", "Target", "follow_output", "gpu_device", "RUNTIMES", "make"]
