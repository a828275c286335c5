"""The fair profile in the report: is the work the same, and which framework is faster at it.

Fair runs (``dlbench run --profile fair``) train one network from the same initial weights on
the same batches in every framework, so three things can be read from them that the
default-settings tables cannot say:

    logits   each framework's logits of the probe images before training against the
             host's NumPy reference (``orchestrator.checks.fair``): the largest difference over
             the largest reference logit, within LOGIT_TOLERANCE or not
    training each framework's first REFERENCE_STEPS step losses against the host's NumPy
             reference training (float64) under the framework's max-pooling tie rule
             (``fair.TIE_RULES``): the largest relative difference, within the data
             set's REFERENCE_TOLERANCE or not; under the every rule over the steps before
             the first tie that rounding decides (``fair.rounded_ties``), where the rule
             stops predicting a float32 framework (``steps`` says how many)
    losses   two frameworks' step losses (the same data set, weights and settings, the
             first run of each): how far apart over the first AGREED_STEPS steps, and the
             first step where they part by more than LOSS_TOLERANCE
    speed    the training time of the same work in each framework on one machine, its
             ratio to the fastest: a framework-speed comparison, kept apart from the ratio
             table of the default settings (whose frameworks train different models)
    ops      where that time goes: each layer's forward and backward pass timed alone
             (``dlbench_runner/ops.py``), the whole network's, and the training's step

A framework outside a tolerance is a finding stated here (a "NO" in its table's ``within``),
never a failed run.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd

from dlbench_runner import contract

from ..checks import fair

FAMILY = ["section", "dataset", "device", "fair_weights_sha256", "settings"]


def fair_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The ok rows of the fair profile."""
    if "fair_weights_sha256" not in rows.columns:
        return rows.iloc[0:0]
    return rows[(rows["profile"] == contract.FAIR_PROFILE) & (rows["status"] == "ok")]


