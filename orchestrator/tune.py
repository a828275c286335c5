"""``dlbench tune``: how should a framework be run here?  The fastest training of one
framework's model on one data set that keeps its accuracy, found by search (the DLaaS
study's finding that configuring the compute libraries and tuning hyper-parameters
improves time and accuracy).

The space, any part of it (``--space``): the BLAS library (where the image holds
several), the CPU count, the batch size (1/4 to 4 times the default), the learning rate
(1/10 to 10 times, log-uniform) and the length of training (1/4 to all of the default).
Optuna searches it: TPE with the accuracy floor as a constraint, or every point of a
grid where the space is of choices only and the trials cover it.  The first trial is the
framework's default; the floor is its accuracy less ``--floor`` points (or an accuracy
given, ``--min-accuracy``).

Every trial is an ordinary job run through ``execute`` (its row stored, campaign
``tune:<study>``), so nothing is measured outside the store; ``--parallel N`` asks N at a
time and runs them as one plan (with ``--scheduler slurm``, one job array).  The study
(Optuna's sampler memory and each trial's run id) is kept in Optuna's journal file beside
the rows, ``RESULTS/tune/<study>.journal``, or in a database (``--storage``).  A study
stopped by Ctrl-C keeps its finished trials; the one that was running is marked failed
and not counted, and ``--resume`` asks for the rest.

One process at a time owns a study: it holds a lock while it runs trials (beside the
journal, ``RESULTS/tune/<study>.owner``; for a database, on this machine), and another
``dlbench tune`` on the same study is one line naming the process that has it, changing
nothing.  Each trial records its owner (``owners``): a trial found still running is failed
only when its owner is gone.  The journal is read through before Optuna reads it, so that a
damaged one (cut short, overwritten) is one line saying what to do, not a traceback.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path

from dlbench_runner import contract

from . import axes as axes_, catalog, execute, owners
from . import store
from .campaign import Campaign, joined
from .errors import DlbenchError, StoreError, UsageError
from .options import Axes, PlanError, RunOptions, check_name
from .plan import expand, scaled

# The compute settings that tune searches (axes.AXES, ``search``: the values each framework
# offers), the CPU count, and the hyper-parameters every model declares (``settings``).
SEARCHED = [axis for axis in axes_.settings() if axis.search]
SPACE = (*(axis.name for axis in SEARCHED), "threads", "batch_size", "learning_rate", "length",
         "omp_threads")
# What a study searches unless --space names its axes: OpenMP's own thread count only when
# asked for (it matters where a framework's OpenMP threads call a threaded BLAS: Lua Torch7).
DEFAULT_SPACE = (*(axis.name for axis in SEARCHED if axis.search == "default"), "threads",
                 "batch_size", "learning_rate", "length")
BATCH_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
LENGTH_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
LEARNING_RATE_FACTOR = 10.0
JOURNAL_DIR = "tune"
MAX_JOURNAL_LINE = 16 << 20     # bytes: an entry of Optuna's journal is a short JSON object
TOP = 5
_SETTINGS = [axis.name for axis in SEARCHED]


@dataclasses.dataclass(frozen=True)
class TuneRequest:
    framework: str
    dataset: str
    profile: str = contract.QUICK_PROFILE
    trials: int = 12
    space: tuple[str, ...] | None = None        # None: DEFAULT_SPACE's axes the framework has
    floor_points: float = 0.5
    min_accuracy: float | None = None           # percent; replaces the floor from the default
    study: str | None = None
    storage: str | None = None                  # an Optuna RDB URL; None: the journal file
    resume: bool = False
    parallel: int = 1
    seed: int = 0                               # the sampler's
    fixed: dict = dataclasses.field(default_factory=dict)   # --set: every trial's, the default's too
    run: execute.Request = execute.Request()    # results, data, build, runtime, scheduler


@dataclasses.dataclass
class Trial:
    number: int
    params: dict
    default: bool
    state: str                                  # COMPLETE, FAIL
    train_time_s: float | None
    accuracy: float | None
    feasible: bool
    run_id: str | None
    reason: str | None


@dataclasses.dataclass
class Outcome:
    study: str
    storage: str
    floor: float | None                         # accuracy, 0..1
    trials: list[Trial]
    importances: dict[str, float]
    importance_note: str | None

    @property
    def default(self) -> Trial | None:
        return next((t for t in self.trials if t.default and t.state == "COMPLETE"), None)

    @property
    def best(self) -> list[Trial]:
        """The feasible finished trials, fastest first."""
        done = [t for t in self.trials if t.state == "COMPLETE" and t.feasible]
        return sorted(done, key=lambda t: t.train_time_s)


# -- the space -------------------------------------------------------------------------------
def space_of(request: TuneRequest, host_cpus: int) -> dict:
    """The axes searched and their ranges, checked: a space with no axis free is an error."""
    framework, dataset = request.framework, request.dataset
    catalog.check_frameworks([framework])
    catalog.check_datasets([dataset])
    entry = catalog.models(framework)["models"].get(dataset)
    if entry is None:
        raise UsageError(f"{framework} has no {dataset} model")
    if request.trials < 1:
        raise UsageError(f"--trials {request.trials}: at least 1 (the default is the first)")
    if not 0 <= request.floor_points <= 100:
        raise UsageError(f"--floor {request.floor_points:g}: points below the default's accuracy, "
                         "0 to 100")
    if request.min_accuracy is not None and not 0 < request.min_accuracy <= 100:
        raise UsageError(f"--min-accuracy {request.min_accuracy:g}: an accuracy is more than 0 "
                         "and at most 100 %")
    if request.parallel < 1:
        raise UsageError(f"--parallel {request.parallel}: at least 1")
    asked = request.space or DEFAULT_SPACE
    if unknown := [a for a in asked if a not in SPACE]:
        raise UsageError(f"--space {unknown[0]!r}: choose from {', '.join(SPACE)}")
    params = _defaults(framework, dataset, request.profile)
    if clash := sorted(set(request.fixed) & _searched_keys(entry, asked)):
        raise UsageError(f"--set {clash[0]}: the search sets it (--space); leave it out of one")
    free = {}
    for axis in asked:
        if axis in _SETTINGS:
            if len(catalog.offered(framework, axis)) > 1:
                free[axis] = catalog.offered(framework, axis)
        elif axis == "threads" and host_cpus > 1:
            free[axis] = list(range(1, host_cpus + 1))
        elif axis == "omp_threads" and host_cpus > 1:     # 0: the job's threads
            free[axis] = list(range(host_cpus + 1))
        elif axis == "batch_size":
            free[axis] = sorted({max(1, round(params["batch_size"] * f)) for f in BATCH_FACTORS})
        elif axis == "learning_rate":
            rate = params[entry["settings"]["learning_rate"][0]]
            free[axis] = (rate / LEARNING_RATE_FACTOR, rate * LEARNING_RATE_FACTOR)
        elif axis == "length":
            free[axis] = list(LENGTH_FRACTIONS)
    if not free:
        why = {"blas": f"{framework} cannot switch BLAS libraries",
               "threads": f"this host has {host_cpus} CPU",
               "omp_threads": f"this host has {host_cpus} CPU"}
        why.update({a: f"{framework} offers one {a} at most" for a in _SETTINGS if a not in why})
        raise UsageError(f"--space {','.join(asked)}: no axis is free to search ("
                         + "; ".join(why.get(a, a) for a in asked) + ")")
    return free


def _searched_keys(entry: dict, asked) -> set[str]:
    keys = {k for k in ("batch_size", "omp_threads") if k in asked}
    keys |= set(entry["settings"]["learning_rate"]) if "learning_rate" in asked else set()
    return keys | (set(entry["settings"]["length"]) if "length" in asked else set())


def _defaults(framework: str, dataset: str, profile: str) -> dict:
    return contract.resolve_hyperparameters(catalog.models(framework), dataset, profile)


def default_point(request: TuneRequest, space: dict, host_cpus: int) -> dict:
    """The framework's default, as a point of the space."""
    entry = catalog.models(request.framework)["models"][request.dataset]
    params = _defaults(request.framework, request.dataset, request.profile)
    point = {**{axis: catalog.offered(request.framework, axis)[:1] or [None] for axis in _SETTINGS},
             "threads": [host_cpus], "batch_size": [params["batch_size"]],
             "learning_rate": [params[entry["settings"]["learning_rate"][0]]], "length": [1.0],
             "omp_threads": [params["omp_threads"]]}
    return {axis: point[axis][0] for axis in space}


