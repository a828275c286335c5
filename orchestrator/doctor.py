"""`dlbench doctor`: what this host has, what is missing for a run, and what would make its
timings unstable."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from . import build, catalog, datasets, hostinfo
from .build import sources
from .errors import DlbenchError

OK, FAIL, WARN, NOTE = "ok", "fail", "warn", "note"


def checks(data_dir=None, results: Path | None = None, sources_dir=None):
    """Yield (name, status, detail); status is ok, fail, warn (timings will be unstable) or
    note (advice only)."""
    client = None
    try:
        from .runtimes.docker import docker_client
        client = docker_client()
        version = client.version()
        yield "docker", OK, f"daemon {version.get('Version')} (API {version.get('ApiVersion')})"
    except DlbenchError as exc:
        yield "docker", FAIL, str(exc)
    if client is not None:
        for tag in [build.root_tag(), build.base_tag()] + [build.image_tag(f) for f in catalog.names()]:
            image = build.find_image(client, tag)
            yield f"image {tag}", NOTE if image is None else OK, \
                "not built yet (dlbench build-images, or the first run builds it)" if image is None \
                else f"{image.short_id}, built {image.labels.get(build.LABEL + '.build-date', '?')}"
        try:
            pulled = build.find_image(client, build.PULL_IMAGE)
        except Exception:  # noqa: BLE001
            pulled = None
        has_debootstrap = shutil.which("debootstrap") is not None
        yield "base source", OK if (pulled or has_debootstrap or build.find_image(client, build.root_tag())) else FAIL, \
            ("debootstrap available" if has_debootstrap else "no debootstrap (apt-get install debootstrap)") \
            + (f"; {build.PULL_IMAGE} present" if pulled else "")
    try:
        yield "CA bundle", OK, str(build.find_ca_bundle())
    except DlbenchError as exc:
        yield "CA bundle", FAIL, str(exc)
    yield from gpu_checks(client)
    root, local = datasets.default_root(data_dir)
    for name in catalog.DATASETS:
        if not (root / name).is_dir():
            yield f"data set {name}", NOTE, f"not in {root}; " + \
                ("missing from the local copy" if local else "downloaded on first use")
            continue
        try:
            info = datasets.verify(name, root)
            yield f"data set {name}", OK, f"{info.path} sha256 {info.sha256[:12]}…" + \
                (" (official files)" if info.official else "")
        except DlbenchError as exc:
            yield f"data set {name}", FAIL, str(exc)
    try:
        mirror = sources.mirror_dir(sources_dir)
        yield "sources", OK, f"mirror {mirror}" if mirror else f"GitHub, cached in {sources.cache_dir()}"
        for source, ok, detail in sources.status(mirror):
            yield f"source {source.repo}@{source.commit[:12]}", {True: OK, False: FAIL, None: NOTE}[ok], detail
    except DlbenchError as exc:
        yield "sources", FAIL, str(exc)
    target = results or Path(".")
    free = shutil.disk_usage(target if target.exists() else Path(".")).free / 2**30
    yield from timing(hostinfo.timing_facts(), os.cpu_count() or 1)
    yield "disk", OK if free > 10 else FAIL, f"{free:.0f} GiB free (images need about 2 GiB each)"


# Docker registers its "nvidia" device driver (what --gpus asks for) when the NVIDIA
# Container Toolkit's hook is on the daemon's PATH; newer set-ups use CDI specs instead.
TOOLKIT_HOOKS = ("nvidia-container-runtime-hook", "nvidia-container-toolkit")
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))


def gpu_checks(client):
    """(name, status, detail) of the GPU half: the driver and its GPUs, Docker's GPU
    support, and each framework's GPU image."""
    count = hostinfo.gpu_count()
    if not count:
        yield "NVIDIA driver", NOTE, "none: CPU runs only (--gpu is an error)"
    else:
        facts = [hostinfo.gpu_facts(str(index)) for index in range(count)]
        yield "NVIDIA driver", OK, f"{facts[0]['gpu_driver']}, {count} GPU(s)"
        for index, gpu in enumerate(facts):
            memory = gpu["gpu_memory_total_bytes"]
            yield f"GPU {index}", OK, f"{gpu['gpu_name']}" + (f", {memory / 2**30:.0f} GiB" if memory else "")
    if client is None:
        return
    toolkit = [name for name in TOOLKIT_HOOKS if shutil.which(name)]
    toolkit += [f"runtime {name}" for name in (client.info().get("Runtimes") or {}) if "nvidia" in name]
    toolkit += [str(spec) for folder in CDI_DIRS if folder.is_dir() for spec in sorted(folder.glob("*nvidia*"))]
    if toolkit:
        yield "container toolkit", OK, f"NVIDIA Container Toolkit: {', '.join(toolkit)} (Docker can give a job a GPU)"
    else:
        yield "container toolkit", FAIL if count else NOTE, (
            "no NVIDIA Container Toolkit: Docker cannot give a container a GPU (install "
            "nvidia-container-toolkit and restart Docker)")
    for framework in catalog.names():
        tag = build.image_tag(framework, "gpu")
        reason = catalog.variant_unsupported(framework, "gpu")
        image = None if reason else build.find_image(client, tag)
        if reason:
            yield f"image {tag}", NOTE, reason
        elif image is None:
            yield f"image {tag}", NOTE, "not built yet (dlbench build-images --variant gpu, or the first --gpu run builds it)"
        else:
            labels = image.labels
            yield f"image {tag}", OK, (f"{image.short_id}, CUDA {labels.get(build.LABEL + '.cuda', '?')}, "
                                       f"built {labels.get(build.LABEL + '.build-date', '?')}")


