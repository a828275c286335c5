"""`dlbench report`'s paper view: the stored rows against the published study (statistics
over repeats, the paper's cells, verdicts and training-time ratios), as one plain value that
the renderers only format.

Rules, stated once here and printed with every report (``Report.notes``):
- Rows are grouped by machine (host name and CPU model) and schema version first, and
  never averaged across those; within one machine, by framework, data set, model, device,
  profile, settings (own defaults, another framework's defaults, changed values) and
  threads.
- Statistics are the median and the range (min to max) over a group's ok rows.
- Every group gets two verdicts, one for its accuracy and one for its training-time
  ratio: "reproduced", "not reproduced" or "not comparable: <reason>", and beside a
  reproduced / not reproduced verdict the caveats that weaken it where they are known
  (another framework version than the paper's, a single run, a reconstructed program).
- Accuracy is judged against the paper cell of the same framework, data set and device
  class (cpu: the CPU column, cuda: the GPU column), only for a group that ran the paper
  profile with the framework's own defaults: "reproduced" when its median accuracy is
  within ``TOLERANCE_POINTS`` percentage points of the published accuracy.  A cell that
  names a model (Theano CIFAR-10, whose program GTDLBench never published and dlbench
  reconstructed) holds only for rows of that model.
- Times themselves are never judged: the machines differ.  A training-time ratio (a
  framework's training time over a baseline framework's, on one machine, data set,
  device, profile and thread count) is judged against the same ratio of the published
  times: "reproduced" within a factor of ``RATIO_TOLERANCE`` either way.
- Which span: a row's ``paper_train_time_s`` / ``paper_test_time_s`` are the spans
  GTDLBench's own method timed.  A group that has them holds the paper's published times
  against them ("paper span"), else against ``train_time_s`` ("training steps only") and
  ``test_time_s`` ("one test pass").  A ratio is of paper spans when both frameworks have
  them, of training steps only when neither has, and not comparable when one has.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import json
import types

import pandas as pd
from dlbench_runner import contract

from .. import catalog
from ..errors import StoreError
from . import noise

TOLERANCE_POINTS = 1.0
# A training-time ratio is reproduced when dlbench's is within this factor of the paper's,
# either way.  The ratios carry the paper's timing findings, and those are large: of its 24
# pairs of frameworks on one data set and device, 21 differ by more than 1.5x (up to 224x).
# What differs between its machine and another moves a ratio too, by less: another CPU
# generation and vector width, another BLAS, other framework versions; repeats on one machine
# vary by a few percent.  A factor of 1.5 keeps a ratio's size and, for those 21 pairs, which
# framework is faster; it cannot tell apart the three pairs the paper found closer (MNIST CPU
# Torch and Theano 1.2x, CIFAR-10 GPU Caffe and Theano 1.2x, MNIST GPU Caffe and TensorFlow
# 1.42x).
RATIO_TOLERANCE = 1.5

# metric key -> (row column, scale); accuracy is reported in percent, like the paper
METRICS = {
    "train_time_s": ("train_time_s", 1.0),
    "test_time_s": ("test_time_s", 1.0),
    "accuracy_pct": ("accuracy", 100.0),
    "train_images_per_s": ("train_images_per_s", 1.0),
    "test_images_per_s": ("test_images_per_s", 1.0),
    "paper_train_time_s": ("paper_train_time_s", 1.0),   # the spans GTDLBench's method timed
    "paper_test_time_s": ("paper_test_time_s", 1.0),
}
# resource columns, reported when the rows have them (and not all empty)
RESOURCES = ("memory_peak_bytes", "cpu_percent_mean", "gpu_util_mean", "gpu_memory_peak_bytes")

GROUP_KEYS = ["section", "framework", "dataset", "model", "device", "profile", "settings", "threads"]
REPRODUCED, NOT_REPRODUCED, NOT_COMPARABLE = "reproduced", "not reproduced", "not comparable"
PAPER_SPAN, STEPS_ONLY, ONE_PASS = "paper span", "training steps only", "one test pass"


def kind(verdict: str) -> str:
    """A verdict's kind: REPRODUCED, NOT_REPRODUCED or NOT_COMPARABLE (the reason dropped)."""
    return verdict if verdict in (REPRODUCED, NOT_REPRODUCED) else NOT_COMPARABLE


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

    def publishes(self, framework: str) -> bool:
        """Whether the paper has numbers of the framework at all (MXNet and any framework
        added to dlbench have none)."""
        return any(key[0] == framework for key in self.cells)

    def judges(self, framework: str) -> bool:
        """Whether a paper-profile run of the framework can get a verdict against the paper:
        it publishes numbers of it, and of the same program (not of pytorch, a port)."""
        return self.publishes(framework) and framework not in self.meta.get("not_comparable", {})

    def software(self, framework: str) -> dict | None:
        """The paper's {"name", "version"} of a framework (version None where it names none)."""
        return self.meta.get("framework_versions", {}).get(framework)

    def test_time_note(self, framework: str, dataset: str) -> str | None:
        notes = self.meta["test_time_notes"]
        return notes.get(f"{framework}/{dataset}") or notes.get(framework)


