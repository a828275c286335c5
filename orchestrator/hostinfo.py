"""Facts about the host, recorded beside every result (pyperf-style metadata)."""

from __future__ import annotations

import functools
import os
import platform
import socket


@functools.lru_cache(maxsize=None)
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 2)
    except OSError:
        pass
    return None


def host_facts(docker_version: str | None) -> dict:
    return {"host_name": socket.gethostname(), "host_cpu_model": cpu_model(),
            "host_cpus": os.cpu_count(), "host_memory_gb": memory_gb(),
            "host_os": f"{platform.system()} {platform.release()}",
            "docker_version": docker_version}