def axes_of(request: TuneRequest, point: dict, campaign: str, host_cpus: int) -> Axes:
    """The one-job matrix of a point: its threads and compute settings (BLAS), its
    hyper-parameters (the learning rate and the length scaled as the model declares them:
    ``settings``)."""
    entry = catalog.models(request.framework)["models"][request.dataset]
    params = _defaults(request.framework, request.dataset, request.profile)
    overrides = dict(request.fixed)
    for key in ("batch_size", "omp_threads"):
        if key in point:
            overrides[key] = int(point[key])
    if "learning_rate" in point:
        overrides.update(scaled(entry["settings"]["learning_rate"], params, float(point["learning_rate"]),
                                whole=False))
    if "length" in point:
        keys = entry["settings"]["length"]
        overrides.update(scaled(keys, params, max(1, round(params[keys[0]] * point["length"])), whole=True))
    return Axes(campaign=campaign, frameworks=[request.framework], datasets=[request.dataset],
                profiles=[request.profile], threads=[int(point.get("threads", host_cpus))],
                hyperparameters={k: [v] for k, v in overrides.items()},
                **{axis: [point.get(axis)] for axis in _SETTINGS})


# -- the study -------------------------------------------------------------------------------
def study_name(request: TuneRequest) -> str:
    name = request.study or f"{request.framework}-{request.dataset}-{request.profile}"
    try:
        return check_name(name)
    except UsageError as exc:
        raise UsageError(f"--study {name!r}: {str(exc).split(': ', 1)[-1]}") from None


