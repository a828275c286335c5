"""Stored rows against the published study: statistics over repeats, the paper's cells,
verdicts and training-time ratios, as one plain value that the renderers only format.

Rules, stated once here and printed with every report:
- Rows are grouped by machine (host name and CPU model) and schema version first, and
  never averaged across those; within one machine, by framework, data set, model, device,
  profile, settings (own defaults, another framework's defaults, changed values) and
  threads.
- Statistics are the median and the range (min to max) over a group's ok rows.
- A group is judged against the paper cell of the same framework, data set and device
  class (cpu: the CPU column, cuda: the GPU column) only when it ran the paper profile
  with the framework's own defaults: "reproduced" when its median accuracy is within the
  tolerance (percentage points) of the published accuracy.  A cell that names a model
  (Theano CIFAR-10, whose program GTDLBench never published and dlbench reconstructed)
  holds only for rows of that model; any other model of that framework and data set is
  never held against it.  Times are never judged, since
  the machines differ; training-time ratios between frameworks are shown beside the
  paper's instead.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import json

import pandas as pd

from . import catalog

TOLERANCE_POINTS = 1.0

# metric key -> (row column, scale); accuracy is reported in percent, like the paper
METRICS = {
    "train_time_s": ("train_time_s", 1.0),
    "test_time_s": ("test_time_s", 1.0),
    "accuracy_pct": ("accuracy", 100.0),
    "train_images_per_s": ("train_images_per_s", 1.0),
    "test_images_per_s": ("test_images_per_s", 1.0),
}
# resource columns, reported when the rows have them (and not all empty)
RESOURCES = ("memory_peak_bytes", "cpu_percent_mean", "gpu_util_mean", "gpu_memory_peak_bytes")

GROUP_KEYS = ["section", "framework", "dataset", "model", "device", "profile", "settings", "threads"]
REPRODUCED, NOT_REPRODUCED = "reproduced", "not reproduced"


@dataclasses.dataclass(frozen=True)
class Reference:
    """The published numbers: provenance and one cell per framework, data set and device."""

    meta: dict
    cells: dict

    def cell(self, framework: str, dataset: str, device: str, model: str | None = None) -> dict | None:
        """The published cell; None for a ``model`` other than the one the cell names."""
        cell = self.cells.get((framework, dataset, device))
        if cell is not None and model is not None and cell.get("model", model) != model:
            return None
        return cell

    def test_time_note(self, framework: str, dataset: str) -> str | None:
        notes = self.meta["test_time_notes"]
        return notes.get(f"{framework}/{dataset}") or notes.get(framework)


@functools.lru_cache(maxsize=None)
def reference() -> Reference:
    text = importlib.resources.files("orchestrator").joinpath("reference/gtdlbench.json").read_text()
    data = json.loads(text)
    cells = {(c["framework"], c["dataset"], c["device"]): c for c in data.pop("cells")}
    return Reference(meta=data, cells=cells)


@dataclasses.dataclass
class Section:
    """One machine and schema version: its rows are never mixed with another's."""

    index: int
    host_name: str
    host_cpu_model: str
    schema_version: int         # the version its rows were written with
    host_cpus: int | None
    host_memory_gb: float | None
    dlbench_versions: list[str]

    @property
    def title(self) -> str:
        facts = [self.host_cpu_model]
        if self.host_cpus:
            facts.append(f"{self.host_cpus} CPUs")
        if self.host_memory_gb:
            facts.append(f"{self.host_memory_gb:.0f} GB")
        return (f"{self.host_name} ({', '.join(facts)}), schema version {self.schema_version}, "
                f"dlbench {', '.join(self.dlbench_versions)}")


@dataclasses.dataclass
class Report:
    sections: list[Section]
    groups: pd.DataFrame          # one row per group: statistics, paper cell, verdict, ratios
    rows: pd.DataFrame            # the stored rows, with section, group and settings added
    traces: pd.DataFrame | None   # resource samples of the rows' runs, when recorded
    resources: list[str]          # the resource columns the rows have
    tolerance: float
    reference: Reference

    def notes(self) -> list[str]:
        meta = self.reference.meta
        notes = [
            f"Reproduced: the median accuracy of a paper-profile group run with the framework's own "
            f"defaults is within {self.tolerance:g} percentage point(s) of the published accuracy for "
            f"the same framework, data set and device class (cpu: CPU column, cuda: GPU column), "
            f"and of the model the paper's cell names where it names one. "
            f"Quick-profile rows and rows with other settings are shown but never judged.",
            "Times are never judged as reproduced: the machines differ. Training-time ratios "
            "between frameworks on one machine are shown beside the same ratios in the paper.",
            "Paper testing times (marked †) were not measured alike: "
            + " ".join(v for k, v in meta["test_time_notes"].items() if k != "*")
            + " dlbench's testing time is one pass over the test set.",
            f"Paper: {meta['source']}. {meta['machine']}; {meta['software']}.",
            "Statistics: median [min–max] over a group's ok runs; machines and schema versions "
            "are reported apart, never averaged together.",
        ]
        return notes