@functools.lru_cache(maxsize=None)
def reference() -> Reference:
    text = importlib.resources.files(__package__).joinpath("reference/gtdlbench.json").read_text()
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
    groups: pd.DataFrame          # one row per group: statistics, paper cell, verdicts, ratios
    rows: pd.DataFrame            # the stored rows, with section, group and settings added
    traces: pd.DataFrame | None   # resource samples of the rows' runs, when recorded
    resources: list[str]          # the resource columns the rows have
    tolerance: float              # accuracy, percentage points
    reference: Reference
    ratio_tolerance: float = RATIO_TOLERANCE   # training-time ratios, a factor either way
    disturbed_left_out: int = 0   # runs the noise rule marked, left out (--exclude-disturbed)
    # the quick groups held against dlbench's reference rows (reference_rows.Judgement);
    # set by report.make_report, None where not asked
    against_reference: object | None = None
    # the rows' accuracy under attack (store.load_robustness), by run id; set by
    # report.make_report, None where not loaded
    robustness: pd.DataFrame | None = None
    # where the rows' models were deployed (the platforms side table), by run id; set by
    # report.build_report where a row asked for platforms, else None
    platforms: pd.DataFrame | None = None
    # the transfer matrices (report/transfer.py); set by report.make_report, empty where
    # no run kept FGSM images
    transfer: list = dataclasses.field(default_factory=list)
    # the varied settings against the measures (report/correlations.py); set by
    # report.make_report, None where not computed
    correlations: pd.DataFrame | None = None
    # the fair runs' step losses (store.load_steps; report/verification.py reads them with
    # the rows); set by report.make_report, None where no row is of the fair profile
    steps: pd.DataFrame | None = None
    # the fair runs' layer times (store.load_ops), likewise
    ops: pd.DataFrame | None = None
    # the fair runs' first step losses against the NumPy reference training
    # (verification.references), likewise
    fair_reference: pd.DataFrame | None = None
    # each ok run's time to its target accuracy (report/tta.py: tta.runs); set by
    # report.make_report, None where not computed
    time_to_accuracy: pd.DataFrame | None = None

    def notes(self) -> list[str]:
        """The report's rules, printed with it."""
        meta = self.reference.meta
        return [
            f"Verdicts: every group is judged twice, on its accuracy and on its training-time "
            f"ratio: \"{REPRODUCED}\", \"{NOT_REPRODUCED}\" or \"{NOT_COMPARABLE}: <reason>\" "
            f"(quick profile, changed settings, another framework's defaults, another model or "
            f"framework than the paper's cell, no paper cell, no ok run, ...). Caveats beside a "
            f"verdict weaken it (another framework version than the paper's, a single run, a "
            f"reconstructed program).",
            f"Accuracy is reproduced when the median accuracy of a paper-profile group run with "
            f"the framework's own defaults is within {self.tolerance:g} percentage point(s) of the "
            f"published accuracy for the same framework, data set and device class (cpu: CPU "
            f"column, cuda: GPU column), and of the model the paper's cell names where it names "
            f"one.",
            f"Times are never judged themselves: the machines differ. A training-time ratio "
            f"(training time ÷ a baseline framework's, on one machine, data set, device, profile "
            f"and thread count, own defaults) is reproduced when within ×/÷ {self.ratio_tolerance:g} "
            f"of the same ratio of the paper's published times, in the paper profile only. Why "
            f"×/÷ 1.5: 21 of the paper's 24 pairs of frameworks on one data set and device differ "
            f"by more than 1.5× (up to 224×), while other CPUs, BLAS libraries and framework "
            f"versions move a ratio by less; within 1.5× a ratio keeps its size and, for those "
            f"pairs, which framework is faster.",
            f"Spans: the paper's published times are held against the \"{PAPER_SPAN}\" (the span "
            f"GTDLBench's own method timed, with its programs' periodic work, in rows that "
            f"measured it) where a group has one, else against \"{STEPS_ONLY}\" and \"{ONE_PASS}\"; "
            f"a ratio is of paper spans when both frameworks have them, of training steps only "
            f"when neither has, and not comparable when only one has.",
            "Paper testing times (marked †) were not measured alike: "
            + " ".join(v for k, v in meta["test_time_notes"].items() if k != "*")
            + " dlbench's testing time is one pass over the test set.",
            f"Paper: {meta['source']}. {meta['machine']}; {meta['software']}.",
            "Statistics: median [min–max] over a group's ok runs; machines and schema versions "
            "are reported apart, never averaged together.",
            noise.RULE + (f" {self.disturbed_left_out} disturbed run(s) left out here."
                          if self.disturbed_left_out else ""),
        ] + (self.against_reference.notes() if self.against_reference is not None
             and len(self.against_reference.groups) else []) + (
            [TTA_RULE] if self.time_to_accuracy is not None and len(self.time_to_accuracy) else [])