def storage_of(request: TuneRequest, results: Path, name: str):
    """(Optuna's storage, where it is in words): the journal file beside the rows, or the
    database ``--storage`` names."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    if request.storage:
        return request.storage, _without_password(request.storage)
    path = journal_path(results, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(str(path))), str(path)


def journal_path(results: Path, name: str) -> Path:
    return results / JOURNAL_DIR / f"{name}.journal"


def own_study(request: TuneRequest, results: Path, name: str) -> owners.Hold:
    """This process's claim on the study, held while it makes, resumes and runs it; a
    second process on the same study is one line naming the process that has it, before
    anything is read or written.  A journal's lock is beside it; a database's is in this
    machine's owners folder, named by the database and the study (processes on other
    machines sharing a database are Optuna's to keep apart)."""
    if request.storage:
        key = hashlib.sha256(f"{request.storage}\0{name}".encode()).hexdigest()[:32]
        folder, where = owners.owners_dir(), _without_password(request.storage)
        path = folder / f"study-{key}.owner"
    else:
        folder = results / JOURNAL_DIR
        path, where = folder / f"{name}.owner", str(journal_path(results, name))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return owners.Hold(path)
    except owners.Held as exc:
        pid, _, host = exc.holder.partition(" ")
        who = f"process {pid} on {host}" if pid.isdigit() and host else "another process"
        raise DlbenchError(f"study {name} ({where}) is in use by {who}: wait for it to end or stop "
                           "it (nothing was changed), or --study NAME starts another") from None


def check_journal(path: Path) -> None:
    """A ``StoreError`` (one line, what to do) where the journal is not one Optuna can
    read: not a regular file, a line that is not an entry (binary, overwritten), or a last
    entry cut short.  Optuna would raise on the first, and on the last skip the cut entry
    and append its next one to it, damaging the journal for good."""
    import stat
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"{path}: cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise StoreError(_damaged(path, "it is not a regular file"))
    with open(path, "rb") as journal:
        number = 0
        while line := journal.readline(MAX_JOURNAL_LINE + 1):
            number += 1
            if not line.endswith(b"\n"):
                if len(line) > MAX_JOURNAL_LINE:
                    raise StoreError(_damaged(path, f"line {number} is longer than any entry"))
                raise StoreError(f"{path}: its last line ({number}) is an entry cut short (a process "
                                 "stopped while writing it): remove that line to resume from the "
                                 "entries before it")
            try:
                entry = json.loads(line)
            except UnicodeDecodeError:
                raise StoreError(_damaged(path, f"line {number} is not text")) from None
            except ValueError:
                raise StoreError(_damaged(path, f"line {number} is not JSON")) from None
            if not isinstance(entry, dict) or "op_code" not in entry:
                raise StoreError(_damaged(path, f"line {number} is not an entry of Optuna's journal"))


def _damaged(path: Path, why: str) -> str:
    return (f"{path}: not a study journal Optuna can read ({why}): move it away to start the "
            "study again (its trials' rows stay in the results), or --study NAME starts another")


def _without_password(url: str) -> str:
    head, at, tail = url.rpartition("@")
    if not at or "://" not in head:
        return url
    scheme, _, user = head.partition("://")
    return f"{scheme}://{user.split(':')[0]}:***@{tail}"


