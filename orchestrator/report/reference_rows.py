"""Quick runs against dlbench's own reference rows: does this image train as expected, and
how fast is this machine beside the one that measured them.

GTDLBench published its full-length runs only, so the paper cannot judge a quick run, which
trains for other lengths.  dlbench ships the rows of its own quick run instead: a results
directory inside the package (``LOCATION``), read with the store like any other.

Rules, stated once here and printed with every judgement (``Judgement.notes``):
- A quick group of the report (``paper``'s groups) is held against the reference rows' group
  of the same framework, data set, model, device class, profile and settings.  Machine and
  thread count may differ: that is what the speed ratio measures.
- "not comparable: <reason>" where the group ran with settings other than this dlbench's
  quick defaults (changed values, another framework's defaults), where the reference rows hold
  no group of that model with those settings (none at all, or rows measured with other
  settings, as when the quick defaults changed after them), or where the framework versions
  differ.
- The reference rows may come from several machines: the first machine's group is the
  reference group (its median accuracy, its training time); the others widen the range.
- Accuracy: "trains as expected" when the group's median accuracy is within
  max(``TOLERANCE_POINTS``, ``SPREAD_FACTOR`` x the range of the reference accuracies over
  every machine) percentage points of the reference group's median; else "does not train as
  expected".
- Speed: the group's median training time (training steps only) ÷ the reference group's, and
  their geometric mean over the judged groups: this machine ÷ the reference machine.  A
  figure, not a verdict.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
from dlbench_runner import contract

from .. import store
from . import paper

# The reference rows: a results directory shipped inside the package (its runs/*.parquet).
LOCATION = Path(__file__).resolve().parent / "reference" / "quick"
# Quick jobs vary from run to run: the same image on one machine gave MXNet's CIFAR-10 27.84%
# and 29.54%, 1.7 points apart.  3 points holds such repeats with room; a model that no longer
# trains (a broken image, another BLAS gone wrong) misses by far more.  A reference group with
# a wider range of its own widens the tolerance to 3 times that range.
TOLERANCE_POINTS = 3.0
SPREAD_FACTOR = 3.0
AS_EXPECTED, NOT_AS_EXPECTED = "trains as expected", "does not train as expected"
NOT_COMPARABLE = paper.NOT_COMPARABLE
PAPER_ONLY = "paper profile: dlbench report holds it against the paper"
COLUMNS = ["group", "framework", "dataset", "model", "device", "settings", "threads", "runs",
           "verdict", "accuracy_pct", "reference_accuracy_pct", "diff_points", "tolerance_points",
           "train_time_s", "reference_train_time_s", "speed_ratio", "reference_runs"]


def load(where: Path | None = None) -> pd.DataFrame | None:
    """The reference rows (``LOCATION`` unless ``where``); None when there are none."""
    where = LOCATION if where is None else where
    if not store.row_file_count(where):
        return None
    frame = store.load(where)
    return frame if len(frame) else None


def first_machine(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    """The rows of the reference machine: the first machine (host name and CPU model) the
    reference rows were measured on; the others only widen the accuracy's tolerance."""
    if frame is None or not len(frame):
        return frame
    first = frame.sort_values("recorded_at").iloc[0]
    return frame[(frame["host_name"] == first["host_name"])
                 & (frame["host_cpu_model"] == first["host_cpu_model"])]


def machine_of(rep: paper.Report) -> str | None:
    """The machine that measured a report's rows, in words (its CPU model and CPU count)."""
    if not rep.sections:
        return None
    section = rep.sections[0]
    return section.host_cpu_model + (f", {section.host_cpus} CPUs" if section.host_cpus else "")


@dataclasses.dataclass
class Judgement:
    """The quick groups of a report held against the reference rows."""

    groups: pd.DataFrame        # COLUMNS: one row per quick group of the report
    machine: str | None         # the reference machine; None where no reference rows ship
    reference: paper.Report | None   # the reference rows, grouped as the report groups them

    @property
    def judged(self) -> pd.DataFrame:
        return self.groups[self.groups["verdict"].isin([AS_EXPECTED, NOT_AS_EXPECTED])]

    @property
    def not_judged(self) -> pd.DataFrame:
        return self.groups[~self.groups["verdict"].isin([AS_EXPECTED, NOT_AS_EXPECTED])]

    def speed_ratio(self, groups=None) -> float | None:
        """This machine ÷ the reference machine: the geometric mean of the judged groups'
        training-time ratios (of those whose ids are in ``groups``, where given: one
        machine's)."""
        judged = self.judged if groups is None else self.judged[self.judged["group"].isin(groups)]
        ratios = [r for r in judged["speed_ratio"] if paper.present(r) and r > 0]
        return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None

    def notes(self) -> list[str]:
        return [
            f"Quick runs are judged against dlbench's reference rows ({self.machine or 'none ship with this dlbench'}): "
            f"the group of the same framework, data set, model, device class and settings "
            f"(the quick defaults). \"{AS_EXPECTED}\" when the median accuracy is within "
            f"max({TOLERANCE_POINTS:g} points, {SPREAD_FACTOR:g} x the range of the reference "
            f"accuracies on every machine they come from) of the reference median, else \"{NOT_AS_EXPECTED}\"; other settings, another "
            f"framework version or no reference group: \"{NOT_COMPARABLE}: <reason>\".",
            "Speed: training time (training steps only) here ÷ the reference machine's, per "
            "group, and their geometric mean; a figure, not a verdict.",
        ]


