"""`dlbench compare A B`: two sets of stored runs, group by group, with a verdict each.

Rules, stated once here and printed with every comparison (``Comparison.notes``):
- A side is a results directory, a condition on the rows of ``--results``
  (``framework_version=2.20.0``, as ``--where`` takes it) or a campaign's name there; the
  filters ``--where``, ``--framework``, ``--dataset`` hold on both sides.
- A group is one job definition as the report groups it (framework, data set, model,
  device, profile, settings).  Within a side, rows of another thread count, machine, image
  or framework version are another group, never merged; a group of A is compared with the
  group of B of the same definition and thread count, or, where B has none of that thread
  count, with each of B's (a new version against the old, or 1 CPU against 2, is the point).
- Only ok runs count, those the noise rule marks too unless ``--exclude-disturbed``.
- Per pair: the two medians of the metric; their ratio B ÷ A with a bootstrap confidence
  interval (``RESAMPLES`` resamples of each side, percentiles, seeded: the same rows give the
  same interval); a two-sided Mann-Whitney U test (scipy).  The verdict: "faster" or
  "slower" (accuracy: "higher" or "lower") where p < ``ALPHA``, else "no significant
  difference"; "too few runs" where even the most separated runs could not reach p <
  ``ALPHA`` (under 4 runs a side, or 2 against 8); "only in A" / "only in B".
- ``--fail-on-slowdown 5%``: a time group "slower" with B ÷ A above 1.05 fails the command
  (exit status ``EXIT_SLOWER``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .. import store
from ..errors import StoreError, UsageError
from . import compare, noise, select

ALPHA = 0.05
CONFIDENCE = 0.95
RESAMPLES = 4000
SEED = 31
EXIT_SLOWER = 4
# metric -> (stored column, scale, unit, better); accuracy is shown in percent everywhere
METRICS = {"train_time_s": ("train_time_s", 1.0, "s", "lower"),
           "test_time_s": ("test_time_s", 1.0, "s", "lower"),
           "accuracy": ("accuracy", 100.0, "%", "higher")}
KEYS = ["framework", "dataset", "model", "device", "profile", "settings"]
SPLIT = ["threads", "host_name", "image_id", "framework_version"]
FASTER, SLOWER, HIGHER, LOWER = "faster", "slower", "higher", "lower"
SAME, TOO_FEW = "no significant difference", "too few runs"


@dataclasses.dataclass
class Side:
    label: str          # as given on the command line
    what: str           # what it is, in words
    rows: pd.DataFrame  # its stored rows, prepared as the report groups them


@dataclasses.dataclass
class Comparison:
    a: Side
    b: Side
    metric: str
    groups: pd.DataFrame        # one row per pair (or per group only one side has)
    exclude_disturbed: bool
    fail_on_slowdown: float | None      # a fraction: 0.05 for 5%

    @property
    def slowdowns(self) -> pd.DataFrame:
        """The pairs that fail ``--fail-on-slowdown``."""
        if self.fail_on_slowdown is None:
            return self.groups.iloc[0:0]
        return self.groups[(self.groups["verdict"] == SLOWER)
                           & (self.groups["ratio"] > 1 + self.fail_on_slowdown)]

    def notes(self) -> list[str]:
        better = METRICS[self.metric][3]
        notes = [
            f"A: {self.a.what}; B: {self.b.what}. Metric {self.metric} over the ok runs "
            f"({'disturbed runs left out' if self.exclude_disturbed else 'disturbed runs counted'}); "
            f"B ÷ A above 1 means B's is {'longer' if better == 'lower' else 'higher'}.",
            f"A group is one job definition; within a side, rows of another thread count, "
            f"machine, image or framework version are another group, compared with the other "
            f"side's group of the same thread count, else with each of its groups.",
            f"Verdict: a two-sided Mann-Whitney U test, significant where p < {ALPHA:g}; "
            f"\"{TOO_FEW}\" where the runs could not show a difference however far apart "
            f"(under 4 a side). The interval: {CONFIDENCE:.0%} bootstrap percentiles of the ratio "
            f"of medians ({RESAMPLES} resamples, seeded).",
            noise.RULE,
        ]
        if self.fail_on_slowdown is not None:
            notes.append(f"--fail-on-slowdown {self.fail_on_slowdown:.1%}: "
                         f"{len(self.slowdowns)} group(s) significantly slower by more than that "
                         f"(exit status {EXIT_SLOWER} where any).")
        return notes


def threshold(text: str | None) -> float | None:
    """``--fail-on-slowdown``: "5%" or "5" (percent) as a fraction."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%?\s*", text)
    if match is None or not 0 <= float(match.group(1)) <= 1000:
        raise UsageError(f"--fail-on-slowdown {text!r}: a percentage from 0 to 1000, e.g. 5%")
    return float(match.group(1)) / 100


