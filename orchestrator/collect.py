"""Turn what a job left behind into one stored row.

The runner's result.json is untrusted input: size-capped, parsed as JSON,
validated field by field, never evaluated.  Whatever happened, exactly one
row comes out:

    ok           the runner's result, valid, and the container exited with 0
    failed       the runner reported a failure, or the container exited non-zero
                 (killed from outside: 137), or the host failed it (it could not be
                 started, its image could not be built, or its out/ went past its
                 bounds, ``jobdir.over_limit``); exit code and the last 50 log lines
    timeout      stopped by dlbench at the job's --timeout
    oom          killed by the kernel at the job's --memory limit (Docker's OOMKilled)
    unsupported  never started: the image cannot run the job (a GPU job on a CPU image)
    no_result    exited with 0, but result.json is missing, too big or invalid

An ok row also holds the migration check's figures: the ONNX model the runner exported,
run by the host (``migration.evaluate``, before the job is collected), or why there are none;
its FGSM images for transfer attacks (``transfer.taken``) are stored beside it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import signal
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
from pydantic import ValidationError

from dlbench_runner import contract

from . import __version__, fair, hostinfo, jobdir, rowcheck
from .migration import Migration
from .plan import Job
from .runtimes.base import Outcome
from .schema import (ARROW_SCHEMA, MAX_RESULT_BYTES, OPS_SCHEMA, ROBUSTNESS_SCHEMA, RunnerResult,
                     RunRecord, dumps)


def read_result(job_dir: Path) -> tuple[RunnerResult | None, str | None]:
    """The validated result the runner left in the job's out/, or None and why not.
    It is taken as hostile input (``jobdir.take_result``: no links followed, regular
    files only, size-capped) and copied beside out/ as the job's result.json."""
    data, problem = jobdir.take_result(job_dir, MAX_RESULT_BYTES)
    if data is None:
        return None, problem
    try:
        return RunnerResult.model_validate(json.loads(data)), None
    except (ValueError, ValidationError) as exc:
        first = str(exc).strip().splitlines()
        return None, "result.json is invalid: " + " ".join(first[:3])[:500]


def _job_fields(job: Job, run_id: str, job_id: str, provenance: dict) -> dict:
    """What the job was, and the host's provenance: the same on every row."""
    return dict(
        run_id=run_id, job_id=job_id, campaign=job.campaign,
        framework=job.framework, dataset=job.dataset, model=job.model, profile=job.profile,
        hyperparameters=dumps(job.hyperparameters), settings_from=job.settings_from,
        overrides=dumps(job.overrides),
        blas=job.blas, onednn=job.onednn,
        batch_size=job.hyperparameters.get("batch_size"),
        learning_rate=job.hyperparameters.get("learning_rate"),
        device=job.device, gpu=None if job.gpu is None else str(job.gpu), seed=job.seed,
        repeat=job.repeat, threads=job.threads, cpus=job.cpus,
        cpuset=job.cpuset,
        memory_limit_bytes=job.memory_bytes, timeout_s=job.timeout,
        dlbench_version=__version__, recorded_at=dt.datetime.now(dt.timezone.utc), **provenance)


def unsupported(job: Job, run_id: str, job_id: str, reason: str, provenance: dict) -> RunRecord:
    """The row of a job that was never started, and why."""
    return RunRecord(status="unsupported", error=reason, **_job_fields(job, run_id, job_id, provenance))


def failed(job: Job, run_id: str, job_id: str, error: str, provenance: dict) -> RunRecord:
    """The row of a job that could not be started: its image could not be built (``error``,
    the build's own words)."""
    return RunRecord(status="failed", error=error, **_job_fields(job, run_id, job_id, provenance))


class Collected(NamedTuple):
    """What a job leaves to store: its row, and those of an ok row's side tables."""

    record: RunRecord
    sides: dict[str, list[dict]] = {}   # side table folder -> rows (robustness, steps, ops)
    model: bytes | None = None      # the exported ONNX model
    transfer: bytes | None = None   # the FGSM images kept for transfer attacks (transfer.py)


def collect(job: Job, run_id: str, job_id: str, job_dir: Path, outcome: Outcome,
            provenance: dict, migration: Migration | None = None,
            transfer: bytes | None = None, data_root: Path | None = None,
            transfer_reason: str | None = None) -> Collected:
    """The job's row, its robustness rows, a fair job's step losses, its ONNX model and its
    FGSM images (those of an ok row only); ``migration``: what the host found of the model
    the job exported; ``transfer``: the images it kept (``transfer.taken``), or
    ``transfer_reason``, why the host did not take the file it left; ``data_root``:
    where the data sets are (a fair job's logits are checked on its test images)."""
    result, problem = read_result(job_dir)
    if result is not None and (untrue := _untrue(result)) is not None:
        result, problem = None, f"result.json is invalid: {untrue}"
    status, error = _status(outcome, result, problem)
    fields = _job_fields(job, run_id, job_id, provenance)
    fields.update(status=status, error=error, exit_code=outcome.exit_code,
                  log_tail="\n".join(outcome.log_tail) or None, wall_time_s=outcome.wall_time_s,
                  builds_alongside=outcome.builds_alongside)
    if outcome.trace is not None:
        fields.update(dataclasses.asdict(outcome.trace))
    if outcome.host_marks is not None:      # what else the host ran while the job did
        fields.update(hostinfo.beside(*outcome.host_marks, outcome.cpu_time_s,
                                      fields.get("host_load_max"), fields.get("host_cpus")))
    if result is not None:
        fields.update(_measured(result))
    if result is None or status != "ok":
        return Collected(RunRecord(**fields))
    sides = {"robustness": [r.model_dump() for r in result.robustness],
             "ops": [r.model_dump(by_alias=True) for r in result.ops]}
    if result.fair is not None and data_root is not None:
        found_fair, sides["steps"] = fair.checked(result.fair, job_dir, job.dataset, data_root, run_id)
        fields.update(found_fair)
    found = _migrated(result, migration)
    # the host's model is the one stored: a layer list's is built on the host
    fields.update(found.fields(), migration_model_bytes=(result.migration_model_bytes if found.model is None
                                                         else len(found.model)),
                  migration_time_s=result.migration_time_s, transfer_reason=transfer_reason)
    return Collected(RunRecord(**fields), sides, found.model, transfer)


