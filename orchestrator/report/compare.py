"""`dlbench compare A B`: two sets of stored runs, group by group, with a verdict each, and a
gate for CI that is closed to what it cannot judge.

Rules, stated once here and printed with every comparison (``Comparison.notes``):
- A side is a results directory, a condition on the rows of ``--results``
  (``framework_version=2.20.0``, as ``--where`` takes it), with ``--by KEY`` a value of that
  setting (``blis`` for ``blas=blis``; with ``--by framework_version`` a release, ``2.15``
  for 2.15.1), or a campaign's name there; ``--where``,
  ``--framework``, ``--dataset`` hold on both sides.
- A group is one job definition as the report groups it (framework, data set, model, device,
  profile, settings) less the settings compared across: ``--by``, ``--ignore``, or the
  setting both sides are conditions on (``blas=blis blas=openblas``).  Within a side, rows of
  another machine (host name and CPU model, as the report splits them), thread count, value
  of such a setting, framework version or image are another group, never merged.
- Pairing: each group of A with the group of B of its definition that is most alike (the same
  machine first, then thread count, the settings compared across, framework version, image),
  and each group of B left over with A's most alike; a side against itself pairs each group
  with itself.  A pair of two machines is named in a warning line.
- Only ok runs count, those the noise rule marks too unless ``--exclude-disturbed``.
- Per pair: the two medians and their ratio B ÷ A.  With ``MIN_RUNS`` runs a side or more, a
  bootstrap interval of the ratio of medians and a two-sided Mann-Whitney U test (scipy);
  Holm's correction over the pairs compared (those with runs on both sides).  The verdict:
  "faster" or "slower" (accuracy: "higher" or "lower") where the corrected p < ``ALPHA``,
  else "no significant difference"; "too few runs" under ``MIN_RUNS`` a side, or where even
  runs that do not overlap at all could not reach Holm's first step (p < ``ALPHA`` ÷ the
  pairs compared); "only in A" / "only in B".  The last three are inconclusive.
- ``--fail-on-slowdown 5%``: a time group "slower" whose interval's lower end is above 1.05
  fails the command (exit status ``EXIT_SLOWER``); else an inconclusive pair fails it
  (``EXIT_INCONCLUSIVE``) unless ``--allow-inconclusive``.

Why these: a CI gate must not pass what it could not judge (the default is one run, never
enough); a point estimate above the threshold is not a slowdown above it, the interval's
lower end is; twelve independent groups of unchanged runs, each tested at 0.05, give a false
verdict somewhere in 46% of comparisons (1 - 0.95**12).  Holm's step-down correction keeps
that chance within 0.05 and is never less powerful than Bonferroni's.  It takes six lines
here: scipy has only Benjamini-Hochberg (``false_discovery_control``, which bounds the share
of false findings, not the chance of one), and statsmodels, whose ``multipletests`` has Holm,
is no dependency.  The interval is ``scipy.stats.bootstrap``'s percentile method: its
default, BCa, gives no interval (NaN, with a warning) where a side's runs are all equal, as
seeded runs' accuracy is.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .. import store
from ..errors import StoreError, UsageError
from . import noise, paper, select

ALPHA = 0.05
CONFIDENCE = 0.95
RESAMPLES = 4000
SEED = 31
# the fewest runs a side for an interval and a test: with 4 and 4 runs that do not overlap
# the exact Mann-Whitney p is 2/70 = 0.029; with 3 and 3 it cannot go below 0.1, and one run
# against many (2/41 with 1 against 40) would let a single baseline run fail a build
MIN_RUNS = 4
EXIT_SLOWER = 4
EXIT_INCONCLUSIVE = 5
# metric -> (stored column, scale, unit, better); accuracy is shown in percent everywhere
METRICS = {"train_time_s": ("train_time_s", 1.0, "s", "lower"),
           "test_time_s": ("test_time_s", 1.0, "s", "lower"),
           "accuracy": ("accuracy", 100.0, "%", "higher")}
KEYS = ["framework", "dataset", "model", "device", "profile", "settings"]
SPLIT = ["threads", "host_name", "host_cpu_model", "image_id", "framework_version"]
MACHINE = ["host_name", "host_cpu_model"]
# settings stored as columns of their own; any other is a hyper-parameter
SETTING_COLUMNS = ("blas", "onednn")
# what a pair's sides may differ in already (``SPLIT``) that ``--by`` takes values of: the
# framework's release (``dlbench run --versions``)
RELEASE = ("framework_version",)
FASTER, SLOWER, HIGHER, LOWER = "faster", "slower", "higher", "lower"
SAME, TOO_FEW = "no significant difference", "too few runs"
ONLY_A, ONLY_B = "only in A", "only in B"
INCONCLUSIVE = (TOO_FEW, ONLY_A, ONLY_B)


@dataclasses.dataclass
class Side:
    label: str          # as given on the command line (``blas=blis`` for ``--by blas`` blis)
    what: str           # what it is, in words
    rows: pd.DataFrame  # its stored rows, as loaded and chosen


@dataclasses.dataclass
class Comparison:
    a: Side
    b: Side
    metric: str
    groups: pd.DataFrame        # one row per pair (or per group only one side has)
    exclude_disturbed: bool
    fail_on_slowdown: float | None      # a fraction: 0.05 for 5%
    allow_inconclusive: bool = False
    across: list[str] = dataclasses.field(default_factory=list)   # settings compared across

    @property
    def split(self) -> list[str]:
        """What a pair's sides may differ in: ``SPLIT`` and the settings compared across."""
        return SPLIT + self.across

    @property
    def compared(self) -> int:
        """The pairs with runs on both sides: the family Holm's correction is over."""
        return int((~self.groups["verdict"].isin([ONLY_A, ONLY_B])).sum())

    @property
    def slowdowns(self) -> pd.DataFrame:
        """The pairs that fail ``--fail-on-slowdown``: slower, the interval's lower end above
        the threshold."""
        if self.fail_on_slowdown is None:
            return self.groups.iloc[0:0]
        low = pd.to_numeric(self.groups["ratio_low"], errors="coerce")
        return self.groups[(self.groups["verdict"] == SLOWER) & (low > 1 + self.fail_on_slowdown)]

    @property
    def inconclusive(self) -> pd.DataFrame:
        return self.groups[self.groups["verdict"].isin(INCONCLUSIVE)]

    @property
    def exit_status(self) -> int:
        """0, or ``EXIT_SLOWER`` where a pair fails the gate, else ``EXIT_INCONCLUSIVE`` where
        the gate is set, a pair could not be judged and that is not allowed."""
        if self.fail_on_slowdown is None:
            return 0
        if len(self.slowdowns):
            return EXIT_SLOWER
        if len(self.inconclusive) and not self.allow_inconclusive:
            return EXIT_INCONCLUSIVE
        return 0

    def tally(self) -> dict[str, int]:
        verdicts = list(self.groups["verdict"])
        better = METRICS[self.metric][3] == "lower"
        kinds = (SLOWER, FASTER) if better else (HIGHER, LOWER)
        return {kinds[0]: verdicts.count(kinds[0]), kinds[1]: verdicts.count(kinds[1]),
                SAME: verdicts.count(SAME),
                "inconclusive": sum(verdicts.count(v) for v in INCONCLUSIVE)}

    def tally_line(self) -> str:
        counts = self.tally()
        why = [f"{n} {v}" for v in INCONCLUSIVE if (n := list(self.groups["verdict"]).count(v))]
        return ("Tally: " + ", ".join(f"{n} {kind}" for kind, n in counts.items())
                + (f" ({', '.join(why)})" if why else "") + ".")

    def warnings(self) -> list[str]:
        """A line per two machines paired: their times compare the machines too."""
        seen = []
        for a, b in zip(self.groups["a_split"], self.groups["b_split"]):
            if isinstance(a, dict) and isinstance(b, dict) and _machine(a) != _machine(b):
                if (_machine(a), _machine(b)) not in seen:
                    seen.append((_machine(a), _machine(b)))
        return [f"Warning: the two sides ran on different machines: A on {x}, B on {y}; "
                f"their times differ by the machine too." for x, y in seen]

    def notes(self) -> list[str]:
        better = METRICS[self.metric][3]
        across = (f" less {', '.join(self.across)} (compared across)" if self.across else "")
        notes = [self.tally_line(), *self.warnings()]
        if self.fail_on_slowdown is not None:
            t, let = self.fail_on_slowdown, self.allow_inconclusive
            notes.append(
                f"--fail-on-slowdown {t:.1%}: a group fails it where it is slower (corrected "
                f"p < {ALPHA:g}) and its interval's lower end is above {1 + t:g}×: "
                f"{len(self.slowdowns)} group(s) (exit status {EXIT_SLOWER}). Else a group that "
                f"cannot be judged (too few runs, or on one side only) fails it: "
                f"{len(self.inconclusive)} group(s) (exit status {EXIT_INCONCLUSIVE}; "
                + ("let pass by --allow-inconclusive)." if let else
                   "--allow-inconclusive lets them pass)."))
        notes += [
            f"A: {self.a.what}; B: {self.b.what}. Metric {self.metric} over the ok runs "
            f"({'disturbed runs left out' if self.exclude_disturbed else 'disturbed runs counted'}); "
            f"B ÷ A above 1 means B's is {'longer' if better == 'lower' else 'higher'}.",
            f"A group is one job definition{across}; within a side, rows of another machine "
            f"(host name and CPU model), thread count, framework version or image are another "
            f"group. Each is paired with the other side's most alike group of its definition "
            f"(machine, then threads, then version and image).",
            f"Verdict: a two-sided Mann-Whitney U test with Holm's correction over the "
            f"{self.compared} pair(s) compared; significant where the corrected p < {ALPHA:g} "
            f"(the p shown). \"{TOO_FEW}\": under {MIN_RUNS} runs a side, or too few for even "
            f"runs far apart to reach p < {ALPHA:g} ÷ {max(self.compared, 1)}. No interval "
            f"under {MIN_RUNS} runs a side; else {CONFIDENCE:.0%} bootstrap percentiles of the "
            f"ratio of medians ({RESAMPLES} resamples, seeded).",
            noise.RULE,
        ]
        return notes