def timing(facts: dict, cpus: int):
    """(name, status, detail) of the host facts that make timings unstable (hostinfo.timing_facts)."""
    governor = facts["host_cpu_governor"]
    if governor is None:
        yield "CPU governor", NOTE, "unknown (no cpufreq in /sys: a virtual machine or a container)"
    elif governor == "performance":
        yield "CPU governor", OK, governor
    else:
        yield "CPU governor", WARN, (f"{governor}: the clock follows the load, so timings vary; "
                                     "for benchmarks: cpupower frequency-set -g performance")
    turbo = facts["host_turbo"]
    if turbo is None:
        yield "turbo boost", NOTE, "unknown (neither intel_pstate/no_turbo nor cpufreq/boost in /sys)"
    elif turbo:
        yield "turbo boost", WARN, ("on: the clock rises and falls with temperature and load; for "
                                    "stable timings turn it off (intel_pstate/no_turbo = 1, or "
                                    "cpufreq/boost = 0)")
    else:
        yield "turbo boost", OK, "off"
    load = facts["host_load_avg"]
    if load is None:
        yield "load average", NOTE, "unknown"
    elif load > 0.5 * cpus:
        yield "load average", WARN, (f"{load:.2f} with {cpus} CPUs: other work is running, so jobs "
                                     "will be slower and vary; measure on a quiet machine")
    else:
        yield "load average", OK, f"{load:.2f} with {cpus} CPUs"
    isolated = facts["host_isolated_cpus"]
    yield "isolated CPUs", NOTE, ("unknown" if isolated is None else isolated or
                                  "none (isolcpus= keeps CPUs free of other work)")


# The checks that come one per thing (an image, a source archive, a data set, a GPU): one
# line for each family without --verbose, as (name prefix, name suffix, the family's name,
# the word for an ok check).
FAMILIES = [("image ", ":gpu", "GPU images", "built"), ("image ", "", "images", "built"),
            ("source ", "", "source archives", "present"), ("data set ", "", "data sets", "verified"),
            ("GPU ", "", "GPUs", "found")]
WORST = [FAIL, WARN, NOTE, OK]
BREAKS = (": ", "; ", " (")


def concise(found) -> list[tuple[str, str, str]]:
    """``checks`` as `dlbench doctor` shows them without --verbose: a family of checks
    (``FAMILIES``) on one line, how many of them are ok and what the others lack; any other
    check on a line of its own, its detail cut to its first clause (a failure's and a
    warning's kept whole); every failure and warning of a family on a line of its own as
    well.  A family's others are said by their details' last clauses ("not in DIR;
    downloaded on first use": "downloaded on first use")."""
    shown, families = [], {}
    for name, status, detail in found:
        family = next((f for f in FAMILIES if name.startswith(f[0]) and name.endswith(f[1])), None)
        if family is None:
            shown.append((name, status, detail if status in (FAIL, WARN) else _first_clause(detail)))
            continue
        if family not in families:
            families[family] = []
            shown.append(family)
        families[family].append((name, status, detail))
    lines = []
    for item in shown:
        if item not in families:
            lines.append(item)
            continue
        _, _, label, word = item
        members = families[item]
        status = min((s for _, s, _ in members), key=WORST.index)
        ok = sum(s == OK for _, s, _ in members)
        others = sorted({_first_clause(d.split("; ")[-1]) for _, s, d in members if s != OK})
        text = f"{ok} of {len(members)} {word}" + (f"; the others: {'; '.join(others)}" if others else "")
        lines.append((label, status, text))
        lines += [(n, s, d) for n, s, d in members if s in (FAIL, WARN)]
    return lines


def _first_clause(detail: str) -> str:
    """A detail to its first clause ("not built yet (dlbench build-images, ...)": "not built
    yet"), where that leaves a few characters."""
    cut = min((i for i in (detail.find(b) for b in BREAKS) if i >= 3), default=len(detail))
    return detail[:cut]


def noise_warning(facts: dict | None = None, cpus: int | None = None) -> str | None:
    """The ``timing`` warnings as one line, for `dlbench run` to say once before its jobs
    (None where there are none)."""
    facts = hostinfo.timing_facts() if facts is None else facts
    found = [f"{name} {detail}" for name, status, detail in timing(facts, cpus or os.cpu_count() or 1)
             if status == WARN]
    if not found:
        return None
    return ("timings on this host may be unstable (dlbench doctor tells more): "
            + "; ".join(d.split(":")[0] if ":" in d else d for d in found))