def build(frame: pd.DataFrame, traces: pd.DataFrame | None = None,
          tolerance: float = TOLERANCE_POINTS, ref: Reference | None = None) -> Report:
    """The report of the stored rows ``frame`` (as ``store.load`` returns them); rows are
    kept apart by the schema version they were written with (``written_schema_version``)."""
    ref = ref or reference()
    rows = frame.drop_duplicates("run_id").reset_index(drop=True)   # a directory merged twice
    for column in ("host_name", "host_cpu_model"):
        rows[column] = rows[column].fillna("unknown").astype(str)
    settings = [_settings(r) for r in rows.itertuples()]
    rows["settings"] = [label for label, _ in settings]
    rows["settings_kind"] = [kind for _, kind in settings]
    sections, section_of = _sections(rows)
    rows["section"] = [section_of[(r.host_name, r.host_cpu_model, r.written_schema_version)]
                       for r in rows.itertuples()]
    rows["threads"] = rows["threads"].astype("Int64")
    resources = [c for c in RESOURCES if c in rows.columns and rows[c].notna().any()]
    groups = _groups(rows, resources, ref, tolerance)
    rows["group"] = 0
    for group, members in zip(groups["group"], groups.pop("_rows")):
        rows.loc[members, "group"] = group
    if traces is not None:
        traces = traces[traces["run_id"].isin(rows["run_id"])]
        traces = traces if len(traces) else None
    return Report(sections=sections, groups=groups, rows=rows, traces=traces, resources=resources,
                  tolerance=tolerance, reference=ref)


def _settings(row) -> tuple[str, str]:
    """How a row's hyper-parameters were chosen: (label, kind own|cross|changed)."""
    source = getattr(row, "settings_from", None)
    if isinstance(source, str) and source:
        return f"{source}'s defaults", "cross"
    expected = defaults(row.framework, row.dataset, row.profile)
    if expected is None:
        return "own defaults", "own"
    try:
        used = json.loads(row.hyperparameters)
    except (TypeError, ValueError):
        return "own defaults", "own"
    changed = {k: v for k, v in used.items() if expected.get(k) != v}
    changed.update({k: None for k in expected if k not in used})
    if not changed:
        return "own defaults", "own"
    return "changed: " + ", ".join(f"{k}={v}" for k, v in sorted(changed.items())), "changed"


@functools.lru_cache(maxsize=None)
def defaults(framework: str, dataset: str, profile: str) -> dict | None:
    """This dlbench's defaults for a framework's model, or None when it does not know them."""
    from dlbench_runner import contract

    try:
        return contract.resolve_hyperparameters(catalog.models(framework), dataset, profile)
    except (OSError, KeyError, ValueError, contract.SpecError):
        return None


def _sections(rows: pd.DataFrame):
    keys = ["host_name", "host_cpu_model", "written_schema_version"]
    sections, section_of = [], {}
    if not len(rows):
        return sections, section_of
    ordered = rows.sort_values("recorded_at").groupby(keys, sort=False)
    for index, ((host, cpu, version), part) in enumerate(ordered):
        sections.append(Section(
            index=index, host_name=host, host_cpu_model=cpu, schema_version=int(version),
            host_cpus=_first(part["host_cpus"]), host_memory_gb=_first(part["host_memory_gb"]),
            dlbench_versions=sorted(part["dlbench_version"].dropna().unique())))
        section_of[(host, cpu, version)] = index
    return sections, section_of


def _first(series):
    values = series.dropna()
    return values.iloc[0].item() if len(values) else None


def _order(frame: pd.DataFrame) -> pd.DataFrame:
    """The study's order: section, data set, device, profile, framework, settings, threads."""
    rank = {name: i for i, name in enumerate(catalog.FRAMEWORKS)}
    data_rank = {name: i for i, name in enumerate(catalog.DATASETS)}
    kind_rank = {"own": 0, "changed": 1, "cross": 2}
    keys = pd.DataFrame({
        "s": frame["section"], "d": frame["dataset"].map(data_rank).fillna(99),
        "v": frame["device"], "p": frame["profile"] != "paper",
        "f": frame["framework"].map(rank).fillna(99), "k": frame["settings_kind"].map(kind_rank),
        "x": frame["settings"], "t": frame["threads"].fillna(0)})
    return frame.loc[keys.sort_values(list(keys.columns)).index].reset_index(drop=True)


