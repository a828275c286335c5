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

An ok row also holds the after-training checks' share (``checks``: their columns, their
rows of the side tables, the files stored beside the row), from what the checks took of
the job once it had ended (``checks.take``, before it is collected).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
from pydantic import ValidationError

from dlbench_runner import contract

from . import __version__, checks, hostinfo, jobdir, rowcheck, store
from .plan import Job
from .runtimes.base import Outcome, exited
from .records import RunnerResult, RunRecord
from .schema import ARROW_SCHEMA, MAX_RESULT_BYTES, dumps


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
        blas=job.blas, onednn=job.onednn, workers=job.workers,
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
    """What a job leaves to store: its row, and an ok row's rows of the side tables and its
    files stored beside it."""

    record: RunRecord
    sides: dict[str, list[dict]] = {}   # side table folder -> rows (robustness, steps, ops)
    files: dict[str, bytes] = {}        # kind -> bytes: the ONNX model, the FGSM images


def collect(job: Job, run_id: str, job_id: str, job_dir: Path, outcome: Outcome,
            provenance: dict, after: checks.After | None = None, taken: list | None = None) -> Collected:
    """The job's row, and for an ok row the checks' share of it (``checks.found``, from
    ``taken``: what each check took of the job once it had ended, ``checks.take``; None:
    nothing); ``after``: the job as its checks see it (None: its directory alone, with no
    staged files and no data sets)."""
    result, problem = read_result(job_dir)
    found = None
    if result is not None and result.status == "ok":
        after = after or checks.After(job, run_id, job_dir, None, {})
        found = checks.found(after, result, taken)
    if result is not None and (untrue := _untrue(result, found)) is not None:
        result, found, problem = None, None, f"result.json is invalid: {untrue}"
    status, error = _status(outcome, result, problem)
    fields = _job_fields(job, run_id, job_id, provenance)
    fields.update(status=status, error=error, exit_code=outcome.exit_code,
                  log_tail="\n".join(outcome.log_tail) or None, wall_time_s=outcome.wall_time_s,
                  builds_alongside=outcome.builds_alongside, nodes=outcome.nodes)
    if outcome.trace is not None:
        fields.update(dataclasses.asdict(outcome.trace))
    if outcome.host_marks is not None:      # what else the host ran while the job did
        fields.update(hostinfo.beside(*outcome.host_marks, outcome.cpu_time_s,
                                      fields.get("host_load_max"), fields.get("host_cpus")))
    if result is not None:
        fields.update(_measured(result))
    if result is None or status != "ok" or found is None:
        return Collected(RunRecord(**fields))
    fields.update(found.fields)
    return Collected(RunRecord(**fields), found.sides, found.files)


def _measured(result: RunnerResult) -> dict:
    """The row's fields the runner measured and saw."""
    return dict(
        setup_time_s=result.setup_time_s, compile_time_s=result.compile_time_s,
        train_time_s=result.train_time_s,
        test_time_s=result.test_time_s, total_time_s=result.total_time_s,
        paper_train_time_s=result.paper_train_time_s,
        paper_test_time_s=result.paper_test_time_s,
        accuracy=result.accuracy, test_loss=result.test_loss,
        train_images_per_s=result.train_images_per_s,
        test_images_per_s=result.test_images_per_s,
        train_samples=result.train_samples, test_samples=result.test_samples,
        param_count=result.param_count, param_bytes=result.param_bytes,
        model_size_bytes=result.model_size_bytes,
        worker_batch_size=result.worker_batch_size, dist_engine=result.dist_engine,
        dist_backend=result.dist_backend, worker_train_time_s=result.worker_train_time_s or None,
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


def _untrue(result: RunnerResult, found: checks.Found | None) -> str | None:
    """Why a valid result cannot be true, by the rules every stored row keeps
    (``rowcheck``: a time of -inf or NaN, an epoch accuracy of 150 %, a negative count, a
    string past the cap), in the row's measured and checked columns and in the checks'
    rows of the side tables; None when it keeps them."""
    measured = dict(_measured(result), **(found.fields if found else {}))
    tables = [("", [measured], ARROW_SCHEMA, rowcheck.ROWS)]
    sides = {side.folder: side for side in store.RESULT_TABLES}     # their schemas and rules
    for folder, rows in (found.sides if found else {}).items():
        tables.append((f"{folder}: ", rows, sides[folder].schema, sides[folder].rules))
    for where, rows, schema, rules in tables:
        if not rows:
            continue
        table = pa.Table.from_pylist(rows, schema=pa.schema([field for field in schema
                                                             if field.name in rows[0]]))
        found_problems = rowcheck.problems(table, rules)
        if found_problems:
            return where + found_problems[min(found_problems)]
    return None


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
        return "failed", outcome.error or exited(outcome.exit_code, outcome.ran_as)
    if result is None:
        return "no_result", problem
    if outcome.exit_code != 0:
        return "failed", f"the {outcome.ran_as} exited with code {outcome.exit_code} after a result"
    return "ok", None