# the time-to-accuracy rule (report/tta.py, which reads this module, computes it)
TTA_RULE = ("Time to accuracy: the training time (the epochs' times summed, test passes left out) "
            "until the end of the first epoch whose training accuracy is at or above the target, "
            "never interpolated; \"not reached\" where no epoch is. Default targets: the paper's "
            "lowest published accuracy for the model, rounded down to a whole percent (MNIST 99%; "
            "CIFAR-10: Caffe 75%, TensorFlow 86%, Torch7 65%, Theano 49%), else MNIST 99%, CIFAR-10 "
            "75%; --target sets another.")


def build(frame: pd.DataFrame, traces: pd.DataFrame | None = None,
          tolerance: float = TOLERANCE_POINTS, ref: Reference | None = None,
          ratio_tolerance: float = RATIO_TOLERANCE, exclude_disturbed: bool = False) -> Report:
    """The report of the stored rows ``frame`` (as ``store.load`` returns them); rows are
    kept apart by the schema version they were written with (``written_schema_version``).
    Runs the noise rule marks (``noise.RULE``) are counted apart, or left out where
    ``exclude_disturbed``."""
    ref = ref or reference()
    rows = prepare(frame)
    _label_releases(rows)
    rows["disturbed"] = noise.reasons(rows, ["written_schema_version"] + GROUP_KEYS[1:])
    left_out = int((rows["disturbed"] != "").sum()) if exclude_disturbed else 0
    if exclude_disturbed:
        rows = rows[rows["disturbed"] == ""].reset_index(drop=True)
        if not len(rows):
            raise StoreError("every chosen run is disturbed; nothing left to report without "
                             "--exclude-disturbed")
    sections, section_of = _sections(rows)
    rows["section"] = [section_of[key] for key in zip(
        rows["host_name"], rows["host_cpu_model"], rows["written_schema_version"])]
    resources = [c for c in RESOURCES if c in rows.columns and rows[c].notna().any()]
    groups = _groups(rows, resources, ref, tolerance, ratio_tolerance)
    group_of = {i: group for group, members in zip(groups["group"], groups.pop("_rows"))
                for i in members}
    rows["group"] = [group_of.get(i, 0) for i in rows.index]
    if traces is not None:
        traces = traces[traces["run_id"].isin(rows["run_id"])]
        traces = traces if len(traces) else None
    return Report(sections=sections, groups=groups, rows=rows, traces=traces, resources=resources,
                  tolerance=tolerance, reference=ref, ratio_tolerance=ratio_tolerance,
                  disturbed_left_out=left_out)


