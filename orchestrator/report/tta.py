"""Time to accuracy (DAWNBench's and MLPerf Training's metric) from the stored per-epoch
figures: the training time until the first epoch whose accuracy is at or above a target.

Rules, stated once here and in docs/reports.md:
- A row's ``epoch_accuracy`` is the training accuracy the job measured over each epoch's
  batches (the runner's ``epoch_done``); no row holds a per-epoch test accuracy.  The time
  to accuracy is therefore the time to a *training* accuracy; the final test accuracy is
  shown beside it.
- The time is the sum of ``epoch_time_s`` up to and including the first epoch at or above
  the target: the training steps only, as ``train_time_s`` (the periodic test passes and
  snapshots left out).  Nothing is interpolated between epochs.
- A run whose epochs never reach the target is "not reached"; a group's time is the median
  over its ok runs that reached it, with the count of those runs.
- The default target is per model (``default_target``): the paper's published test accuracy
  for that model, the lower of its CPU and GPU cells, rounded down to a whole percent; a
  model the paper has no cell for takes its data set's (``DATASET_TARGETS``).
  ``--target`` sets one target for every group.
"""

from __future__ import annotations

import functools
import math
import re

import numpy as np
import pandas as pd

from .. import catalog
from ..errors import DlbenchError, UsageError
from . import paper
from .views import View, rounded

# a model without a paper cell (MXNet's, the fair networks, a framework added to dlbench):
# MNIST, 99%, what every framework reached in the paper (99.03 to 99.28%); CIFAR-10, 75%,
# the paper's Caffe cifar10_quick (75.79%), the most common CIFAR-10 model of the study.
DATASET_TARGETS = {"mnist": 0.99, "cifar10": 0.75}
NOT_REACHED = "not reached"
TARGET_FORMAT = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(%?)\s*")


def parse_target(text: str | None) -> float | None:
    """``--target``: a fraction (0 < t <= 1) or a percent ("99%"); None where not given."""
    if text is None:
        return None
    found = TARGET_FORMAT.fullmatch(text)
    value = float(found.group(1)) if found else math.nan
    if found and found.group(2):
        value /= 100
    elif found and value > 1:
        raise UsageError(f"--target {text}: a fraction is at most 1; for a percent write {text}%")
    if not 0 < value <= 1:
        raise UsageError(f"--target {text}: give a fraction (0 < t <= 1, e.g. 0.99) or a percent "
                         "(e.g. 99%)")
    return value


@functools.lru_cache(maxsize=None)
def paper_targets() -> dict[str, float]:
    """Each model's default target from the paper's cells: the lowest published accuracy of
    the model (CPU or GPU), rounded down to a whole percent."""
    ref = paper.reference()
    lowest: dict[str, float] = {}
    for (framework, dataset, _), cell in ref.cells.items():
        model = cell.get("model") or _model_of(framework, dataset)
        if model is not None:
            lowest[model] = min(lowest.get(model, 100.0), cell["accuracy_pct"])
    return {model: math.floor(pct) / 100 for model, pct in lowest.items()}


def _model_of(framework: str, dataset: str) -> str | None:
    try:
        return catalog.models(framework)["models"].get(dataset, {}).get("model")
    except DlbenchError:        # a framework not installed here: its cells have no model
        return None


def default_target(model: str, dataset: str) -> float | None:
    """The documented target of a model (None: a data set with no default)."""
    return paper_targets().get(model, DATASET_TARGETS.get(dataset))


def first_at(accuracy, seconds, target: float) -> tuple[int | None, float | None]:
    """(the first epoch, from 1, whose accuracy is at or above ``target``, the training time
    until its end); (None, None) where none is; a time of None where an epoch up to it has
    no time recorded."""
    accuracy, seconds = _floats(accuracy), _floats(seconds)
    for i, value in enumerate(accuracy):
        if value >= target:
            spent = seconds[:i + 1]
            known = len(spent) == i + 1 and all(s > 0 for s in spent)
            return i + 1, (float(sum(spent)) if known else None)
    return None, None


def _floats(values) -> list[float]:
    return [float(v) for v in values] if isinstance(values, (list, tuple, np.ndarray)) else []