def _measured(result: RunnerResult) -> dict:
    """The row's fields the runner measured and saw."""
    return dict(
        setup_time_s=result.setup_time_s, train_time_s=result.train_time_s,
        test_time_s=result.test_time_s, total_time_s=result.total_time_s,
        paper_train_time_s=result.paper_train_time_s,
        paper_test_time_s=result.paper_test_time_s,
        accuracy=result.accuracy, test_loss=result.test_loss,
        train_images_per_s=result.train_images_per_s,
        test_images_per_s=result.test_images_per_s,
        train_samples=result.train_samples, test_samples=result.test_samples,
        param_count=result.param_count, param_bytes=result.param_bytes,
        model_size_bytes=result.model_size_bytes,
        robustness_time_s=result.robustness_time_s,
        gradient_error=result.gradient_check.relative_error if result.gradient_check else None,
        epoch_loss=[e.loss for e in result.epochs],
        epoch_accuracy=[e.accuracy for e in result.epochs],
        epoch_time_s=[e.time_s or 0.0 for e in result.epochs],
        framework_version=result.framework_version, python_version=result.python_version,
        device_name=result.device_name,
        blas_loaded=";".join(contract.blas.loaded(result.blas)) or None,
        threads_env=dumps(result.threads.get("env")),
        threads_framework=dumps(result.threads.get("framework")),
        libraries=dumps(result.libraries),
        started_at=result.started_at, finished_at=result.finished_at)


def _untrue(result: RunnerResult) -> str | None:
    """Why a valid result cannot be true, by the rules every stored row keeps
    (``rowcheck``: a time of -inf or NaN, an epoch accuracy of 150 %, a negative count, a
    string past the cap), in the row and in its robustness and layer-time rows; None when
    it keeps them."""
    for rows, schema, rules, where in (
            ([_measured(result)], ARROW_SCHEMA, rowcheck.ROWS, ""),
            ([r.model_dump() for r in result.robustness], ROBUSTNESS_SCHEMA, rowcheck.ROBUSTNESS,
             "robustness: "),
            ([r.model_dump(by_alias=True) for r in result.ops], OPS_SCHEMA, rowcheck.OPS, "ops: ")):
        if not rows:
            continue
        table = pa.Table.from_pylist(rows, schema=pa.schema([field for field in schema
                                                             if field.name in rows[0]]))
        found = rowcheck.problems(table, rules)
        if found:
            return where + found[min(found)]
    return None


def _migrated(result: RunnerResult, migration: Migration | None) -> Migration:
    """The migration check of an ok result: the runner's reason where it exported nothing
    (nothing at all from a runner before the check), else what the host found, on the
    images the job tested on."""
    if result.migration_time_s is None or result.migration_reason is not None:
        return Migration(migration_reason=result.migration_reason)
    if migration is None:
        return Migration(migration_reason="the job left no ONNX model to check")
    if migration.migration_reason is None and migration.images != result.test_samples:
        return Migration(migration_reason=f"the framework predicted {migration.images} test images, "
                                          f"not the {result.test_samples} it tested",
                         model=migration.model, seconds=migration.seconds)
    return migration


def _exited(code: int | None, ran_as: str = "container") -> str:
    text = f"the {ran_as} exited with code {code}"
    if code is not None and code > 128:
        try:
            text += f" ({signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return text


def _status(outcome: Outcome, result: RunnerResult | None, problem: str | None):
    if outcome.timed_out:
        return "timeout", outcome.error or "the job ran past its time limit"
    if outcome.oom_killed:
        return "oom", "the container ran out of memory (killed by the kernel)"
    if outcome.error:       # the host's own reason: the container never ran, or broke its bounds
        return "failed", outcome.error
    if result is not None and result.status == "failed":
        return "failed", result.error
    if outcome.exit_code not in (0, None) and result is None:
        return "failed", outcome.error or _exited(outcome.exit_code, outcome.ran_as)
    if result is None:
        return "no_result", problem
    if outcome.exit_code != 0:
        return "failed", f"the {outcome.ran_as} exited with code {outcome.exit_code} after a result"
    return "ok", None