def prepare(frame: pd.DataFrame) -> pd.DataFrame:
    """The stored rows as the report groups them: each run once, the machine's names filled,
    and each row's ``settings`` label and kind (own, changed, cross)."""
    rows = frame.drop_duplicates("run_id").reset_index(drop=True)   # a directory merged twice
    for column in ("host_name", "host_cpu_model"):
        rows[column] = rows[column].fillna("unknown").astype(str)
    for column in ("paper_train_time_s", "paper_test_time_s", "framework_version"):
        if column not in rows.columns:
            rows[column] = None
    # itertuples costs a column access per column: the few _settings reads, not all ~120
    needed = [c for c in ("framework", "dataset", "profile", "device", "hyperparameters",
                          "settings_from", "overrides", "blas", "onednn") if c in rows.columns]
    settings = [_settings(r) for r in rows[needed].itertuples()]
    rows["settings_kind"] = [kind for _, kind in settings]
    # rows of several workers are groups of their own, beside the one-worker group of the
    # same settings (``settings_base``: the scaling table pairs them)
    workers = rows["workers"] if "workers" in rows.columns else pd.Series(pd.NA, index=rows.index)
    rows["workers_n"] = pd.array([int(n) if pd.notna(n) and n else 1 for n in workers], dtype="Int64")
    rows["settings_base"] = [label for label, _ in settings]
    rows["settings"] = [label if n == 1 else f"{label}; {n} workers"
                        for label, n in zip(rows["settings_base"], rows["workers_n"])]
    rows["threads"] = rows["threads"].astype("Int64")
    return rows


RELEASE = "; release "


def without_release(label: str) -> str:
    """A settings label less the release ``_label_releases`` added."""
    return label.split(RELEASE)[0]


def _label_releases(rows: pd.DataFrame) -> None:
    """Where a framework ran more than one release on a machine and device, each release's
    rows a group of their own: the release (the framework's version its runner reported;
    for a row with none, a failed one, that of the other rows of its image) is added to
    their settings labels, ``own; release 2.15.1``.  A framework of one release keeps its
    labels.  (``compare --by framework_version`` pairs the releases; it splits them itself.)"""
    version = rows["framework_version"].astype("string")
    if "image" in rows.columns:
        of_image = version.groupby(rows["image"]).first()
        version = version.fillna(rows["image"].map(of_image).astype("string"))
    if version.dropna().empty:
        return
    machine = [rows["host_name"], rows["host_cpu_model"], rows["framework"], rows["device"]]
    many = version.groupby(machine).transform("nunique") > 1
    for column in ("settings", "settings_base"):
        rows[column] = [f"{label}{RELEASE}{v}" if split and not pd.isna(v) else label
                        for label, v, split in zip(rows[column], version, many)]


def _settings(row) -> tuple[str, str]:
    """How a row's hyper-parameters were chosen, and the compute libraries it asked for:
    (label, kind own|cross|changed).  A library asked for is part of the label (rows on
    different libraries are different groups), not of the kind: the program is the same."""
    label, kind = _hyperparameters(row)
    asked = [f"{name} {value}" for name, value in (("BLAS", getattr(row, "blas", None)),
                                                   ("oneDNN", getattr(row, "onednn", None)))
             if isinstance(value, str) and value]
    return (f"{label}; {', '.join(asked)}" if asked else label), kind


def _hyperparameters(row) -> tuple[str, str]:
    """A row's settings kind: another framework's defaults, what its job was asked to
    change (``overrides``, stored since schema version 15), or for an older row, its
    hyper-parameters against today's defaults (models.json)."""
    source = getattr(row, "settings_from", None)
    if isinstance(source, str) and source:
        return f"{source}'s defaults", "cross"
    asked = _overrides(row)
    if asked is not None:
        if not asked:
            return "own defaults", "own"
        return "changed: " + ", ".join(f"{k}={v}" for k, v in sorted(asked.items())), "changed"
    expected = defaults(row.framework, row.dataset, row.profile, getattr(row, "device", "cpu") or "cpu")
    if expected is None:
        return "own defaults", "own"
    try:
        used = json.loads(row.hyperparameters)
    except (TypeError, ValueError):
        return "own defaults", "own"
    changed = {k: v for k, v in used.items() if expected.get(k) != v}
    # a setting of the checks after training (robustness, migration), or one added later at
    # a default that changes nothing (contract.LATER_SETTINGS), that a row lacks is one its
    # runner did not have yet: the training's settings are what tell a row's kind
    changed.update({k: None for k in expected if k not in used
                    and k not in contract.AFTER_TRAINING | contract.LATER_SETTINGS})
    if not changed:
        return "own defaults", "own"
    return "changed: " + ", ".join(f"{k}={v}" for k, v in sorted(changed.items())), "changed"


