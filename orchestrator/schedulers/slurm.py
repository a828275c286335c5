"""Campaigns on a Slurm cluster: one job array, one array task per job (one array for each
count of nodes the jobs need).

``submit`` checks what can be checked before anything is submitted (the Slurm
commands, the results directory, the job options through ``sbatch --test-only``),
builds or finds the images on this host, has the runtime export each target once
into the results directory (``Runtime.export``: the Docker runtime's ``docker save``),
writes the plan there as JSON and submits ONE ``sbatch --array`` job.  Each array
task runs ``dlbench run --plan-file FILE --plan-index I`` on its node (``run_task``):
the runtime loads the target there (``Runtime.load``: an image from its saved file if
the node's Docker lacks it, checked by image id; a host Python checked on the node),
then the very same ``run_plan`` runs the one job, as a local run does, and its row
records the node and the Slurm ids.

A job of N workers on a runtime whose workers can span nodes (``Runtime.spans_nodes``:
the native runtime) needs N nodes: such jobs go in an array of their own, each task
holding N nodes (``--nodes=N --ntasks-per-node=1``), and the task starts a worker on each
(``runtimes/native_workers.py``).  A container job's workers stay on the task's node.

The results directory must be on a file system the nodes share: the plan, the
saved images, the rows, traces and job directories all live there.

Slurm may end a task before it stores its row (node failure, ``scancel``, its
time limit, preemption).  ``reconcile`` asks ``sacct`` for the tasks of ended
arrays that left no row and stores one row for each (``STATUS_OF_STATE``), so
that ``--resume`` reruns exactly the jobs not stored as ok.  All Slurm
commands are run through ``subprocess``; nothing here schedules anything.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from pydantic import BaseModel

from .. import store
from ..errors import DlbenchError
from ..plan import Job, Plan
from ..prepare import prepare, resolve
from ..run import run_plan
from ..runtimes import Runtime, Target, make, native_workers
from .base import Executed

SLURM_DIR = "_slurm"
COMMANDS = ("sbatch", "squeue", "sacct", "scancel")
ACTIVE = {"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "REQUEUED",
          "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}
# What a task that Slurm ended without a row becomes (sacct's State, first word).
STATUS_OF_STATE = {"NODE_FAIL": "node_fail", "BOOT_FAIL": "node_fail",
                   "CANCELLED": "cancelled", "PREEMPTED": "cancelled", "REVOKED": "cancelled",
                   "TIMEOUT": "timeout", "DEADLINE": "timeout",
                   "OUT_OF_MEMORY": "oom"}       # anything else (FAILED, COMPLETED): failed
TIME_MARGIN_S = 120            # beyond a job's own timeout: image load, data check, row write
POLL_S = 2.0


class SlurmError(DlbenchError):
    pass


class SlurmOptions(BaseModel):
    """How the array is submitted (campaign table ``[slurm]``, or options)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    sbatch_options: list[str] = []     # extra sbatch options, given last (they win)


class Image(BaseModel):
    """A target the submitter resolved: an image (or a host Python), as the tasks get it."""

    tag: str
    id: str | None
    reason: str | None = None           # why its jobs cannot run (stored as unsupported)
    archive: str | None = None          # its export (docker save), relative to the results directory


class Task(BaseModel):
    job: Job
    job_id: str


class ArrayFile(BaseModel):
    """Everything a task needs to run its job on a node: the plan as a plain value."""

    version: int = 1
    submission: str
    campaign: str | None = None
    tasks: list[Task]
    images: dict[str, Image] = {}       # "framework:variant" -> the image the jobs run
    data_dir: str | None = None
    runtime: str = "docker"
    python: str | None = None
    nodes: int = 1                      # each task's nodes: a worker on each (see the module)
    array_id: str | None = None         # set once submitted
    submitted_at: dt.datetime | None = None


def _dir(results: Path) -> Path:
    return results / SLURM_DIR


def array_path(results: Path, array_id: str) -> Path:
    return _dir(results) / "arrays" / f"{array_id}.json"


def marker_path(results: Path, array_id: str, index: int) -> Path:
    return _dir(results) / "tasks" / array_id / f"{index}.json"


