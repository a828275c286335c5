"""The plan: the options expanded into a plain list of jobs, without touching Docker."""

from __future__ import annotations

import hashlib
import json
import os

from pydantic import BaseModel, ConfigDict

from dlbench_runner import spec as runner_spec

from . import catalog
from .errors import UsageError


class Job(BaseModel):
    """One container run: everything that defines what is measured."""

    model_config = ConfigDict(frozen=True)
    framework: str
    dataset: str
    model: str
    profile: str
    hyperparameters: dict
    overrides: dict = {}
    threads: int
    cpus: int | None = None        # CPU limit (and cpuset 0..cpus-1); None: no limit
    gpu: int | None = None
    seed: int = 1
    repeat: int = 0

    @property
    def device(self) -> str:
        return "cpu" if self.gpu is None else "cuda"

    @property
    def label(self) -> str:
        return f"{self.framework}/{self.dataset}/{self.profile}"

    def job_id(self, image_id: str | None, dataset_sha256: str | None) -> str:
        """Stable identity: the same definition on the same image and data, the same id."""
        defining = self.model_dump(exclude={"overrides"})
        defining.update(image_id=image_id, dataset_sha256=dataset_sha256)
        blob = json.dumps(defining, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def spec(self, run_id: str, job_id: str) -> dict:
        """The job spec the runner reads."""
        return {"framework": self.framework, "dataset": self.dataset, "profile": self.profile,
                "overrides": self.overrides, "threads": self.threads, "device": self.device,
                "seed": self.seed, "run_id": run_id, "job_id": job_id}


class Plan(BaseModel):
    jobs: list[Job]
    skipped: list[str] = []

    @property
    def frameworks(self) -> list[str]:
        return list(dict.fromkeys(j.framework for j in self.jobs))

    @property
    def datasets(self) -> list[str]:
        return list(dict.fromkeys(j.dataset for j in self.jobs))


def parse_overrides(items: list[str]) -> dict:
    """KEY=VALUE pairs; values are read as JSON where they parse (numbers, booleans)."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--set takes KEY=VALUE, not {item!r}")
        try:
            overrides[key.strip()] = json.loads(value)
        except ValueError:
            overrides[key.strip()] = value
    return overrides


def make_plan(frameworks: list[str] | None = None, datasets: list[str] | None = None,
              profile: str = "paper", cpus: int | None = None, gpu: int | None = None,
              overrides: dict | None = None, repeats: int = 1, seed: int = 1,
              host_cpus: int | None = None) -> Plan:
    host_cpus = host_cpus or os.cpu_count() or 1
    frameworks = catalog.check_frameworks(frameworks) if frameworks else catalog.available()
    explicit_datasets = bool(datasets)
    datasets = catalog.check_datasets(datasets) if datasets else list(catalog.DATASETS)
    if profile not in catalog.PROFILES:
        raise UsageError(f"unknown profile {profile!r} (choose from {', '.join(catalog.PROFILES)})")
    if cpus is not None and not 1 <= cpus <= host_cpus:
        raise UsageError(f"--cpus {cpus}: this host has {host_cpus} CPUs")
    if gpu is not None and gpu < 0:
        raise UsageError(f"--gpu {gpu}: a GPU index is 0 or more")
    if repeats < 1:
        raise UsageError("--repeats must be at least 1")
    jobs, skipped = [], []
    for framework in frameworks:
        models = catalog.models(framework)
        for dataset in datasets:
            if dataset not in models["models"]:
                skipped.append(f"{framework} has no {dataset} model")
                continue
            try:
                params = runner_spec.resolve_hyperparameters(models, dataset, profile, overrides)
            except runner_spec.SpecError as exc:
                raise UsageError(str(exc)) from None
            for repeat in range(repeats):
                jobs.append(Job(framework=framework, dataset=dataset,
                                model=models["models"][dataset]["model"], profile=profile,
                                hyperparameters=params, overrides=overrides or {},
                                threads=cpus or host_cpus, cpus=cpus, gpu=gpu,
                                seed=seed + repeat, repeat=repeat))
    if not jobs:
        raise UsageError("nothing to run: " + "; ".join(skipped) if skipped else "nothing to run")
    if explicit_datasets and skipped:
        raise UsageError("; ".join(skipped))
    return Plan(jobs=jobs, skipped=skipped)
