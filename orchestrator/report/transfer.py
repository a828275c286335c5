"""The transfer matrices: each framework's FGSM images tried on each framework's ONNX model.

Per machine (section), data set and profile, the groups with an ok run (a framework, its
device and settings) are the entries.  Each entry is one run, its latest ok run: its FGSM
images at its ``pgd_epsilon`` (``RESULTS/transfer/<run id>.npz``) are a row, its exported
model (``RESULTS/models/<run id>.onnx``) a column; a cell is the accuracy of the column's
model, run by onnxruntime on the CPU, on the row's images (each model in a child process
within the host's limits, ``untrusted``: a stored model is a job's untrusted program).
The diagonal is a run's own model on its own white-box images: about its FGSM accuracy at
that epsilon (the rows' ``own_fgsm``), off by the images on which its ONNX model and the
framework disagree.  A cell without a number has its reason: the row's images were not
kept (no gradient, a failed gradient check, no attack asked for, a run before dlbench kept
them) or are invalid, the column's model was not exported, or onnxruntime cannot run it on
them (a limit of the child included).

Everything is computed from the stored files at each report, nothing cached: 6 models on
1,000 images each take about a second, and a child process's start (1.3 s on a loaded
2-core VM) a column.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pandas as pd

from .. import store
from ..checks import transfer as kept
from ..errors import StoreWarning
from ..checks.migration import Refused
from . import paper


@dataclasses.dataclass
class Entry:
    """A group's run in a matrix."""

    group: int
    label: str
    framework: str
    run_id: str
    epsilon: float | None = None        # its images'
    images: int | None = None
    own_fgsm: float | None = None       # its own FGSM accuracy at that epsilon, from its rows
    images_reason: str | None = None    # why its row is empty
    model_reason: str | None = None     # why its column is empty


@dataclasses.dataclass
class Matrix:
    section: int
    dataset: str
    profile: str
    entries: list[Entry]
    accuracy: list[list[float | None]]  # [row: images of][column: model of]
    reasons: list[list[str | None]]

    def records(self) -> list[dict]:
        """One record per cell, for the JSON report and the chart's CSV."""
        return [{"section": self.section, "dataset": self.dataset, "profile": self.profile,
                 "images_of": a.label, "images_run_id": a.run_id, "epsilon": a.epsilon,
                 "images": a.images, "own_fgsm_accuracy": a.own_fgsm,
                 "model_of": b.label, "model_run_id": b.run_id,
                 "accuracy": self.accuracy[i][j], "reason": self.reasons[i][j]}
                for i, a in enumerate(self.entries) for j, b in enumerate(self.entries)]


def matrices(results: Path, rep: paper.Report) -> list[Matrix]:
    """Every transfer matrix of the report's ok rows; none where no run kept images."""
    ok = rep.rows[rep.rows["status"] == "ok"]
    if not len(ok) or not any(store.transfer_path(results, r).exists() for r in ok["run_id"]):
        return []
    latest = ok.sort_values("recorded_at").groupby("group").tail(1)
    groups = rep.groups.set_index("group")
    found = []
    for (section, dataset, profile), part in latest.groupby(["section", "dataset", "profile"], sort=True):
        part = part.assign(order=part["group"]).sort_values("order")
        entries = [_entry(results, rep, groups.loc[r.group], r, part) for r in part.itertuples()]
        loaded = {e.run_id: _images(results, rep, e, dataset, getattr(r, "transfer_reason", None))
                  for e, r in zip(entries, part.itertuples())}
        models = {e.run_id: _model(results, e, r.migration_reason)
                  for e, r in zip(entries, part.itertuples())}
        columns = {b.run_id: _column(models[b.run_id], entries, loaded) for b in entries if not b.model_reason}
        accuracy, reasons = [], []
        for a in entries:
            row, why = [], []
            for b in entries:
                value, reason = None, a.images_reason or b.model_reason
                if reason is None:
                    value = columns[b.run_id][a.run_id]
                    if isinstance(value, Refused):
                        value, reason = None, str(value)
                row.append(value)
                why.append(reason)
            accuracy.append(row)
            reasons.append(why)
        found.append(Matrix(int(section), dataset, profile, entries, accuracy, reasons))
    return found


def _column(model: bytes, entries: list[Entry], loaded: dict) -> dict:
    """One model's accuracy (or ``Refused``) on every entry's images that were loaded, by run
    id: one child process a model (``transfer.accuracies``), not one a cell."""
    have = [e.run_id for e in entries if loaded[e.run_id] is not None]
    return dict(zip(have, kept.accuracies(model, [loaded[r] for r in have]) if have else []))


def _entry(results: Path, rep: paper.Report, g, row, part: pd.DataFrame) -> Entry:
    """A group's entry: its label says what sets it apart from the matrix's others."""
    label = [g.framework]
    if part["device"].nunique() > 1:
        label.append(g.device)
    if g.settings_kind != "own":
        label.append(g.settings)
    if part["framework"].tolist().count(g.framework) > 1 and len(label) == 1:
        label.append(f"run {row.run_id[:8]}")
    return Entry(group=int(row.group), label=" · ".join(label), framework=g.framework, run_id=row.run_id)


def _images(results: Path, rep: paper.Report, entry: Entry, dataset: str, refused=None):
    """The entry's checked images (filling its epsilon, count and own FGSM accuracy), or
    None with ``images_reason`` set (``refused``: its row's ``transfer_reason``, why the
    host did not take the file the job left)."""
    path = store.transfer_path(results, entry.run_id)
    rows = rep.robustness
    mine = rows[rows["run_id"] == entry.run_id] if rows is not None and len(rows) else None
    if not path.exists():
        entry.images_reason = "no FGSM images: " + (refused if paper.present(refused) else _why_no_images(mine))
        return None
    try:
        found = kept.load(path, dataset)
    except Refused as exc:          # a stored file the host would not take now: left out, said
        entry.images_reason = str(exc)
        warnings.warn(f"{path}: left out of the transfer matrices: {exc}", StoreWarning, stacklevel=2)
        return None
    entry.epsilon, entry.images = found.epsilon, len(found.images)
    if mine is not None:
        fgsm = mine[(mine["attack"] == "fgsm") & ((mine["epsilon"] - found.epsilon).abs() < 1e-9)]
        values = fgsm["accuracy"].dropna()
        entry.own_fgsm = float(values.iloc[0]) if len(values) else None
    return found


def _why_no_images(mine: pd.DataFrame | None) -> str:
    if mine is None or not len(mine):
        return "no attack (robust_images=0, or a run before the robustness check)"
    reasons = mine["reason"].dropna()
    if len(reasons):
        return reasons.iloc[0]
    return "none kept (a run before dlbench kept them, or a file the host did not take)"


def _model(results: Path, entry: Entry, why) -> bytes | None:
    """The entry's ONNX model, or None with ``model_reason`` set (``why``: its row's
    ``migration_reason``)."""
    path = store.model_path(results, entry.run_id)
    if not path.exists():
        entry.model_reason = "no ONNX model: " + (why if paper.present(why) else
                                                  "a run before the migration check")
        return None
    try:
        return kept.read_model(path)
    except Refused as exc:
        entry.model_reason = str(exc)
        return None