def _machine(split: dict) -> str:
    return f"{split.get('host_name')} ({split.get('host_cpu_model')})"


def threshold(text: str | None) -> float | None:
    """``--fail-on-slowdown``: "5%" or "5" (percent) as a fraction."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%?\s*", text)
    if match is None or not 0 <= float(match.group(1)) <= 1000:
        raise UsageError(f"--fail-on-slowdown {text!r}: a percentage from 0 to 1000, e.g. 5%")
    return float(match.group(1)) / 100


def sides(a: str, b: str, results: Path, where: list[select.Condition], by: str | None = None,
          ignore: list[str] | None = None) -> tuple[Side, Side, list[str]]:
    """Both sides, and the settings they are compared across: ``by``, ``ignore``, and the
    column both sides are conditions on where it is a setting (``blas=blis blas=openblas``)."""
    first, second = side(a, results, where, by), side(b, results, where, by)
    across = list(dict.fromkeys(([by] if by and by not in RELEASE else []) + list(ignore or [])))
    conditions = [_condition(text) for text in (a, b)]
    if all(c is not None and c.op == "=" for c in conditions) and \
            conditions[0].column == conditions[1].column and conditions[0].column not in across:
        column = conditions[0].column
        if column in _settings_of(pd.concat([first.rows, second.rows])):
            across.append(column)
    rows = pd.concat([first.rows, second.rows])
    for key in across:
        _setting(key, rows, "--by" if key == by else "--ignore")
    return first, second, across


def _setting(key: str, rows: pd.DataFrame, option: str) -> None:
    known = _settings_of(rows)
    if key not in known:
        raise UsageError(f"{option} {key}: not a setting of these runs (one of "
                         f"{', '.join(sorted(known))})")


def side(text: str, results: Path, where: list[select.Condition], by: str | None = None) -> Side:
    """A side of the comparison: a results directory, else a condition on the rows of
    ``results``, else (with ``by``) a value of that setting there, else a campaign's name
    there.  Errors name the side as typed."""
    if Path(text).is_dir():
        frame, what = store.load(Path(text)), f"the runs in {text}"
        if not len(frame):
            raise StoreError(f"{text}: no stored run in this results directory")
    else:
        condition = _condition(text)
        if not results.is_dir():
            raise StoreError(f"{text}: no such results directory (nor a campaign of --results "
                             f"{results}, which does not exist)" if condition is None and not by
                             else f"{text}: a condition on --results {results}, which does not "
                                  f"exist")
        frame = store.load(results)
        if condition is not None:
            what, label = f"the runs of {results} with {condition}", text
            frame = select.apply(frame, [condition]) if len(frame) else frame
        elif by in RELEASE:     # a release, as given or its first numbers (2.15: 2.15.1)
            what, label = f"the runs of {results} with {by} {text}", f"{by}={text}"
            frame = frame[[isinstance(v, str) and (v == text or v.startswith(f"{text}."))
                           for v in frame[by]]] if len(frame) and by in frame.columns else frame.iloc[0:0]
        elif by:
            _setting(by, frame, "--by")
            what, label = f"the runs of {results} with {by}={text}", f"{by}={text}"
            frame = frame[[_matches(v, text) for v in _values(frame, by)]] if len(frame) else frame
        else:
            what, label = f"campaign {text} in {results}", text
            frame = select.apply(frame, [select.Condition("campaign", "=", text)]) \
                if len(frame) else frame
        if not len(frame):
            raise StoreError(f"{label}: no stored run in {results} meets it" if condition or by
                             else f"{text}: no such results directory, and no campaign of that "
                                  f"name in {results} (a side is a results directory, a "
                                  f"condition such as framework_version=2.20.0, or a "
                                  f"campaign's name)")
        text = label
    chosen = select.apply(frame, where)
    if not len(chosen):
        raise StoreError(f"{text}: no stored run meets {' and '.join(map(str, where))}")
    return Side(text, what, chosen)


def _condition(text: str) -> select.Condition | None:
    if Path(text).is_dir():
        return None
    try:
        return select.parse(text)
    except UsageError:
        return None


def _settings_of(rows: pd.DataFrame) -> set[str]:
    """The settings a comparison can be across: the library columns and every hyper-parameter
    the rows name."""
    found = set(SETTING_COLUMNS)
    for text in rows.get("hyperparameters", pd.Series(dtype=object)).dropna().unique():
        try:
            found.update(json.loads(text))
        except (TypeError, ValueError):
            continue
    return found


def _values(rows: pd.DataFrame, key: str) -> list:
    """Each row's value of a setting (None: not set, the image's or model's default)."""
    if key in SETTING_COLUMNS:
        column = rows[key] if key in rows.columns else pd.Series(None, index=rows.index)
        return [v if isinstance(v, str) and v else None for v in column]
    found = []
    for text in rows["hyperparameters"]:
        try:
            found.append(json.loads(text).get(key))
        except (TypeError, ValueError, AttributeError):
            found.append(None)
    return found