def tune(request: TuneRequest, display=None, say=print, host_cpus: int | None = None) -> Outcome:
    """Run the study to ``request.trials`` counted trials (the default the first)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    host_cpus = host_cpus or os.cpu_count() or 1
    space = space_of(request, host_cpus)
    name = study_name(request)
    campaign = f"tune:{name}"
    try:                # the default's job, and so every --set, checked before anything is made
        expand(axes_of(request, default_point(request, space, host_cpus), campaign, host_cpus), host_cpus)
    except PlanError as exc:
        raise UsageError(exc.on_command_line) from None
    results = store.results_dir(request.run.results)
    with own_study(request, results, name):
        return _study(request, space, name, results, host_cpus, display, say)


def _study(request: TuneRequest, space: dict, name: str, results: Path, host_cpus: int,
           display, say) -> Outcome:
    """The study, once this process owns it: made or resumed, and run to its trials."""
    import optuna

    campaign = f"tune:{name}"
    if not request.storage:
        check_journal(journal_path(results, name))
    try:
        storage, where = storage_of(request, results, name)
        existing = optuna.get_all_study_names(storage)
    except (KeyError, TypeError, ValueError) as exc:
        if request.storage:
            raise
        raise StoreError(_damaged(journal_path(results, name),
                                  f"Optuna could not replay it: {type(exc).__name__}")) from None
    if name in existing and not request.resume:
        raise UsageError(f"study {name} exists ({where}): --resume continues it, --study NAME "
                         "starts another")
    if name not in existing and request.resume:
        raise UsageError(f"--resume: no study {name} in {where}")
    choices_only = "learning_rate" not in space
    grid = math.prod(len(v) for v in space.values()) if choices_only else None
    if grid is not None and grid <= request.trials - 1:
        sampler = optuna.samplers.GridSampler({k: list(v) for k, v in space.items()}, seed=request.seed)
    else:
        # the accuracy floor is each trial's constraint (Trial.set_constraint, below)
        sampler = optuna.samplers.TPESampler(seed=request.seed,
                                             n_startup_trials=min(5, max(1, request.trials // 3)))
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                direction="minimize", load_if_exists=True)
    _fail_stale(study, sole=not request.storage)
    if not study.trials:
        study.set_user_attr("space", sorted(space))
        study.enqueue_trial(default_point(request, space, host_cpus), user_attrs={"default": True})
    elif sorted(study.user_attrs.get("space", [])) != sorted(space):
        raise UsageError(f"--resume: study {name} searched {', '.join(study.user_attrs.get('space', []))}, "
                         f"not {', '.join(sorted(space))}")
    while (left := request.trials - _counted(study)) > 0:
        asked = [study.ask() for _ in range(min(request.parallel, left))]
        for trial in asked:             # whose it is: failed by another process only once it is gone
            trial.set_user_attr("owner", owners.current().token)
        try:
            points = [_suggest(trial, space) for trial in asked]
            jobs = [expand(axes_of(request, point, campaign, host_cpus), host_cpus) for point in points]
            planned = Campaign(joined(jobs))
            done = execute.execute(dataclasses.replace(request.run, options=RunOptions()), display, say,
                                   planned)
        except BaseException:
            for trial in asked:         # stopped: not a trial that ran, resumed later
                _mark_interrupted(study, trial.number)
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                if trial.user_attrs.get("default"):     # the floor's trial: asked again first
                    study.enqueue_trial(default_point(request, space, host_cpus),
                                        user_attrs={"default": True})
            raise
        rows = done.records or []
        floor = _floor(study, request, asked, rows, jobs)
        for trial, plan in zip(asked, jobs):
            row = _row_of(plan.jobs[0], rows)
            if row is None or row["status"] != "ok" or row["train_time_s"] is None:
                trial.set_user_attr("reason", row["error"] if row is not None else "no row stored")
                trial.set_user_attr("run_id", row["run_id"] if row is not None else None)
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            trial.set_user_attr("run_id", row["run_id"])
            trial.set_user_attr("accuracy", row["accuracy"])
            trial.set_user_attr("floor", floor)
            trial.set_constraint("accuracy floor", floor - row["accuracy"])   # feasible at <= 0
            study.tell(trial, row["train_time_s"])
    return outcome(study, where)


def _suggest(trial, space: dict) -> dict:
    point = {}
    for axis, values in space.items():
        if axis == "learning_rate":
            point[axis] = trial.suggest_float(axis, *values, log=True)
        elif axis == "threads":
            point[axis] = trial.suggest_int(axis, values[0], values[-1])
        else:
            point[axis] = trial.suggest_categorical(axis, values)
    return point


def _floor(study, request: TuneRequest, asked, rows, jobs) -> float:
    """The accuracy a trial must reach: ``--min-accuracy``, else the default trial's less
    ``--floor`` points (the default is the study's first trial)."""
    if request.min_accuracy is not None:
        return request.min_accuracy / 100
    if "floor" in study.user_attrs:
        return study.user_attrs["floor"]
    default = next((t for t in asked if t.user_attrs.get("default")), None)
    row = _row_of(jobs[asked.index(default)].jobs[0], rows) if default is not None else None
    if row is None or row["status"] != "ok" or row["accuracy"] is None:
        why = row["error"] if row is not None else "no row"
        raise UsageError(f"the default configuration did not train ({why}): there is no floor to "
                         "keep; give --min-accuracy")
    floor = row["accuracy"] - request.floor_points / 100
    study.set_user_attr("floor", floor)
    return floor


def _row_of(job, rows) -> dict | None:
    """The stored row of a planned job (the same hyper-parameters, threads and library), as
    plain values: a local run gives records, a Slurm array the stored rows (NaN for empty)."""
    from .schema import dumps
    for row in rows:
        found = {k: _plain(getattr(row, k, None)) for k in (
            "hyperparameters", "threads", "status", "error", "run_id", "accuracy", "train_time_s")}
        if (found["hyperparameters"] == dumps(job.hyperparameters) and found["threads"] == job.threads
                and all(_plain(getattr(row, k)) == v for k, v in job.settings.items() if hasattr(row, k))):
            return found
    return None


def _plain(value):
    """A stored value as Python has it: NaN and pandas' missing values as None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        import pandas as pd
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return value.item() if hasattr(value, "item") else value


def _fail_stale(study, sole: bool) -> None:
    """A trial left running by a process killed outright: failed, not counted.  ``sole``:
    this process holds the study's lock (its journal's), so no trial still running has a
    live owner; otherwise (a database that machines share) only those whose owner is known
    to be gone are failed, or that name none (asked before trials recorded their owner)."""
    import optuna
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        token = trial.user_attrs.get("owner")
        if not sole and token is not None and not owners.gone(token):
            continue                    # its process may still be running it
        _mark_interrupted(study, trial.number)
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)


def _mark_interrupted(study, number: int) -> None:
    """A trial stopped by a signal (or left running): kept in the study, never counted."""
    study.set_user_attr(f"interrupted-{number}", True)


def _interrupted(attrs: dict, number: int) -> bool:
    """Whether the study's user attributes (read once by the caller) mark the trial."""
    return bool(attrs.get(f"interrupted-{number}"))