def judge(rep: paper.Report, where: Path | None = None,
          against: Judgement | None = None) -> Judgement:
    """The quick groups of ``rep`` held against the reference rows (``LOCATION`` unless
    ``where``); ``against``: an earlier judgement whose reference rows are used again
    instead of being read and grouped a second time."""
    if against is not None:
        ref = against.reference
    else:
        rows = load(where)
        ref = paper.build(rows) if rows is not None else None
    quick = rep.groups[rep.groups["profile"] == contract.QUICK_PROFILE]
    records = [_judge(g, ref) for g in quick.itertuples()]
    return Judgement(groups=pd.DataFrame.from_records(records, columns=COLUMNS),
                     machine=machine_of(ref) if ref is not None else None, reference=ref)


def _judge(g, ref: paper.Report | None) -> dict:
    record = dict(group=g.group, framework=g.framework, dataset=g.dataset, model=g.model,
                  device=g.device, settings=g.settings, threads=g.threads, runs=g.runs,
                  accuracy_pct=g.accuracy_pct_median, train_time_s=g.train_time_s_median)
    base, reason = _reference_group(g, ref)
    if base is not None:
        record.update(reference_accuracy_pct=base.accuracy_pct_median,
                      reference_train_time_s=base.train_time_s_median, reference_runs=base.ok)
    if reason is not None:
        return record | {"verdict": f"{NOT_COMPARABLE}: {reason}"}
    tolerance = max(TOLERANCE_POINTS, SPREAD_FACTOR * _spread(g, ref))
    diff = g.accuracy_pct_median - base.accuracy_pct_median
    record.update(diff_points=round(diff, 6), tolerance_points=tolerance,
                  verdict=AS_EXPECTED if abs(diff) <= tolerance + 1e-9 else NOT_AS_EXPECTED)
    if paper.present(g.train_time_s_median) and paper.present(base.train_time_s_median) \
            and base.train_time_s_median > 0 and _on_reference_machine(base, ref):
        record["speed_ratio"] = g.train_time_s_median / base.train_time_s_median
    return record


def _on_reference_machine(base, ref: paper.Report) -> bool:
    """Whether a reference group was measured on the reference machine (the first's): a
    framework whose reference rows come from another machine alone is judged on its
    accuracy, and has no speed against the reference machine."""
    first, section = ref.sections[0], ref.sections[int(base.section)]
    return (section.host_name, section.host_cpu_model) == (first.host_name, first.host_cpu_model)


def _same_model(g, ref: paper.Report) -> pd.DataFrame:
    """The reference groups with ok runs of ``g``'s framework, data set, model, device class
    and profile, on every machine."""
    groups = ref.groups
    return groups[(groups["framework"] == g.framework) & (groups["dataset"] == g.dataset)
                  & (groups["model"] == g.model) & (groups["device"] == g.device)
                  & (groups["profile"] == g.profile) & (groups["ok"] > 0)]


def _spread(g, ref: paper.Report) -> float:
    """The range of the reference accuracies of ``g``'s model and settings, in points, over
    every machine the reference rows hold (other CPUs take other paths through the same
    libraries: MXNet's quick CIFAR-10 model, near chance, gave 17.1% on an Intel Xeon and
    21.7% on an AMD EPYC)."""
    same = _same_model(g, ref)
    same = same[same["settings"] == paper.without_release(g.settings)]
    return float(same["accuracy_pct_max"].max() - same["accuracy_pct_min"].min())


def _reference_group(g, ref: paper.Report | None):
    """The reference group a quick group ``g`` is held against, and why it cannot be (None
    where it can)."""
    if g.ok == 0:
        return None, "no ok run"
    if g.settings_kind == "cross":
        return None, f"trained with {g.settings}, not the quick defaults"
    if g.settings_kind != "own":
        return None, f"changed hyper-parameters ({g.settings.removeprefix('changed: ')})"
    if ref is None:
        return None, "no reference rows ship with this dlbench"
    same = _same_model(g, ref)
    if not len(same):
        return None, f"no reference rows of {g.framework} {g.dataset} ({g.device})"
    matching = same[same["settings"] == paper.without_release(g.settings)]   # the release: below
    if not len(matching):
        return None, (f"the reference rows of {g.framework} {g.dataset} were measured with other "
                      f"settings ({same['settings'].iloc[0].removeprefix('changed: ')})")
    # the reference machine's group (the first machine's): the one the speed is held against
    base = matching.sort_values(["section", "ok"], ascending=[True, False], kind="stable").iloc[0]
    ours, theirs = list(g.framework_versions), list(base.framework_versions)
    if ours and theirs and ours != theirs:
        return base, f"{', '.join(ours)} here, {', '.join(theirs)} in the reference rows"
    if not paper.present(g.accuracy_pct_median) or not paper.present(base.accuracy_pct_median):
        return base, "no accuracy recorded"
    return base, None
