"""How the settings a campaign varies relate to what was measured (the DLaaS study's third
finding: CPU and memory use follow a framework's configuration).

For each family of ok rows (a machine, framework, data set, model, device and profile)
every setting that takes more than one value there is an axis: the thread count, the
BLAS library and oneDNN switch asked for, another framework's defaults, and each
hyper-parameter.  Each axis is held against each measure (training time, accuracy, mean
CPU use, peak memory) over the family's runs:

- an axis of numbers (threads, batch size, learning rate) by Spearman's rank
  correlation ρ, from -1 to 1 (1: the measure grows with the setting, in rank);
- an axis of names (BLAS libraries, on/off) by the value that gave the best median
  (fastest, most accurate, least CPU or memory), the largest median over the smallest
  (``spread``), and, where every value has two runs or more, the Kruskal-Wallis ε²
  (H / (n - 1)), from 0 to 1: the share of the measure's rank variance the values explain
  (with one run a value it is 1 whatever the noise, so it is left out).

Each is over all the family's runs, whatever the other axes did: with several axes
varied together a figure is the axis's marginal relation, not its effect alone.
"""

from __future__ import annotations

import json
import math
import numbers
import warnings

import numpy as np
import pandas as pd

# measure column -> (its name in the tables, whether less is better)
MEASURES = {"train_time_s": ("train time", True), "accuracy": ("accuracy", False),
            "cpu_percent_mean": ("CPU use", True), "memory_peak_bytes": ("peak memory", True)}
FAMILY = ["section", "framework", "dataset", "model", "device", "profile"]
DEFAULTS = {"threads": None, "blas": "default", "onednn": "default", "settings_from": "own"}
MIN_RUNS = 3


def axes(rows: pd.DataFrame) -> pd.DataFrame:
    """Each row's settings as columns: the threads, the libraries asked for, whose defaults,
    and every hyper-parameter (prefixed ``hp.``)."""
    table = pd.DataFrame(index=rows.index)
    for column, default in DEFAULTS.items():
        if column in rows.columns:
            values = rows[column].astype(object)
            table[column] = values.where(values.notna(), default)
    parsed = [json.loads(text) if isinstance(text, str) else {} for text in rows["hyperparameters"]]
    params = pd.DataFrame(parsed, index=rows.index)
    return pd.concat([table, params.add_prefix("hp.")], axis=1)


def table(rows: pd.DataFrame) -> pd.DataFrame:
    """One record per family, axis and measure (see the module's text); empty where no
    family of ok rows varies anything."""
    ok = rows[rows["status"] == "ok"]
    records = []
    if not len(ok):
        return pd.DataFrame(records)
    settings = axes(ok)
    for key, family in ok.groupby(FAMILY, sort=True, dropna=False):
        if len(family) < MIN_RUNS:
            continue
        own = settings.loc[family.index]
        for axis in own.columns:
            values = own[axis]
            if values.map(_hashable).nunique(dropna=False) < 2:
                continue
            ordered = all(_number(v) for v in values)
            for measure, (name, less_better) in MEASURES.items():
                if measure not in family.columns:
                    continue
                measured = pd.to_numeric(family[measure], errors="coerce")
                keep = measured.notna()
                x, y = values[keep], measured[keep]
                if len(y) < MIN_RUNS or y.nunique() < 2 or x.map(_hashable).nunique() < 2:
                    continue
                record = dict(zip(FAMILY, key)) | {
                    "axis": axis, "measure": name, "runs": int(len(y)),
                    "values": ", ".join(value_text(v) for v in sorted(x.map(_hashable).unique(), key=value_order))}
                from scipy import stats      # where a family varies a setting: most reports have none

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")      # a constant within ties: nan, shown as such
                    if ordered:
                        rho = stats.spearmanr(x.astype(float), y).statistic
                        record |= {"statistic": "rho", "value": _finite(rho), "best": None,
                                   "spread": None}
                    else:
                        groups = [y[x.map(_hashable) == v] for v in x.map(_hashable).unique()]
                        repeated = min(len(g) for g in groups) >= 2
                        h = stats.kruskal(*groups).statistic if repeated else math.nan
                        medians = y.groupby(x.map(_hashable)).median()
                        best = medians.idxmin() if less_better else medians.idxmax()
                        spread = medians.max() / medians.min() if medians.min() > 0 else math.nan
                        record |= {"statistic": "epsilon2", "value": _finite(h / (len(y) - 1)),
                                   "best": value_text(best), "spread": _finite(spread)}
                records.append(record)
    return pd.DataFrame(records)


def series(rows: pd.DataFrame, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """The plots' points: for each (axis, measure) of ``pairs``, the median of the measure at
    each value of the axis, per family (the rows' settings read once for all of them)."""
    ok = rows[rows["status"] == "ok"]
    settings = axes(ok)
    found = [pd.DataFrame(columns=FAMILY + ["value", "median", "runs", "axis", "measure"])]
    for axis, measure in pairs:
        if axis not in settings.columns or measure not in ok.columns:
            continue
        frame = ok[FAMILY].assign(value=settings[axis].map(_hashable),
                                  measured=pd.to_numeric(ok[measure], errors="coerce"))
        frame = frame.dropna(subset=["measured"])
        points = frame.groupby(FAMILY + ["value"], sort=False, dropna=False)["measured"].agg(["median", "size"])
        found.append(points.rename(columns={"size": "runs"}).reset_index().assign(axis=axis, measure=measure))
    return pd.concat(found, ignore_index=True)


def _hashable(value):
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value


def _number(value) -> bool:
    """A number (numpy's too), not a boolean, not NaN."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and not (
        isinstance(value, float) and math.isnan(value))


def value_order(value):
    return (0, value, "") if _number(value) else (1, 0, str(value))


def value_text(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _finite(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