def _write_json(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    tmp.write_text(text)
    os.replace(tmp, path)


# -- the Slurm commands ----------------------------------------------------------------------
def _command(args: list[str], what: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise SlurmError(f"{what}: {args[0]} is not on PATH; is this a Slurm submit host?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{what}: {args[0]} did not answer within 120 s") from None
    if check and done.returncode != 0:
        raise SlurmError(f"{what}: {_slurm_message(done)}")
    return done


def _slurm_message(done: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (done.stderr or done.stdout or "").splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()] or lines
    if not errors:
        return f"exit code {done.returncode}"
    return re.sub(r"^\w+: (error: )?", "", errors[-1])


def check_commands() -> None:
    for name in COMMANDS:
        if shutil.which(name) is None:
            raise SlurmError(f"--scheduler slurm: {name} is not on PATH; "
                             "run from a Slurm submit host (or put Slurm's commands on PATH)")


def check_results(results: Path) -> None:
    """The tasks write rows there: refuse a directory that cannot be written."""
    probe = _dir(results) / f".probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text("dlbench")
        probe.unlink()
    except OSError as exc:
        raise SlurmError(f"results directory {results} cannot be written ({exc.strerror}); the "
                         "nodes write their rows there: give a writable directory the nodes "
                         "share") from None


def nodes_needed(job: Job, runtime: Runtime) -> int:
    """The nodes a task of ``job`` holds: one a worker where the runtime spreads them."""
    return job.workers if job.workers and getattr(runtime, "spans_nodes", False) else 1


def sbatch_args(tasks: list[Task], options: SlurmOptions, results: Path, name: str,
                nodes: int = 1) -> list[str]:
    jobs = [t.job for t in tasks]
    args = ["sbatch", "--parsable", f"--array=0-{len(tasks) - 1}", f"--job-name={name}",
            f"--output={_dir(results).resolve()}/logs/%A_%a.out", "--open-mode=append",
            f"--chdir={results.resolve()}"]
    if nodes > 1:                                    # a worker on each (one task a node)
        args += [f"--nodes={nodes}", "--ntasks-per-node=1"]
    cpus = {j.cpus for j in jobs}
    if cpus == {None}:
        args.append("--exclusive")                   # one job per node, nothing else on it
    else:                                            # a job's CPUs, split among its nodes
        args.append(f"--cpus-per-task={max(math.ceil((c or 1) / nodes) for c in cpus)}")
    if any(j.gpu is not None for j in jobs):
        args.append("--gres=gpu:1")
    timeouts = [j.timeout for j in jobs]
    if timeouts and all(t is not None for t in timeouts):
        args.append(f"--time={math.ceil((max(timeouts) + TIME_MARGIN_S) / 60)}")
    for key in ("partition", "account", "qos"):
        value = getattr(options, key)
        if value:
            args.append(f"--{key}={value}")
    return args + list(options.sbatch_options)


def _script(plan_file: Path, results: Path) -> str:
    python = sys.executable
    return ("#!/bin/sh\n# one dlbench job of the array: the same run_plan as a local run\n"
            f"exec {_quote(python)} -m orchestrator run --results {_quote(str(results.resolve()))} "
            f"--plan-file {_quote(str(plan_file.resolve()))} --plan-index \"$SLURM_ARRAY_TASK_ID\"\n")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def queue(array_id: str) -> dict[int, tuple[str, str]]:
    """The array's tasks still in the queue: index -> (state, node)."""
    done = _command(["squeue", "-h", "-r", "-j", array_id, "-o", "%K|%T|%N"],
                    f"squeue for array {array_id}", check=False)
    tasks = {}
    for line in done.stdout.splitlines():
        index, _, rest = line.strip().partition("|")
        state, _, node = rest.partition("|")
        if index.isdigit() and state in ACTIVE:
            tasks[int(index)] = (state, node)
    return tasks


def accounting(array_id: str, raw_ids: dict[str, int]) -> dict[int, tuple[str, str, str]]:
    """sacct's record of the array's tasks: index -> (state, node, exit code).

    With a Slurm database, ``sacct -j ARRAY``; a cluster without one but with
    ``JobCompType=jobcomp/filetxt`` answers ``sacct --completion``, whose records
    name only each task's own job id (``raw_ids``: job id -> index, from the
    tasks' start markers)."""
    fields = "JobID,JobIDRaw,State,NodeList,ExitCode"
    done = _command(["sacct", "-j", array_id, "-X", "-P", "-n", "-o", fields],
                    f"sacct for array {array_id}", check=False)
    found: dict[int, tuple[str, str, str]] = {}
    if done.returncode == 0:
        for line in done.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 5 or not parts[0].startswith(f"{array_id}_"):
                continue
            for index in _indices(parts[0][len(array_id) + 1:]):
                found[index] = (parts[2], parts[3], parts[4])
        return found
    if "accounting storage is disabled" not in (done.stderr + done.stdout).lower():
        raise SlurmError(f"sacct for array {array_id}: {_slurm_message(done)}")
    done = _command(["sacct", "--completion", "-X", "-P", "-n", "-o", "JobIDRaw,State,NodeList,ExitCode"],
                    f"sacct --completion for array {array_id}", check=False)
    for line in done.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0] in raw_ids:
            found[raw_ids[parts[0]]] = (parts[1], parts[2], parts[3])
    return found


def _indices(text: str) -> list[int]:
    """``3``, or a pending range as sacct prints it: ``[3-5,7%2]``."""
    text = text.strip("[]").split("%")[0]
    out = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if low.isdigit():
            out.extend(range(int(low), int(high or low) + 1))
    return out


# -- submitting ------------------------------------------------------------------------------
def submit(plan: Plan, results: Path, options: SlurmOptions, runtime: Runtime, data_dir=None,
           display=None, resume: bool = False) -> list[ArrayFile]:
    """Submit the plan as job arrays, one for each count of nodes its jobs need (one array
    where none spans nodes); returns their files, submitted, or [] when nothing is left
    to run.  ``runtime``: the runtime the caller made, whose targets (images, or a host
    Python) the tasks run."""
    from ..display import NullDisplay

    display = display or NullDisplay()
    check_commands()
    if not resume:      # the data checked before anything is written (resume's folder exists)
        ready = prepare(plan, results, data_dir, display, resume)
    check_results(results)
    if resume:
        active = [a for a in arrays(results) if a.array_id and queue(a.array_id)]
        if active:
            raise SlurmError(f"array {active[0].array_id} of {results} is still queued or running; "
                             f"wait for it (dlbench status) or scancel it before --resume")
        for array in arrays(results):
            reconcile(results, array)
        ready = prepare(plan, results, data_dir, display, resume)    # the rows stored as ok by now
    submission = uuid.uuid4().hex[:12]
    name = f"dlbench-{plan.campaign or 'run'}"
    (_dir(results) / "logs").mkdir(parents=True, exist_ok=True)
    by_nodes: dict[int, list[Job]] = {}
    for job in plan.jobs:
        by_nodes.setdefault(nodes_needed(job, runtime), []).append(job)
    for nodes, jobs in sorted(by_nodes.items()):    # the partition, account, qos, options and
        probe = [Task(job=j, job_id="0" * 16) for j in jobs]        # nodes, checked by Slurm;
        _command(sbatch_args(probe, options, results, name, nodes)  # nothing submitted
                 + ["--test-only", "--wrap=true"], "sbatch", check=True)
    targets = resolve(plan, runtime)        # every image before the array is submitted
    todo = ready.todo(plan.jobs, targets, display)
    if not todo:
        return []
    images = {f"{fw}:{variant}": Image(tag=target.name, id=target.id, reason=target.reason)
              for (fw, variant), target in targets.items()}
    for (fw, variant), target in targets.items():       # each target a task runs, for the nodes
        if target.reason is None and any((fw, variant) in j.images for j, _ in todo):
            archive = runtime.export(target, _dir(results) / "images", display.say)
            if archive is not None:
                images[f"{fw}:{variant}"].archive = str(archive.relative_to(results))
    groups: dict[int, list[Task]] = {}
    for job, job_id in todo:
        groups.setdefault(nodes_needed(job, runtime), []).append(Task(job=job, job_id=job_id))
    submitted = []
    for nodes, tasks in sorted(groups.items()):
        array = ArrayFile(submission=submission, campaign=plan.campaign, tasks=tasks, images=images,
                          data_dir=str(Path(data_dir).resolve()) if data_dir else None,
                          runtime=runtime.name, python=getattr(runtime, "python", None), nodes=nodes)
        suffix = "" if nodes == 1 else f"-{nodes}-nodes"
        plan_file = _dir(results) / "plans" / f"{submission}{suffix}.json"
        _write_json(plan_file, array.model_dump_json(indent=1))
        args = sbatch_args(tasks, options, results, name, nodes)
        try:
            done = subprocess.run(args, input=_script(plan_file, results), capture_output=True,
                                  text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"sbatch: {exc}") from None
        if done.returncode != 0:
            raise SlurmError(f"sbatch: {_slurm_message(done)}")
        array.array_id = done.stdout.strip().split(";")[0]
        array.submitted_at = dt.datetime.now(dt.timezone.utc)
        _write_json(array_path(results, array.array_id), array.model_dump_json(indent=1))
        submitted.append(array)
    return submitted


# -- a task, on its node ---------------------------------------------------------------------
def task_fields() -> dict:
    """The node and Slurm ids, as the task's environment gives them."""
    env = os.environ
    return {"node": env.get("SLURMD_NODENAME"),
            "slurm_job_id": env.get("SLURM_ARRAY_JOB_ID") or env.get("SLURM_JOB_ID"),
            "slurm_array_task_id": int(env["SLURM_ARRAY_TASK_ID"])
            if env.get("SLURM_ARRAY_TASK_ID", "").isdigit() else None}


def run_task(plan_file: Path, index: int, results: Path, display=None) -> list:
    """Run one job of an array's plan on this node, exactly as a local run does, on the
    target its submitter resolved (an image: loaded here when the node lacks it)."""
    try:
        array = ArrayFile.model_validate_json(plan_file.read_text())
    except (OSError, ValueError) as exc:
        raise SlurmError(f"cannot read the array's plan {plan_file}: {exc}") from None
    if not 0 <= index < len(array.tasks):
        raise SlurmError(f"--plan-index {index}: the plan has {len(array.tasks)} job(s)")
    fields = task_fields()
    if fields["slurm_job_id"]:
        _write_json(marker_path(results, fields["slurm_job_id"], index), json.dumps(
            {"job_id": os.environ.get("SLURM_JOB_ID"), "node": fields["node"],
             "started_at": dt.datetime.now(dt.timezone.utc).isoformat()}))
    task = array.tasks[index]
    runtime = make(array.runtime, array.python, display or _Quiet())
    if array.nodes > 1:             # the task's nodes, a worker on each
        runtime.allocation = native_workers.Allocation.from_environment()
    if os.environ.get("SLURM_JOB_GPUS"):        # a GPU job: the GPU Slurm gave it, not GPU N
        runtime.gpus = os.environ["SLURM_JOB_GPUS"].split(",")
    # The node runs this one job: its CPUs are the ones Slurm gave the task, never a
    # side-by-side share of a single host's (``plan.share_cpus``).
    one = Plan(jobs=[task.job.model_copy(update={"first_cpu": 0})], campaign=array.campaign)
    say = display.say if display else print
    targets = {}                    # the submitter's, as this node's (an image: loaded here)
    for framework, variant in one.images:
        image = array.images[f"{framework}:{variant}"]
        targets[framework, variant] = runtime.load(
            framework, variant, Target(image.tag, image.id, image.reason),
            results / image.archive if image.archive else None, say)
    return run_plan(one, results, runtime, array.data_dir, display=display, row_fields=fields,
                    targets=targets)


class _Quiet:
    def say(self, text):
        pass


# -- following, reconciling, status ----------------------------------------------------------
def arrays(results: Path) -> list[ArrayFile]:
    folder = _dir(results) / "arrays"
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            found.append(ArrayFile.model_validate_json(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda a: a.submitted_at or dt.datetime.min.replace(tzinfo=dt.timezone.utc))


def rows_of(results: Path, array_id: str):
    if not results.is_dir():
        return None
    frame = store.load(results)
    if "slurm_job_id" not in frame.columns or frame.empty:
        return frame.iloc[0:0]
    return frame[frame["slurm_job_id"] == array_id]


def follow(results: Path, array: ArrayFile, say) -> None:
    """Show rows as they land and the queue's state, until the array has left the queue."""
    seen: set[str] = set()
    last = None
    while True:
        tasks = queue(array.array_id)
        rows = rows_of(results, array.array_id)
        for _, row in rows.iterrows():
            if row["run_id"] not in seen:
                seen.add(row["run_id"])
                accuracy = "" if row["accuracy"] != row["accuracy"] or row["accuracy"] is None \
                    else f" accuracy {row['accuracy']:.4f}"
                say(f"task {row['slurm_array_task_id']}: {row['framework']}/{row['dataset']} "
                    f"{row['status']}{accuracy} on {row['node']}")
        states = {}
        for state, node in tasks.values():
            states[state.lower()] = states.get(state.lower(), 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        line = f"array {array.array_id}: {len(seen)}/{len(array.tasks)} stored" + \
            (f"; queue: {summary}" if summary else "")
        if line != last:
            say(line)
            last = line
        if not tasks:
            return
        time.sleep(POLL_S)


def reconcile(results: Path, array: ArrayFile, attempts: int = 5) -> list:
    """Store one row for each task of an ended array that left none, from sacct."""
    from ..collect import unsupported

    if not array.array_id or queue(array.array_id):
        return []
    rows = rows_of(results, array.array_id)
    stored = set(int(i) for i in rows["slurm_array_task_id"].dropna()) if rows is not None else set()
    missing = [i for i in range(len(array.tasks)) if i not in stored]
    if not missing:
        return []
    markers = {}
    for index in missing:
        path = marker_path(results, array.array_id, index)
        if path.exists():
            try:
                markers[index] = json.loads(path.read_text())
            except (OSError, ValueError):
                pass
    raw_ids = {str(m.get("job_id")): i for i, m in markers.items() if m.get("job_id")}
    for attempt in range(attempts):      # a Slurm database may record an end a moment late
        known = accounting(array.array_id, raw_ids)
        if all(i in known or i not in markers for i in missing):
            break
        time.sleep(1.0)
    records = []
    for index in missing:
        task = array.tasks[index]
        state, node, exit_code = known.get(index, ("", "", ""))
        word = state.split()[0] if state else ""
        if word in ("RUNNING", "PENDING"):
            continue
        status = STATUS_OF_STATE.get(word, "failed")
        if not word:
            status = "cancelled" if index not in markers else "failed"
            why = ("Slurm ended the task before it started and kept no record of it"
                   if index not in markers else "the task ended without a row and Slurm has no record of it")
        else:
            why = f"Slurm ended the task: {state} (exit code {exit_code})"
        node = node or (markers.get(index) or {}).get("node") or None
        log = _dir(results) / "logs" / f"{array.array_id}_{index}.out"
        image = array.images.get(f"{task.job.framework}:{task.job.variant}")
        run_id = hashlib.sha256(f"slurm:{array.array_id}_{index}".encode()).hexdigest()[:16]
        provenance = {"runtime": array.runtime, "image": image.tag if image else None,
                      "image_id": image.id if image else None, "node": node,
                      "slurm_job_id": array.array_id, "slurm_array_task_id": index}
        record = unsupported(task.job, run_id, task.job_id, f"{why}; no row stored; log: {log}",
                             provenance).model_copy(update={"status": status})
        store.append(results, [record])
        records.append(record)
    return records


def status(results: Path) -> list[dict]:
    """Each array of the results directory, its tasks counted by state."""
    out = []
    for array in arrays(results):
        tasks = queue(array.array_id) if array.array_id else {}
        if not tasks:
            reconcile(results, array)
        rows = rows_of(results, array.array_id)
        by_task = {}
        if rows is not None:
            for _, row in rows.iterrows():
                by_task[int(row["slurm_array_task_id"])] = row["status"]
        counts: dict[str, int] = {}
        for index in range(len(array.tasks)):
            if index in tasks:
                state = tasks[index][0].lower()
            elif index in by_task:
                state = "stored ok" if by_task[index] == "ok" else by_task[index]
            else:
                state = "ended, no row yet"
            counts[state] = counts.get(state, 0) + 1
        out.append({"array": array.array_id, "campaign": array.campaign,
                    "jobs": len(array.tasks), "states": counts,
                    "submitted_at": array.submitted_at})
    return out


def run_array(plan: Plan, results: Path, options: SlurmOptions, runtime: Runtime, detach: bool,
              say, display, **kwargs) -> tuple[str | None, list | None]:
    """``dlbench run --scheduler slurm``: submit the plan as job arrays, then follow them
    until they end and store a row for every task Slurm ended without one; returns (the
    array ids, comma-separated, and their rows), the rows None when detached, (None, None)
    when nothing is left to run."""
    submitted = submit(plan, results, options, runtime, display=display, **kwargs)
    if not submitted:
        return None, None
    for array in submitted:
        nodes = "" if array.nodes == 1 else f", each on {array.nodes} nodes"
        say(f"submitted {len(array.tasks)} job(s) as Slurm array {array.array_id}{nodes}; "
            f"results in {results}")
    ids = ",".join(array.array_id for array in submitted)
    if detach:
        return ids, None
    records = []
    for array in submitted:
        follow(results, array, say)
        reconcile(results, array)
        records += list(rows_of(results, array.array_id).itertuples())
    return ids, records


class SlurmScheduler:
    """``--scheduler slurm``: the plan as one job array (``run_array``), submitted with the
    options given on the command line (``request.slurm``) laid over the campaign file's
    ``[slurm]`` table."""

    name = "slurm"

    def check(self, plan: Plan) -> None:
        pass        # a task runs on the GPU Slurm gives it; Slurm's commands are checked as it submits

    def run(self, campaign, results, runtime, request, display, say) -> Executed:
        given, table = request.slurm, campaign.slurm
        options = SlurmOptions(
            partition=given.partition or table.partition, account=given.account or table.account,
            qos=given.qos or table.qos, sbatch_options=[*table.sbatch_options, *given.sbatch_options])
        array_id, records = run_array(
            campaign.plan, results, options, runtime, given.detach, say, display,
            data_dir=request.data_dir, resume=request.resume)
        return Executed(results, records, array_id)