def _matches(value, text: str) -> bool:
    if value is None:
        return text in ("", "default")
    try:
        return float(value) == float(text)
    except (TypeError, ValueError):
        return str(value) == text


def _across(rows: pd.DataFrame, across: list[str]) -> pd.DataFrame:
    """The rows with the settings compared across kept as ``by:KEY`` columns and taken out of
    the definition: a library column emptied, a hyper-parameter set to its default (the
    settings label then shows the others only)."""
    rows = rows.copy()
    for key in across:
        rows[f"by:{key}"] = [None if v is None else str(v) for v in _values(rows, key)]
    for key in across:
        if key in SETTING_COLUMNS and key in rows.columns:
            rows[key] = None
    hyper = [k for k in across if k not in SETTING_COLUMNS]
    if hyper and len(rows):
        rows["hyperparameters"] = [_as_default(r, hyper) for r in rows[
            ["framework", "dataset", "profile", "device", "hyperparameters"]].itertuples()]
    return rows


def _as_default(row, keys: list[str]):
    try:
        used = json.loads(row.hyperparameters)
    except (TypeError, ValueError):
        return row.hyperparameters
    expected = paper.defaults(row.framework, row.dataset, row.profile, row.device or "cpu") or {}
    for key in keys:
        if key in expected:
            used[key] = expected[key]
        else:
            used.pop(key, None)
    return json.dumps(used, sort_keys=True)