def _groups(rows: pd.DataFrame, resources: list[str], ref: Reference, tolerance: float) -> pd.DataFrame:
    records = []
    for key, part in rows.groupby(GROUP_KEYS, sort=False, dropna=False):
        record = dict(zip(GROUP_KEYS, key), _rows=list(part.index))
        ok = part[part["status"] == "ok"]
        record.update(settings_kind=part["settings_kind"].iloc[0], runs=len(part), ok=len(ok),
                      not_ok=", ".join(f"{n} {s}" for s, n in
                                       part.loc[part["status"] != "ok", "status"].value_counts().items()))
        for metric, (column, scale) in METRICS.items():
            record.update(_stats(metric, ok[column] * scale))
        for column in resources:
            record.update(_stats(column, ok[column]))
        record.update(_against_paper(record, ref, tolerance))
        records.append(record)
    columns = GROUP_KEYS + ["settings_kind", "runs", "ok", "not_ok", "_rows"]
    groups = pd.DataFrame.from_records(records, columns=columns + [
        c for c in (records[0] if records else {}) if c not in columns])
    groups = _order(groups)
    groups.insert(0, "group", range(len(groups)))
    return _ratios(groups, ref)


def _stats(metric: str, values: pd.Series) -> dict:
    values = pd.to_numeric(values, errors="coerce").dropna()
    if not len(values):
        return {f"{metric}_median": None, f"{metric}_min": None, f"{metric}_max": None}
    return {f"{metric}_median": float(values.median()), f"{metric}_min": float(values.min()),
            f"{metric}_max": float(values.max())}


def _against_paper(group: dict, ref: Reference, tolerance: float) -> dict:
    cell = ref.cell(group["framework"], group["dataset"], group["device"], group["model"])
    published = ref.cell(group["framework"], group["dataset"], group["device"])
    own = group["settings_kind"] == "own"
    shown = cell if own else None   # another framework's settings: the own-defaults cell is not theirs
    result = {
        "paper_train_time_s": shown and shown["train_time_s"],
        "paper_test_time_s": shown and shown["test_time_s"],
        "paper_test_time_note": shown and ref.test_time_note(group["framework"], group["dataset"]),
        "paper_accuracy_pct": shown and shown["accuracy_pct"],
        "accuracy_diff_points": None,
    }
    if group["ok"] == 0:
        verdict = "no ok run"
    elif group["framework"] in ref.meta.get("not_comparable", {}):
        verdict = ref.meta["not_comparable"][group["framework"]]
    elif cell is None and published is not None:
        verdict = f"not comparable: the paper's cell is {published['model']}, not {group['model']}"
    elif cell is None:
        verdict = "no paper cell"
    elif group["profile"] != "paper":
        verdict = f"not judged: {group['profile']} profile"
    elif group["settings_kind"] == "cross":
        verdict = f"not judged: {group['settings']}"
    elif not own:
        verdict = "not judged: changed hyper-parameters"
    elif group["accuracy_pct_median"] is None:
        verdict = "no accuracy"
    else:
        diff = group["accuracy_pct_median"] - cell["accuracy_pct"]
        result["accuracy_diff_points"] = round(diff, 6)
        verdict = REPRODUCED if abs(diff) <= tolerance + 1e-9 else NOT_REPRODUCED
    result["verdict"] = verdict
    return result


def _ratios(groups: pd.DataFrame, ref: Reference) -> pd.DataFrame:
    """Training time relative to a baseline framework on the same machine, beside the paper's.

    A ratio set is one section, data set, device, profile and thread count, own defaults
    only; the baseline is the first framework of the study present there that has a paper
    cell (else the first present).  Paper ratios are shown for the paper profile only:
    quick runs train for other lengths than the paper did."""
    groups = groups.assign(ratio_baseline=None, train_time_ratio=None, paper_train_time_ratio=None)
    candidates = groups[(groups["settings_kind"] == "own") & groups["train_time_s_median"].notna()]
    for _, part in candidates.groupby(["section", "dataset", "device", "profile", "threads"],
                                       sort=False, dropna=False):
        part = part.drop_duplicates("framework")
        if len(part) < 2:
            continue
        with_cell = [r for r in part.itertuples() if ref.cell(r.framework, r.dataset, r.device, r.model)]
        base = with_cell[0] if with_cell else next(part.itertuples())
        base_cell = ref.cell(base.framework, base.dataset, base.device, base.model)
        for r in part.itertuples():
            groups.at[r.Index, "ratio_baseline"] = base.framework
            groups.at[r.Index, "train_time_ratio"] = r.train_time_s_median / base.train_time_s_median
            cell = ref.cell(r.framework, r.dataset, r.device, r.model)
            if r.profile == "paper" and cell and base_cell:
                groups.at[r.Index, "paper_train_time_ratio"] = (cell["train_time_s"]
                                                                / base_cell["train_time_s"])
    return groups
