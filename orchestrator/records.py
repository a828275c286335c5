"""The records pydantic validates: what the runner reports (``RunnerResult``, its
``result.json``: untrusted input, checked field by field) and the stored row
(``RunRecord``, made of the columns ``schema.COLUMNS`` declares), for the stages that make
rows (``collect``, the store's writers, ``dlbench recover``).
"""

from __future__ import annotations

import datetime as dt
import typing

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, create_model

from dlbench_runner.contract import SCHEMA_VERSION as RUNNER_SCHEMA_VERSION

from .schema import ATTACKS, COLUMNS, MAX_LOGGED_STEPS, MAX_PROBE_LOGITS


class Epoch(BaseModel):
    model_config = ConfigDict(extra="ignore")
    epoch: int
    loss: float
    accuracy: float
    time_s: float | None = None
    samples: int | None = None


class Robustness(BaseModel):
    """One attack at one epsilon on the runner's first ``images`` test images."""

    model_config = ConfigDict(extra="ignore")
    attack: typing.Literal[ATTACKS]
    epsilon: float = Field(ge=0.0, le=1.0)
    steps: int = Field(ge=0, le=10_000)
    images: int = Field(ge=0)
    accuracy: float | None = Field(None, ge=0.0, le=1.0)
    time_s: float | None = Field(None, ge=0.0)
    reason: str | None = Field(None, max_length=1_000)
    attack_loss: str | None = Field(None, max_length=1_000)
    vanished_gradients: int | None = Field(None, ge=0)


class GradientCheck(BaseModel):
    """The runner's finite-difference check of the input gradient (its figure only)."""

    model_config = ConfigDict(extra="ignore")
    relative_error: float = Field(ge=0.0)


class FairResult(BaseModel):
    """What a fair job adds: its starting point, its first logits and its step losses."""

    model_config = ConfigDict(extra="ignore")
    weights_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    logits: list[list[float]] = Field(max_length=MAX_PROBE_LOGITS)
    losses: list[float] = Field(max_length=MAX_LOGGED_STEPS)


class OpTime(BaseModel):
    """One layer's (or the whole network's, or the step's) time in one pass (``ops.py``)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    layer: str = Field(min_length=1, max_length=100)
    index: int = Field(ge=-1, le=1_000)
    kind: typing.Literal["conv", "pool", "relu", "linear", "network", "step"]
    pass_: typing.Literal["forward", "backward", "step"] = Field(alias="pass")
    shape: str = Field(max_length=100)
    output_shape: str = Field(max_length=100)
    flops: int | None = Field(None, ge=0)
    # a backward pass's is a difference of medians: a little below 0 where it costs nothing
    time_s: float = Field(allow_inf_nan=False)
    spread_s: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    repeats: int = Field(ge=1)


class RunnerResult(BaseModel):
    """The runner's result.json, validated field by field; extra keys are dropped."""

    model_config = ConfigDict(extra="ignore")
    schema_version: int = Field(ge=1, le=RUNNER_SCHEMA_VERSION)
    status: typing.Literal["ok", "failed"]
    error: str | None = Field(None, max_length=10_000)
    framework: str
    dataset: str
    model: str
    profile: str
    hyperparameters: dict[str, float | int | str | bool]
    device: str
    seed: int
    framework_version: str | None = None
    python_version: str | None = None
    device_name: str | None = None
    cpu_model: str | None = None
    blas: list[str] = []
    threads: dict = {}
    libraries: dict = {}
    setup_time_s: float | None = None
    compile_time_s: float | None = None
    train_time_s: float | None = None
    test_time_s: float | None = None
    total_time_s: float | None = None
    # the spans GTDLBench's method timed (older runners called them script_*)
    paper_train_time_s: float | None = Field(
        None, validation_alias=AliasChoices("paper_train_time_s", "script_train_time_s"))
    paper_test_time_s: float | None = Field(
        None, validation_alias=AliasChoices("paper_test_time_s", "script_test_time_s"))
    accuracy: float | None = Field(None, ge=0.0, le=1.0)
    test_loss: float | None = None
    train_samples: int | None = None
    test_samples: int | None = None
    train_images_per_s: float | None = None
    test_images_per_s: float | None = None
    param_count: int | None = None
    param_bytes: int | None = Field(None, ge=0)
    model_size_bytes: int | None = Field(None, ge=0)
    robustness: list[Robustness] = Field([], max_length=1_000)
    robustness_time_s: float | None = Field(None, ge=0.0)
    gradient_check: GradientCheck | None = None
    migration_reason: str | None = Field(None, max_length=1_000)
    migration_model_bytes: int | None = Field(None, ge=0)
    migration_time_s: float | None = Field(None, ge=0.0)
    # a job of several workers (``dlbench_runner/world.py``): worker 0's result
    workers: int | None = Field(None, ge=2, le=1_000)
    worker_batch_size: int | None = Field(None, ge=1)
    worker_train_time_s: list[float] = Field([], max_length=1_000)
    dist_engine: str | None = Field(None, max_length=100)
    dist_backend: str | None = Field(None, max_length=100)
    epochs: list[Epoch] = []
    fair: FairResult | None = None
    ops: list[OpTime] = Field([], max_length=1_000)
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None


RunRecord = create_model(
    "RunRecord", __doc__="One stored row: one job's outcome, its measurements, its checks', "
                         "host provenance.", **COLUMNS)