def _overrides(row) -> dict | None:
    """The overrides a row's job was asked for, with the values it trained with; None where
    the row does not say (written before schema version 15)."""
    text = getattr(row, "overrides", None)
    if not isinstance(text, str):
        return None
    try:
        asked = json.loads(text)
        used = json.loads(row.hyperparameters)
    except (TypeError, ValueError):
        return None
    if not isinstance(asked, dict) or not isinstance(used, dict):
        return None
    return {k: used.get(k, v) for k, v in asked.items()}


@functools.lru_cache(maxsize=None)
def defaults(framework: str, dataset: str, profile: str, device: str = "cpu") -> dict | None:
    """This dlbench's defaults for a framework's model on a device, or None when it does not
    know them."""
    if framework not in catalog.names():     # rows of a framework not found any more
        return None
    try:
        return contract.resolve_hyperparameters(catalog.models(framework), dataset, profile,
                                                device=device)
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
    rank = {name: i for i, name in enumerate(catalog.names())}
    data_rank = {name: i for i, name in enumerate(catalog.DATASETS)}
    kind_rank = {"own": 0, "changed": 1, "cross": 2}
    keys = pd.DataFrame({
        "s": frame["section"], "d": frame["dataset"].map(data_rank).fillna(99),
        "v": frame["device"], "p": frame["profile"] != contract.PAPER_PROFILE,
        "f": frame["framework"].map(rank).fillna(len(rank)), "n": frame["framework"],
        "k": frame["settings_kind"].map(kind_rank),
        "x": frame["settings"], "t": frame["threads"].fillna(0)})
    return frame.loc[keys.sort_values(list(keys.columns)).index].reset_index(drop=True)


def _groups(rows: pd.DataFrame, resources: list[str], ref: Reference, tolerance: float,
            ratio_tolerance: float) -> pd.DataFrame:
    records = []
    for key, part in rows.groupby(GROUP_KEYS, sort=False, dropna=False):
        record = dict(zip(GROUP_KEYS, key), _rows=list(part.index))
        ok = part[part["status"] == "ok"]
        record.update(settings_kind=part["settings_kind"].iloc[0], runs=len(part), ok=len(ok),
                      disturbed=int((ok["disturbed"] != "").sum()),
                      not_ok=", ".join(f"{n} {s}" for s, n in
                                       part.loc[part["status"] != "ok", "status"].value_counts().items()),
                      framework_versions=sorted(ok["framework_version"].dropna().astype(str).unique()))
        for metric, (column, scale) in METRICS.items():
            record.update(_stats(metric, ok[column] * scale))
        for column in resources:
            record.update(_stats(column, ok[column]))
        record.update(_against_paper(record, ref, tolerance))
        records.append(record)
    columns = GROUP_KEYS + ["settings_kind", "runs", "ok", "disturbed", "not_ok", "_rows"]
    groups = pd.DataFrame.from_records(records, columns=columns + [
        c for c in (records[0] if records else {}) if c not in columns])
    groups = _order(groups)
    groups.insert(0, "group", range(len(groups)))
    return _ratios(groups, ref, ratio_tolerance)


def _stats(metric: str, values: pd.Series) -> dict:
    values = pd.to_numeric(values, errors="coerce").dropna()
    if not len(values):
        return {f"{metric}_median": None, f"{metric}_min": None, f"{metric}_max": None}
    return {f"{metric}_median": float(values.median()), f"{metric}_min": float(values.min()),
            f"{metric}_max": float(values.max())}


