"""What each framework offers: its image directory and its models.json.

The five frameworks of the study are fixed; a framework is available once its
directory under images/ holds a Dockerfile, an adapter and a models.json.
"""

import functools
import importlib.resources
from pathlib import Path

from dlbench_runner import contract

from .errors import UsageError

FRAMEWORKS = ("caffe", "tensorflow", "torch", "pytorch", "mxnet", "theano")
DATASETS = ("mnist", "cifar10")
PROFILES = contract.PROFILES


def images_dir() -> Path:
    return Path(str(importlib.resources.files("dlbench_images")))


def framework_dir(framework: str) -> Path:
    return images_dir() / framework


def available() -> list[str]:
    """Frameworks whose image directory is complete, in the study's order."""
    return [fw for fw in FRAMEWORKS
            if all((framework_dir(fw) / f).is_file() for f in ("Dockerfile", "adapter.py", "models.json"))]


@functools.lru_cache(maxsize=None)
def models(framework: str) -> dict:
    return contract.load_catalog(str(framework_dir(framework)))


def sources(framework: str, variant: str = "cpu") -> list[str]:
    """The pinned source repositories (``sources.py``'s registry) an image of the framework
    is built from: the framework's, then its variant's own (e.g. cutorch for Torch7's GPU)."""
    info = models(framework)
    return info.get("sources", []) + info.get("variants", {}).get(variant, {}).get("sources", [])


def dockerfile(framework: str, variant: str) -> Path:
    name = "Dockerfile" if variant == "cpu" else f"Dockerfile.{variant}"
    return framework_dir(framework) / name


def variant_info(framework: str, variant: str) -> dict:
    """The variant's facts from models.json: version, source, cuda, cudnn; or ``unsupported``."""
    info = models(framework)
    if variant == "cpu":
        return {"version": info["version"], "source": info.get("source"), "cuda": "none"}
    return info.get("variants", {}).get(variant) or {"unsupported": f"{framework} has no {variant} image"}


def variant_unsupported(framework: str, variant: str) -> str | None:
    """Why the framework has no image of this variant, or None."""
    info = variant_info(framework, variant)
    if "unsupported" in info:
        return f"{framework} has no {variant.upper()} image: {info['unsupported']}"
    if not dockerfile(framework, variant).is_file():
        return f"{framework} has no {variant.upper()} image ({dockerfile(framework, variant).name} is missing)"
    return None


def gpu_unsupported(framework: str, dataset: str) -> str | None:
    """Why the framework's model of the data set cannot train on a GPU, or None."""
    reason = models(framework)["models"].get(dataset, {}).get("gpu_unsupported")
    return f"{framework}'s {dataset} model has no GPU version: {reason}" if reason else None


def job_unsupported(framework: str, dataset: str, variant: str, gpu: int | None) -> str | None:
    """Why a job cannot run whatever the runtime, decided while planning: its framework
    has no image of that variant, or its model no GPU version; None where it can."""
    return variant_unsupported(framework, variant) or (
        gpu_unsupported(framework, dataset) if gpu is not None else None)


def compiles_code(framework: str) -> bool:
    """Whether the framework compiles code at run time and loads it (its jobs then get
    an exec scratch directory, ``$DLBENCH_COMPILE_DIR``: their /tmp is noexec)."""
    return bool(models(framework).get("compiles_code"))


def check_frameworks(names: list[str]) -> list[str]:
    ready = available()
    for name in names:
        if name not in FRAMEWORKS:
            raise UsageError(f"unknown framework {name!r} (choose from {', '.join(FRAMEWORKS)})")
        if name not in ready:
            raise UsageError(f"framework {name!r} has no image yet (available: {', '.join(ready)})")
    return names


def check_datasets(names: list[str]) -> list[str]:
    for name in names:
        if name not in DATASETS:
            raise UsageError(f"unknown data set {name!r} (choose from {', '.join(DATASETS)})")
    return names