def build(a: Side, b: Side, metric: str = "train_time_s", exclude_disturbed: bool = False,
          fail_on_slowdown: float | None = None, across: list[str] | None = None,
          allow_inconclusive: bool = False) -> Comparison:
    if metric not in METRICS:
        raise UsageError(f"--metric {metric}: one of {', '.join(METRICS)}")
    if fail_on_slowdown is not None and METRICS[metric][3] != "lower":
        raise UsageError(f"--fail-on-slowdown goes with a time metric, not {metric}")
    across = list(across or [])
    parts = {name: _subgroups(paper.prepare(_across(s.rows, across)), metric,
                              exclude_disturbed, across) for name, s in (("a", a), ("b", b))}
    pairs = []
    for key in dict.fromkeys(list(parts["a"]) + list(parts["b"])):
        pairs += [(key, x, y) for x, y in _pairs(parts["a"].get(key, []), parts["b"].get(key, []),
                                                 across)]
    compared = sum(1 for _, x, y in pairs if x is not None and y is not None)
    records = [dict(zip(KEYS, key)) | _pair(x, y, compared) for key, x, y in pairs]
    _judge(records, metric, compared)
    columns = KEYS + ["a_split", "b_split", "a_median", "b_median", "a_runs", "b_runs",
                      "a_disturbed", "b_disturbed", "ratio", "ratio_low", "ratio_high", "p_value",
                      "p_uncorrected", "verdict"]
    return Comparison(a, b, metric, pd.DataFrame.from_records(records, columns=columns),
                      exclude_disturbed, fail_on_slowdown, allow_inconclusive, across)