def _not_comparable(g, ref: Reference) -> str | None:
    """Why a group ``g`` (its fields as attributes) cannot be held against the paper at all,
    or None where it can."""
    published = ref.cell(g.framework, g.dataset, g.device)
    if g.ok == 0:
        return "no ok run"
    if g.profile == contract.FAIR_PROFILE:      # first: whatever the framework, not the paper's work
        return ("fair profile (the same network in every framework, not the paper's models): "
                "its speeds are in their own table")
    if g.framework in ref.meta.get("not_comparable", {}):
        return ref.meta["not_comparable"][g.framework].removeprefix(f"{NOT_COMPARABLE}: ")
    if not ref.publishes(g.framework):
        return f"{g.framework} is not in the paper"
    if published is None:
        return f"no paper cell for {g.framework} on {g.dataset} ({g.device})"
    if ref.cell(g.framework, g.dataset, g.device, g.model) is None:
        return f"the paper's cell is {published['model']}, not {g.model}"
    if g.profile != contract.PAPER_PROFILE:
        return f"{g.profile} profile (it trains for other lengths than the paper did)"
    if g.settings_kind == "cross":
        return f"trained with {g.settings}"
    if g.settings_kind != "own":
        return f"changed hyper-parameters ({g.settings.removeprefix('changed: ')})"
    return None


def _version_caveat(framework: str, versions: list[str], ref: Reference) -> str | None:
    """A caveat where the group's framework version is not the paper's, or is unknown there."""
    software = ref.software(framework)
    if software is None:
        return None
    name, version, ran = software["name"], software["version"], ", ".join(versions)
    if not versions:
        return f"no {name} version recorded; " + (f"the paper's is {version}" if version
                                                  else "the paper names none either")
    if version is None:
        return f"the paper names no {name} version (ran {ran})"
    if versions != [version]:
        return f"{name} {ran} here, {version} in the paper"
    return None


def _run_caveats(g) -> list[str]:
    caveats = []
    if g.ok == 1:
        caveats.append(f"{g.framework}: one ok run only")
    if g.not_ok:
        caveats.append(f"{g.framework}: {g.not_ok} of {g.runs} run(s) left out")
    return caveats


def _against_paper(group: dict, ref: Reference, tolerance: float) -> dict:
    cell = ref.cell(group["framework"], group["dataset"], group["device"], group["model"])
    own = group["settings_kind"] == "own"
    shown = cell if own else None   # another framework's settings: the own-defaults cell is not theirs
    has_span = {t: group[f"paper_{t}_time_s_median"] is not None for t in ("train", "test")}
    result = {
        "published_train_time_s": shown and shown["train_time_s"],
        "published_test_time_s": shown and shown["test_time_s"],
        "published_test_time_note": shown and ref.test_time_note(group["framework"], group["dataset"]),
        "published_accuracy_pct": shown and shown["accuracy_pct"],
        "train_time_span": PAPER_SPAN if has_span["train"] else STEPS_ONLY,
        "test_time_span": PAPER_SPAN if has_span["test"] else ONE_PASS,
        "accuracy_diff_points": None,
        "accuracy_caveats": [],
    }
    g = types.SimpleNamespace(**group)
    reason = _not_comparable(g, ref)
    if reason is None and group["accuracy_pct_median"] is None:
        reason = "no accuracy recorded"
    if reason is not None:
        result["accuracy_verdict"] = f"{NOT_COMPARABLE}: {reason}"
        return result
    diff = group["accuracy_pct_median"] - cell["accuracy_pct"]
    result["accuracy_diff_points"] = round(diff, 6)
    result["accuracy_verdict"] = REPRODUCED if abs(diff) <= tolerance + 1e-9 else NOT_REPRODUCED
    caveats = [_version_caveat(group["framework"], group["framework_versions"], ref),
               cell.get("note")] + _run_caveats(g)
    result["accuracy_caveats"] = [c for c in caveats if c]
    return result


RATIO_COLUMNS = ["ratio_baseline", "ratio_span", "train_time_ratio", "published_train_time_ratio",
                 "ratio_vs_published", "ratio_verdict", "ratio_caveats"]


