"""`dlbench doctor`: what this host has, and what is missing for a run."""

from __future__ import annotations

import shutil
from pathlib import Path

from . import build, catalog, datasets, sources
from .errors import DlbenchError


def checks(data_dir=None, results: Path | None = None, sources_dir=None):
    """Yield (name, ok, detail); ok is True, False, or None for advice only."""
    client = None
    try:
        from .run import docker_client
        client = docker_client()
        version = client.version()
        yield "docker", True, f"daemon {version.get('Version')} (API {version.get('ApiVersion')})"
    except DlbenchError as exc:
        yield "docker", False, str(exc)
    if client is not None:
        for tag in [build.root_tag(), build.base_tag()] + [build.image_tag(f) for f in catalog.available()]:
            image = build.find_image(client, tag)
            yield f"image {tag}", None if image is None else True, \
                "not built yet (dlbench build-images, or the first run builds it)" if image is None \
                else f"{image.short_id}, built {image.labels.get(build.LABEL + '.build-date', '?')}"
        try:
            pulled = build.find_image(client, build.PULL_IMAGE)
        except Exception:  # noqa: BLE001
            pulled = None
        has_debootstrap = shutil.which("debootstrap") is not None
        yield "base source", True if (pulled or has_debootstrap or build.find_image(client, build.root_tag())) else False, \
            ("debootstrap available" if has_debootstrap else "no debootstrap (apt-get install debootstrap)") \
            + (f"; {build.PULL_IMAGE} present" if pulled else "")
    try:
        yield "CA bundle", True, str(build.find_ca_bundle())
    except DlbenchError as exc:
        yield "CA bundle", False, str(exc)
    from .run import gpu_count
    gpus = gpu_count()
    yield "GPUs", None, f"{gpus} NVIDIA GPU(s)" if gpus else "none (CPU runs only)"
    root, local = datasets.default_root(data_dir)
    for name in catalog.DATASETS:
        if not (root / name).is_dir():
            yield f"data set {name}", None, f"not in {root}; " + \
                ("missing from the local copy" if local else "downloaded on first use")
            continue
        try:
            info = datasets.verify(name, root)
            yield f"data set {name}", True, f"{info.path} sha256 {info.sha256[:12]}…" + \
                (" (official files)" if info.official else "")
        except DlbenchError as exc:
            yield f"data set {name}", False, str(exc)
    try:
        mirror = sources.mirror_dir(sources_dir)
        yield "sources", True, f"mirror {mirror}" if mirror else f"GitHub, cached in {sources.cache_dir()}"
        for source, ok, detail in sources.status(mirror):
            yield f"source {source.repo}@{source.commit[:12]}", ok, detail
    except DlbenchError as exc:
        yield "sources", False, str(exc)
    target = results or Path(".")
    free = shutil.disk_usage(target if target.exists() else Path(".")).free / 2**30
    yield "disk", free > 10, f"{free:.0f} GiB free (images need about 2 GiB each)"