def logits(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per section, data set and framework: runs, the largest logit error, whether
    every run is within tolerance."""
    found = fair_rows(rows)
    found = found[found["fair_logit_error"].notna()]
    table = (found.groupby(["section", "dataset", "framework"], sort=False)["fair_logit_error"]
             .agg(runs="count", logit_error="max").reset_index())
    table["within"] = table["logit_error"] <= fair.LOGIT_TOLERANCE
    return table


def losses(rows: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """One row per pair of frameworks of a family (same machine, data set, device, initial
    weights and settings): steps compared, the largest relative difference over the first
    AGREED_STEPS, the first step apart by more than LOSS_TOLERANCE (None: none)."""
    columns = FAMILY + ["framework", "other", "steps", "first_difference", "parts_at"]
    found = fair_rows(rows)
    if steps is None or not len(steps) or not len(found):
        return pd.DataFrame(columns=columns)
    curves = {run: part["loss"].to_numpy(float) for run, part in steps.groupby("run_id", sort=False)}
    cells = []
    for family, part in found.groupby(FAMILY, sort=False, dropna=False):
        first = part.drop_duplicates("framework")       # the first run of each framework
        runs = [(r.framework, curves.get(r.run_id)) for r in first.itertuples()]
        runs = [(name, curve) for name, curve in runs if curve is not None and len(curve)]
        for (name, curve), (other, against) in itertools.combinations(runs, 2):
            n = min(len(curve), len(against), fair.AGREED_STEPS)
            difference = np.abs(curve[:n] - against[:n]) / np.abs(against[:n])
            cells.append(list(family) + [name, other, min(len(curve), len(against)),
                                         float(difference.max()), fair.parting(curve, against)])
    return pd.DataFrame(cells, columns=columns)


REFERENCE_COLUMNS = ["section", "dataset", "framework", "ties", "runs", "steps", "difference",
                     "tolerance", "within", "reason"]


def references(rows: pd.DataFrame, steps: pd.DataFrame | None, data_root) -> pd.DataFrame:
    """One row per section, data set and framework: its runs' first REFERENCE_STEPS losses
    against the NumPy reference training under the framework's tie rule (``fair.TIE_RULES``):
    the largest relative difference over its runs, within the data set's tolerance or not;
    ``reason`` where no run could be checked (``within`` then empty)."""
    found = fair_rows(rows)
    if steps is None or not len(steps) or not len(found):
        return pd.DataFrame(columns=REFERENCE_COLUMNS)
    curves = {run: part.sort_values("step")["loss"].to_numpy(float)
              for run, part in steps.groupby("run_id", sort=False)}
    cells = []
    for (section, dataset, framework), part in found.groupby(["section", "dataset", "framework"], sort=False):
        ties = fair.TIE_RULES.get(framework)
        differences, counted, reasons = [], [], []
        for row in part.itertuples():
            curve = curves.get(row.run_id)
            if curve is None or not len(curve):
                reasons.append("no stored step losses")
                continue
            if ties is None:
                reasons.append("no tie rule stated for it (orchestrator/checks/fair.py TIE_RULES)")
                continue
            try:
                reference, held = fair.reference_check(row, ties, data_root)
            except fair.ReferenceUnavailable as exc:
                reasons.append(str(exc))
                continue
            # under the every rule, only the losses before a tie that rounding decides
            n = min(len(curve), fair.REFERENCE_STEPS, held)
            reference = reference[:n]
            differences.append(float(np.max(np.abs(curve[:n] - reference) / np.abs(reference))))
            counted.append(n)
        tolerance = fair.REFERENCE_TOLERANCE[dataset]
        difference = max(differences) if differences else None
        cells.append([section, dataset, framework, ties or "", len(differences),
                      min(counted) if counted else 0, difference, tolerance,
                      None if difference is None else difference <= tolerance,
                      "" if differences else reasons[0]])
    return pd.DataFrame(cells, columns=REFERENCE_COLUMNS)


def speeds(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per family and framework: runs, the median training time, images per second,
    and the median's ratio to the family's fastest."""
    found = fair_rows(rows)
    found = found[found["train_time_s"].notna()]
    keys = FAMILY[:2] + ["device", "settings", "threads"]
    table = (found.groupby(keys + ["framework"], sort=False, dropna=False)
             .agg(runs=("run_id", "count"), train_time_s=("train_time_s", "median"),
                  images_per_s=("train_images_per_s", "median")).reset_index())
    table["ratio"] = table["train_time_s"] / table.groupby(keys, dropna=False)["train_time_s"].transform("min")
    return table


def curves(rows: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """The step losses of the first run of each framework of each family, for the page."""
    found = fair_rows(rows).drop_duplicates(FAMILY + ["framework"])
    if steps is None or not len(steps) or not len(found):
        return pd.DataFrame(columns=FAMILY + ["framework", "step", "loss"])
    return found[FAMILY + ["framework", "run_id"]].merge(steps, on="run_id").drop(columns="run_id")


OPS_COLUMNS = ["section", "dataset", "framework", "layer", "index", "kind", "shape", "flops",
               "forward_s", "backward_s", "step_s"]


def op_times(rows: pd.DataFrame, ops: pd.DataFrame | None) -> pd.DataFrame:
    """Where the first run of each framework of each family spent its time: one row per
    layer (in the network's order), then ``network`` (the layers as one model) and ``step``
    (the training's mean step), with the forward and backward seconds (a step's in
    ``step_s``)."""
    found = fair_rows(rows).drop_duplicates(FAMILY + ["framework"])
    if ops is None or not len(ops) or not len(found):
        return pd.DataFrame(columns=OPS_COLUMNS)
    timed = found[["section", "dataset", "framework", "run_id"]].merge(ops, on="run_id")
    if not len(timed):
        return pd.DataFrame(columns=OPS_COLUMNS)
    keys = ["section", "dataset", "framework", "layer", "index", "kind", "shape", "flops"]
    table = (timed.pivot_table(index=keys, columns="pass", values="time_s", aggfunc="first",
                               dropna=False, sort=False, observed=True)
             .reindex(columns=["forward", "backward", "step"]).reset_index())
    table = table.rename(columns={"forward": "forward_s", "backward": "backward_s", "step": "step_s"})
    table = table.dropna(subset=["forward_s", "backward_s", "step_s"], how="all")
    # the layers in order, then the network, then the step
    table["order"] = table["index"].where(table["index"] >= 0, 10_000 + (table["kind"] == "step"))
    table = table.sort_values(["section", "dataset", "framework", "order"], kind="stable")
    return table[OPS_COLUMNS].reset_index(drop=True)


def records(rows: pd.DataFrame, steps: pd.DataFrame | None, ops: pd.DataFrame | None = None,
            reference: pd.DataFrame | None = None) -> dict:
    """The five tables as JSON-ready records (``reference``: ``references``' table, made
    once by the report)."""
    def plain(frame: pd.DataFrame) -> list[dict]:
        return json.loads(frame.to_json(orient="records"))
    found = {"logits": plain(logits(rows)), "losses": plain(losses(rows, steps)),
             "speeds": plain(speeds(rows)), "ops": plain(op_times(rows, ops))}
    if reference is not None:
        found["reference"] = plain(reference)
    return found