def _ratios(groups: pd.DataFrame, ref: Reference, ratio_tolerance: float) -> pd.DataFrame:
    """Training time relative to a baseline framework on the same machine, beside the paper's,
    and its verdict.

    A ratio set is one section, data set, device, profile and thread count, own defaults
    only; the baseline is the first framework of the study present there that has a paper
    cell (else the first present).  The ratio is of paper spans where both frameworks have
    them, else of training steps only.  Published ratios are shown for the paper profile
    only: quick runs train for other lengths than the paper did."""
    groups = groups.assign(**{c: None for c in RATIO_COLUMNS})
    groups["ratio_caveats"] = [[] for _ in range(len(groups))]
    candidates = groups[(groups["settings_kind"] == "own") & groups["train_time_s_median"].notna()
                        & (groups["profile"] != contract.FAIR_PROFILE)]    # apart: verification.py
    candidates = candidates.assign(no_cell=[ref.cell(g.framework, g.dataset, g.device, g.model) is None
                                            for g in candidates.itertuples()])
    placed = set()
    for _, part in candidates.groupby(["section", "dataset", "device", "profile", "threads"],
                                       sort=False, dropna=False):
        # one group per framework: the model the paper's cell names first
        part = part.sort_values("no_cell", kind="stable").drop_duplicates("framework").sort_index()
        if len(part) < 2:
            continue
        with_cell = [r for r in part.itertuples() if not r.no_cell]
        base = with_cell[0] if with_cell else next(part.itertuples())
        base_cell = ref.cell(base.framework, base.dataset, base.device, base.model)
        for r in part.itertuples():
            placed.add(r.Index)
            groups.at[r.Index, "ratio_baseline"] = base.framework
            spans = (present(r.paper_train_time_s_median), present(base.paper_train_time_s_median))
            column = "paper_train_time_s_median" if all(spans) else "train_time_s_median"
            groups.at[r.Index, "ratio_span"] = PAPER_SPAN if all(spans) else STEPS_ONLY
            ratio = getattr(r, column) / getattr(base, column)
            groups.at[r.Index, "train_time_ratio"] = ratio
            cell = ref.cell(r.framework, r.dataset, r.device, r.model)
            if r.profile == contract.PAPER_PROFILE and cell and base_cell:
                published = cell["train_time_s"] / base_cell["train_time_s"]
                groups.at[r.Index, "published_train_time_ratio"] = published
                groups.at[r.Index, "ratio_vs_published"] = ratio / published
            verdict, caveats = _ratio_verdict(r, base, spans, ref, ratio_tolerance,
                                              groups.at[r.Index, "ratio_vs_published"])
            groups.at[r.Index, "ratio_verdict"] = verdict
            groups.at[r.Index, "ratio_caveats"] = caveats
    for g in groups.itertuples():
        if g.Index not in placed:
            reason = _not_comparable(g, ref)
            if reason is None:
                reason = ("no training time" if not present(g.train_time_s_median) else
                          "no other framework ran on this machine with this data set, device, "
                          "profile and thread count")
            groups.at[g.Index, "ratio_verdict"] = f"{NOT_COMPARABLE}: {reason}"
    return groups


def _ratio_verdict(r, base, spans: tuple[bool, bool], ref: Reference, tolerance: float,
                   factor) -> tuple[str, list[str]]:
    """The verdict on one framework's training-time ratio to the baseline, and its caveats."""
    reason = _not_comparable(r, ref)
    if reason is None and r.Index == base.Index:
        reason = "the baseline of its ratios"
    if reason is None and (base_reason := _not_comparable(base, ref)) is not None:
        reason = f"the baseline {base.framework}: {base_reason}"
    if reason is None and spans[0] != spans[1]:
        with_span, without = (r, base) if spans[0] else (base, r)
        reason = (f"the spans differ: {with_span.framework} has a paper span, "
                  f"{without.framework} training steps only")
    if reason is not None:
        return f"{NOT_COMPARABLE}: {reason}", []
    verdict = (REPRODUCED if max(factor, 1 / factor) <= tolerance * (1 + 1e-9)
               else NOT_REPRODUCED)
    caveats = [] if all(spans) else [
        "training steps only: the paper's times also hold its programs' periodic work "
        "(test passes, snapshots, prints)"]
    caveats += [c for g in (r, base) for c in
                [_version_caveat(g.framework, g.framework_versions, ref)] + _run_caveats(g) if c]
    return verdict, caveats


def present(value) -> bool:
    """A value that is there: neither None nor a missing value of pandas (NaN, NA)."""
    return value is not None and not pd.isna(value)