def side(text: str, results: Path, where: list[select.Condition]) -> Side:
    """A side of the comparison: a results directory, else a condition on the rows of
    ``results``, else a campaign's name there."""
    if Path(text).is_dir():
        frame, what = store.load(Path(text)), f"the runs in {text}"
        source = Path(text)
    else:
        source = results
        frame = store.load(results)
        try:
            condition = select.parse(text)
            what = f"the runs of {results} with {condition}"
        except UsageError:
            condition = select.Condition("campaign", "=", text)
            what = f"campaign {text} in {results}"
        frame = select.apply(frame, [condition]) if len(frame) else frame
    if not len(frame):
        raise StoreError(f"{text}: no stored run (a side is a results directory, a condition "
                         f"such as framework_version=2.20.0, or a campaign's name in {source})")
    chosen = select.apply(frame, where)
    if not len(chosen):
        raise StoreError(f"{text}: no stored run meets {' and '.join(map(str, where))}")
    return Side(text, what, compare.prepare(chosen))


def build(a: Side, b: Side, metric: str = "train_time_s", exclude_disturbed: bool = False,
          fail_on_slowdown: float | None = None) -> Comparison:
    if metric not in METRICS:
        raise UsageError(f"--metric {metric}: one of {', '.join(METRICS)}")
    if fail_on_slowdown is not None and METRICS[metric][3] != "lower":
        raise UsageError(f"--fail-on-slowdown goes with a time metric, not {metric}")
    parts = {name: _subgroups(s.rows, metric, exclude_disturbed) for name, s in (("a", a), ("b", b))}
    records = []
    for key in dict.fromkeys(list(parts["a"]) + list(parts["b"])):
        mine, theirs = parts["a"].get(key, []), parts["b"].get(key, [])
        pairs = [(x, y) for x in mine for y in theirs
                 if x[0]["threads"] == y[0]["threads"]
                 or not any(z[0]["threads"] == x[0]["threads"] for z in theirs)
                 and not any(z[0]["threads"] == y[0]["threads"] for z in mine)]
        pairs = pairs or [(x, None) for x in mine] or [(None, y) for y in theirs]
        for x, y in pairs:
            records.append(dict(zip(KEYS, key)) | _pair(x, y, metric))
    columns = KEYS + ["a_split", "b_split", "a_median", "b_median", "a_runs", "b_runs",
                      "a_disturbed", "b_disturbed", "ratio", "ratio_low", "ratio_high", "p_value",
                      "verdict"]
    return Comparison(a, b, metric, pd.DataFrame.from_records(records, columns=columns),
                      exclude_disturbed, fail_on_slowdown)


def _subgroups(rows: pd.DataFrame, metric: str, exclude_disturbed: bool) -> dict:
    """Definition -> [(its split: machine, image, version), the ok values, disturbed ones]."""
    column, scale, _, _ = METRICS[metric]
    rows = rows.assign(disturbed=noise.reasons(rows, KEYS + ["threads"]))
    ok = rows[(rows["status"] == "ok") & pd.to_numeric(rows[column], errors="coerce").notna()]
    if exclude_disturbed:
        ok = ok[ok["disturbed"] == ""]
    found: dict = {}
    for key, part in ok.groupby(KEYS + SPLIT, sort=False, dropna=False):
        split = dict(zip(SPLIT, key[len(KEYS):]))
        values = part[column].astype(float).to_numpy() * scale
        found.setdefault(tuple(key[:len(KEYS)]), []).append(
            (split, values, int((part["disturbed"] != "").sum())))
    return found


def _pair(x, y, metric: str) -> dict:
    record = {"a_split": x and x[0], "b_split": y and y[0],
              "a_median": x and float(np.median(x[1])), "b_median": y and float(np.median(y[1])),
              "a_runs": x and len(x[1]), "b_runs": y and len(y[1]),
              "a_disturbed": x and x[2], "b_disturbed": y and y[2],
              "ratio": None, "ratio_low": None, "ratio_high": None, "p_value": None}
    if x is None or y is None:
        return record | {"verdict": "only in B" if x is None else "only in A"}
    a, b = x[1], y[1]
    if record["a_median"] > 0:
        record["ratio"] = record["b_median"] / record["a_median"]
        if len(a) > 1 and len(b) > 1 and (a > 0).all():
            record["ratio_low"], record["ratio_high"] = _interval(a, b)
    if 2 / math.comb(len(a) + len(b), len(a)) >= ALPHA:
        return record | {"verdict": TOO_FEW}
    from scipy.stats import mannwhitneyu     # scipy: loaded by this command only

    p = float(mannwhitneyu(a, b, alternative="two-sided").pvalue)
    p = 1.0 if math.isnan(p) else p           # every value the same
    record["p_value"] = p
    if p >= ALPHA or record["ratio"] is None:
        return record | {"verdict": SAME}
    up = record["b_median"] > record["a_median"]
    if METRICS[metric][3] == "lower":
        return record | {"verdict": SLOWER if up else FASTER}
    return record | {"verdict": HIGHER if up else LOWER}


def _interval(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """The bootstrap percentile interval of median(B) ÷ median(A)."""
    rng = np.random.default_rng(SEED)
    medians_a = np.median(a[rng.integers(0, len(a), (RESAMPLES, len(a)))], axis=1)
    medians_b = np.median(b[rng.integers(0, len(b), (RESAMPLES, len(b)))], axis=1)
    ratios = medians_b / medians_a
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(low), float(high)