def runs(rep: paper.Report, target: float | None = None) -> pd.DataFrame:
    """One record per ok run with per-epoch accuracies: its target, the epoch that reached it
    and the time until then (empty where not reached), its best and last training
    accuracy, its epochs."""
    ok = rep.rows[rep.rows["status"] == "ok"]
    records = []
    for run in ok[["run_id", "group", "model", "dataset", "epoch_accuracy", "epoch_time_s",
                   "accuracy"]].itertuples():
        accuracy = _floats(run.epoch_accuracy)
        goal = target if target is not None else default_target(run.model, run.dataset)
        if not accuracy or goal is None:
            continue
        epoch, seconds = first_at(accuracy, run.epoch_time_s, goal)
        records.append({"run_id": run.run_id, "group": int(run.group), "target": goal,
                        "epoch": epoch, "time_s": seconds, "epochs": len(accuracy),
                        "best_accuracy": max(accuracy), "last_accuracy": accuracy[-1],
                        "test_accuracy": float(run.accuracy) if paper.present(run.accuracy) else None})
    return pd.DataFrame.from_records(records, columns=[
        "run_id", "group", "target", "epoch", "time_s", "epochs", "best_accuracy", "last_accuracy",
        "test_accuracy"])


def groups(rep: paper.Report) -> pd.DataFrame:
    """One record per group with runs in ``rep.time_to_accuracy``: the group's keys, the
    target, how many ok runs reached it, the median (min, max) time and epoch over those."""
    found = rep.time_to_accuracy
    if found is None or not len(found):
        return pd.DataFrame()
    keys = rep.groups.set_index("group")
    records = []
    for (group, target), part in found.groupby(["group", "target"], sort=True):
        g = keys.loc[group]
        reached = part[part["epoch"].notna()]
        timed = pd.to_numeric(reached["time_s"]).dropna()
        records.append({
            "section": int(g["section"]), "group": int(group), "framework": g["framework"],
            "dataset": g["dataset"], "model": g["model"], "device": g["device"],
            "profile": g["profile"], "settings": g["settings"],
            "target_pct": round(target * 100, 6), "runs": len(part), "reached": len(reached),
            "epoch_median": float(reached["epoch"].median()) if len(reached) else None,
            "time_s_median": float(timed.median()) if len(timed) else None,
            "time_s_min": float(timed.min()) if len(timed) else None,
            "time_s_max": float(timed.max()) if len(timed) else None,
            "best_accuracy_pct": float(part["best_accuracy"].max() * 100),
            "epochs_max": int(part["epochs"].max())})
    return pd.DataFrame.from_records(records)


def result_text(g) -> str:
    """A group's time to accuracy in a few words: "185.2 s (epoch 4)", "not reached (best
    98.97%, 3 epochs)", or with how many of its runs reached it."""
    if not g.reached:
        return f"{NOT_REACHED} (best {g.best_accuracy_pct:.2f}%, {_epochs(g.epochs_max)})"
    if not paper.present(g.time_s_median):
        text = f"epoch {g.epoch_median:g}, its time not recorded"
    else:
        text = f"{_seconds(g.time_s_median)} s (epoch {g.epoch_median:g})"
        if g.reached > 1 and g.time_s_max > g.time_s_min:
            text = (f"{_seconds(g.time_s_median)} s [{_seconds(g.time_s_min)}–"
                    f"{_seconds(g.time_s_max)}] (epoch {g.epoch_median:g})")
    return text + (f"; {g.reached} of {g.runs} runs" if g.reached < g.runs else "")


def _epochs(n: int) -> str:
    return f"{n} epoch" + ("s" if n != 1 else "")


def _seconds(v: float) -> str:
    return f"{v:,.1f}" if v >= 100 else f"{v:.2f}"


KEYS = ["framework", "data", "model", "device", "profile", "settings", "target", "tta"]
DROP = ["model", "device", "settings"]


def views(rep: paper.Report, section: paper.Section):
    """The section's time-to-accuracy table (none where no run has per-epoch accuracies)."""
    found = groups(rep)
    if not len(found):
        return []
    found = found[found["section"] == section.index]
    if not len(found):
        return []
    rows = [[g.framework, g.dataset, g.model, g.device, g.profile, rounded(g.settings), f"{g.target_pct:g}%",
             result_text(g)] for g in found.itertuples()]
    return [View("Time to accuracy: training until the first epoch at or above the target "
                 "(training accuracy)", ["framework", "data", "model", "device", "profile",
                                         "settings", "target", "time to target"],
                 rows, numeric=set(), wrap={5, 7}, keys=KEYS, drop=DROP)]


def records(rep: paper.Report) -> list[dict]:
    """The JSON report's "time_to_accuracy": one record per group (``groups``)."""
    found = groups(rep)
    return [] if not len(found) else [
        {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
        for r in found.to_dict(orient="records")]


RULE = paper.TTA_RULE         # the report's rules list it; paper cannot import this module
