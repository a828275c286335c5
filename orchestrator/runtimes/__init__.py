"""Runtimes: how one job executes, behind one protocol (``base.Runtime``).

    docker   each job in its own hardened container of its framework's image
    native   each job as a process of a Python on this host, no Docker

``RUNTIMES`` names each with its factory, which imports the runtime's module only when
it is made (the command line lists the names before the Docker SDK or psutil is loaded);
``make`` finds one by name.  The job loop (``run.py``) and the schedulers never look
inside it.  A runtime added is a module beside these two and one line here.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import UsageError
from .base import Outcome, Runtime, Target, follow_output, gpu_device


def _docker(python, display, build) -> Runtime:
    from .docker import DockerRuntime
    return DockerRuntime(display, build)


def _native(python, display, build) -> Runtime:
    from .native import NativeRuntime
    return NativeRuntime(python)


# name -> factory(python, display, build); the names are the choices of --runtime
RUNTIMES: dict[str, Callable[..., Runtime]] = {"docker": _docker, "native": _native}


def make(runtime: str, python: str | None = None, display=None, build=None) -> Runtime:
    """The runtime of that name, ready to run jobs: docker builds the images it lacks as
    ``build`` (a ``build.BuildOptions``) says; native runs ``python``."""
    try:
        factory = RUNTIMES[runtime]
    except KeyError:
        raise UsageError(f"no runtime {runtime!r}: one of {', '.join(RUNTIMES)}") from None
    return factory(python, display, build)


__all__ = ["Runtime", "Outcome", "Target", "follow_output", "gpu_device", "RUNTIMES", "make"]