def _subgroups(rows: pd.DataFrame, metric: str, exclude_disturbed: bool, across: list[str]) -> dict:
    """Definition -> [(its split: machine, threads, settings across, image, version), the ok
    values, how many of them are disturbed]."""
    column, scale, _, _ = METRICS[metric]
    by = [f"by:{key}" for key in across]
    rows = rows.assign(disturbed=noise.reasons(rows, KEYS + ["threads"] + by))
    ok = rows[(rows["status"] == "ok") & pd.to_numeric(rows[column], errors="coerce").notna()]
    if exclude_disturbed:
        ok = ok[ok["disturbed"] == ""]
    found: dict = {}
    for key, part in ok.groupby(KEYS + SPLIT + by, sort=False, dropna=False):
        split = dict(zip(SPLIT + across, (None if _missing(v) else v for v in key[len(KEYS):])))
        values = part[column].astype(float).to_numpy() * scale
        found.setdefault(tuple(key[:len(KEYS)]), []).append(
            (split, values, int((part["disturbed"] != "").sum())))
    return found


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def _pairs(mine: list, theirs: list, across: list[str]) -> list[tuple]:
    """Each group of A with B's most alike group(s) of the same definition, then each group of
    B not yet paired with A's most alike: a side against itself pairs each group with itself,
    never a cross product of its images or versions."""
    if not mine or not theirs:
        return [(x, None) for x in mine] + [(None, y) for y in theirs]
    order = MACHINE + ["threads"] + across + ["framework_version", "image_id"]

    def alike(x, y) -> tuple:
        return tuple(x[0].get(k) == y[0].get(k) for k in order)

    pairs = []
    for x in mine:
        best = max(alike(x, y) for y in theirs)
        pairs += [(x, y) for y in theirs if alike(x, y) == best]
    for y in theirs:
        if not any(p[1] is y for p in pairs):
            best = max(alike(x, y) for x in mine)
            pairs += [(x, y) for x in mine if alike(x, y) == best]
    return pairs