def _counted(study) -> int:
    """Trials that ran: finished, or failed by their job (not those stopped by Ctrl-C); a
    trial enqueued and not yet asked is not one."""
    import optuna
    attrs = study.user_attrs
    return sum(1 for t in study.get_trials(deepcopy=False)
               if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
               and not _interrupted(attrs, t.number))


def outcome(study, where: str) -> Outcome:
    import optuna
    trials, attrs = [], study.user_attrs
    for t in study.get_trials(deepcopy=False):
        if _interrupted(attrs, t.number) or t.state == optuna.trial.TrialState.WAITING:
            continue
        accuracy, floor = t.user_attrs.get("accuracy"), t.user_attrs.get("floor")
        trials.append(Trial(number=t.number, params=dict(t.params), default=bool(t.user_attrs.get("default")),
                            state=t.state.name, train_time_s=t.value if t.values else None,
                            accuracy=accuracy, feasible=accuracy is not None and floor is not None
                            and accuracy >= floor, run_id=t.user_attrs.get("run_id"),
                            reason=t.user_attrs.get("reason")))
    importances, note = {}, None
    try:
        importances = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError) as exc:
        note = f"not computed: {exc}"
    if not importances and note is None:
        note = "not computed: too few finished trials, or no parameter varied"
    return Outcome(study.study_name, where, study.user_attrs.get("floor"), trials,
                   dict(importances), note)


# -- the campaign that checks the winner -------------------------------------------------------
def best_campaign(request: TuneRequest, found: Outcome, repeats: int = 3) -> str:
    """A campaign file (TOML) that runs the best trial beside the default, ``repeats``
    times each: ``dlbench run --campaign best.toml``.  Made as the campaign file's model
    (``campaign.CampaignFile``) and written from it, so that it reads back as written."""
    import tomli_w

    from .campaign import CampaignFile, Hyperparameters, Matrix

    if not found.best:
        raise UsageError("--write: no trial reached the floor; nothing to write")
    best, host_cpus = found.best[0], os.cpu_count() or 1
    axes = axes_of(request, best.params, f"best-{found.study}", host_cpus)
    default = next(t for t in found.trials if t.default)
    against = ("the default itself, the fastest trial that kept the floor: the two matrices "
               "measure the same configuration (the second names its compute settings)"
               if best.number == default.number else f"the default (trial {default.number})")
    searched = {k: v for k, v in axes.hyperparameters.items() if k not in request.fixed}
    written = CampaignFile(
        name=f"best-{found.study}", frameworks=[request.framework], datasets=[request.dataset],
        profiles=[request.profile], repeats=repeats,
        hyperparameters=Hyperparameters(**request.fixed),   # --set: both keep them, as every trial did
        matrix=[Matrix(label="default", threads=[host_cpus]),                # as its trial ran
                Matrix(label=f"trial {best.number}", threads=axes.threads, hyperparameters=searched,
                       **{k: getattr(axes, k) for k in _SETTINGS if getattr(axes, k) != [None]})])
    document = written.model_dump(exclude_unset=True)
    document["hyperparameters"] = _one_value_bare(document.get("hyperparameters", {}))
    for matrix in document["matrix"]:
        matrix["hyperparameters"] = _one_value_bare(matrix.get("hyperparameters", {}))
    return (f"# dlbench tune: study {found.study}, trial {best.number} against {against}; "
            f"each {repeats} times.\n" + tomli_w.dumps(_without_empty(document)))


def _one_value_bare(table: dict) -> dict:
    """A hyper-parameter of one value written as the value (the file reads both alike)."""
    return {k: v[0] if isinstance(v, list) and len(v) == 1 else v for k, v in table.items()}


def _without_empty(document: dict) -> dict:
    return {k: _without_empty(v) if isinstance(v, dict) else
            [_without_empty(i) if isinstance(i, dict) else i for i in v] if isinstance(v, list) else v
            for k, v in document.items() if v != {}}


# -- what the command prints ------------------------------------------------------------------
def summary(found: Outcome) -> list[str]:
    """The study's result in lines: the floor, the default, the best trials, the importances."""
    lines = [f"study {found.study}: {len(found.trials)} trial(s), kept in {found.storage}"]
    default = found.default
    if found.floor is not None:
        lines.append(f"floor: accuracy at least {100 * found.floor:.2f}%"
                     + (f" (the default's {100 * default.accuracy:.2f}% less the floor's points)"
                        if default is not None and default.accuracy is not None else ""))
    if default is not None:
        lines.append(f"default (trial {default.number}): train {default.train_time_s:.1f} s, "
                     f"accuracy {100 * default.accuracy:.2f}%  {_params(default.params)}")
    best = found.best[:TOP]
    if best:
        lines.append(f"fastest trials that keep the floor (of {len(found.best)}):")
        for trial in best:
            speed = (f", {default.train_time_s / trial.train_time_s:.2f}x the default's speed"
                     if default is not None and trial.train_time_s else "")
            lines.append(f"  trial {trial.number}: train {trial.train_time_s:.1f} s, accuracy "
                         f"{100 * trial.accuracy:.2f}%{speed}  {_params(trial.params)}  run {trial.run_id}")
        if default is not None and best[0].number == default.number:
            lines.append("the default is the fastest trial that keeps the floor")
    else:
        lines.append("no trial kept the floor")
    failed = [t for t in found.trials if t.state != "COMPLETE"]
    if failed:
        lines.append(f"{len(failed)} trial(s) failed: " + "; ".join(
            f"trial {t.number}: {(t.reason or 'no reason').splitlines()[0][:120]}" for t in failed[:3]))
    if found.importances:
        lines.append("parameter importances (fANOVA, of training time): " + ", ".join(
            f"{name} {value:.2f}" for name, value in found.importances.items()))
    else:
        lines.append(f"parameter importances: {found.importance_note}")
    return lines


def _params(params: dict) -> str:
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