def _pair(x, y, compared: int) -> dict:
    """A pair's medians, ratio, interval and uncorrected p (no verdict yet)."""
    record = {"a_split": x and x[0], "b_split": y and y[0],
              "a_median": x and float(np.median(x[1])), "b_median": y and float(np.median(y[1])),
              "a_runs": x and len(x[1]), "b_runs": y and len(y[1]),
              "a_disturbed": x and x[2], "b_disturbed": y and y[2],
              "ratio": None, "ratio_low": None, "ratio_high": None, "p_value": None,
              "p_uncorrected": None, "verdict": None}
    if x is None or y is None:
        return record | {"verdict": ONLY_B if x is None else ONLY_A}
    a, b = x[1], y[1]
    enough = min(len(a), len(b)) >= MIN_RUNS
    if record["a_median"] > 0:
        record["ratio"] = record["b_median"] / record["a_median"]
        if enough and (a > 0).all():
            record["ratio_low"], record["ratio_high"] = _interval(a, b)
    # the smallest p the runs allow (no overlap at all) against Holm's first step
    if not enough or 2 / math.comb(len(a) + len(b), len(a)) >= ALPHA / compared:
        return record | {"verdict": TOO_FEW}
    from scipy.stats import mannwhitneyu     # scipy: loaded by this command only

    p = float(mannwhitneyu(a, b, alternative="two-sided").pvalue)
    record["p_uncorrected"] = 1.0 if math.isnan(p) else p       # every value the same
    return record


def _judge(records: list[dict], metric: str, compared: int) -> None:
    """Holm's correction over the pairs compared (an untested one counts as p = 1), and each
    tested pair's verdict."""
    tested = [r for r in records if r["verdict"] is None]
    for record, p in zip(tested, holm([r["p_uncorrected"] for r in tested], compared)):
        record["p_value"] = p
        if p >= ALPHA or record["ratio"] is None:
            record["verdict"] = SAME
            continue
        up = record["b_median"] > record["a_median"]
        if METRICS[metric][3] == "lower":
            record["verdict"] = SLOWER if up else FASTER
        else:
            record["verdict"] = HIGHER if up else LOWER


def holm(p_values: list[float], family: int | None = None) -> list[float]:
    """Holm's step-down adjusted p-values: the k-th smallest p times (family - k + 1), never
    less than the one before, at most 1.  ``family``: the hypotheses in all (those not
    tested have p = 1 and would sort last, changing nothing but the count)."""
    family = len(p_values) if family is None else family
    adjusted, running = [1.0] * len(p_values), 0.0
    for rank, i in enumerate(sorted(range(len(p_values)), key=p_values.__getitem__)):
        running = max(running, min(1.0, (family - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def _interval(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """The bootstrap percentile interval of median(B) ÷ median(A), each side resampled apart,
    seeded: the same rows give the same interval."""
    from scipy.stats import bootstrap

    def ratio(x, y, axis=-1):
        return np.median(y, axis=axis) / np.median(x, axis=axis)

    found = bootstrap((a, b), ratio, n_resamples=RESAMPLES, confidence_level=CONFIDENCE,
                      method="percentile", vectorized=True,
                      random_state=np.random.default_rng(SEED)).confidence_interval
    return float(found.low), float(found.high)
