"""Runs that other work disturbed, found from what every row stores.

The rule, stated once here and printed with every report that marks a run (``RULE``):
an ok run is *disturbed* when
- builds: image builds of its own ``dlbench run`` ran beside it (``builds_alongside`` > 0:
  a job starts as soon as its image is ready, while other images may still build, and
  shares the CPUs with them); or
- other work: the host's other processes used more than ``OTHER_SHARE`` of the CPUs the
  job may run on while it ran (``other_cpu_share``: those CPUs' busy time less the job's
  own and dlbench's, over the job's wall time times their number: its pinned ones, else the
  host's; rows since schema version 13).  The reason
  shows the load average at the job's start and end and the highest between; or
- load, for a row without that share (older rows, a host without /proc/stat): the 1-minute
  load average as it started (``host_load_avg``: the run's start before schema version
  13) is more than the host's CPUs + ``LOAD_MARGIN``: more work than CPUs was running as it
  started.  (Not less: a job that has just ended leaves up to its threads in the load
  average for a minute or two, so runs started one after another would all count as
  disturbed; the same lingering makes a job's own start load no judge where the CPU time
  of other processes was measured.)  Or, among the ok runs of its
  group (one job definition on one machine, image and framework version) when the group
  has two or more,
- CPU use: its mean CPU use (``cpu_percent_mean``) is under ``CPU_SHARE`` of that of the
  group's fastest run (least ``train_time_s``): its threads got less of the CPUs; or
- spread: its training time is more than ``SPREAD`` times the group's fastest.
A quiet machine's repeats differ by a few percent; these say a run lost CPUs to other work,
as the quick MXNet job that trained in 2.7 s alone at 168% CPU and in 52-83 s at 66% beside
other work.
"""

from __future__ import annotations

import pandas as pd

LOAD_MARGIN = 0.5
OTHER_SHARE = 0.25
CPU_SHARE = 0.75
SPREAD = 1.5
# within a group, rows of another image or framework version are another group
SPLIT = ["host_name", "host_cpu_model", "image_id", "framework_version"]

RULE = (f"Disturbed runs: an ok run is marked disturbed when image builds of its dlbench run "
        f"ran beside it (builds), when other processes used more than {OTHER_SHARE:.0%} of the "
        f"CPUs it could run on while it ran (other work), or, where a row has no such measure (before "
        f"schema version 13), when the load average at its start exceeds the host's CPUs by more "
        f"than {LOAD_MARGIN:g} (load), or, in a group of two or more ok runs (one job on one machine, "
        f"image and framework version), when its mean CPU use is under {CPU_SHARE:.0%} of the "
        f"group's fastest run's (CPU use) or its training time is more than {SPREAD:g}× the "
        f"fastest's (spread). --exclude-disturbed leaves them out.")


def reasons(rows: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Why each row is disturbed ("load 2.99 with 2 CPUs; CPU use ...") or "" where it is
    not; ``keys`` are the columns that define a group (``SPLIT`` is added to them)."""
    found = {i: [] for i in rows.index}
    ok = rows[rows["status"] == "ok"]
    # itertuples costs a column access per column: only those read here
    for row in ok[[c for c in ("builds_alongside", "host_load_avg", "host_cpus", "other_cpu_share",
                               "host_load_end", "host_load_max", "cpus")
                   if c in ok.columns]].itertuples():
        builds = _number(row, "builds_alongside")
        if builds:
            found[row.Index].append(f"{builds:.0f} image build(s) ran beside it")
        load, host, other = (_number(row, c) for c in ("host_load_avg", "host_cpus", "other_cpu_share"))
        if other is not None:
            if other > OTHER_SHARE:
                found[row.Index].append(_other_work(row, other, load, host))
        elif load is not None and host is not None and load > host + LOAD_MARGIN:
            found[row.Index].append(f"load {load:.2f} at start on {host:g} CPUs")
    columns = [k for k in keys + SPLIT if k in rows.columns]
    for _, group in ok.groupby(columns, sort=False, dropna=False):
        timed = group[pd.to_numeric(group["train_time_s"], errors="coerce").notna()]
        if len(timed) < 2:
            continue
        fastest = timed.loc[timed["train_time_s"].astype(float).idxmin()]
        best_cpu = _value(fastest.get("cpu_percent_mean"))
        for row in timed[[c for c in ("train_time_s", "cpu_percent_mean")
                          if c in timed.columns]].itertuples():
            cpu = _number(row, "cpu_percent_mean")
            if best_cpu and cpu is not None and cpu < CPU_SHARE * best_cpu:
                found[row.Index].append(f"CPU use {cpu:.0f}% against the fastest run's {best_cpu:.0f}%")
            if row.train_time_s > SPREAD * fastest["train_time_s"]:
                found[row.Index].append(f"trained {row.train_time_s / fastest['train_time_s']:.1f}× "
                                        f"as long as the fastest run")
    return pd.Series({i: "; ".join(r) for i, r in found.items()}, dtype=object).reindex(rows.index)


def _other_work(row, share: float, load: float | None, host: float | None) -> str:
    """"other processes used 41% of the 2 CPUs while it ran (load 0.61 at start, at end
    2.30, at most 2.45)"; of a pinned job's: "of the 1 CPU it was pinned to"."""
    pinned = _number(row, "cpus")
    cpus = (f"the {pinned:g} CPU{'s' if pinned != 1 else ''} it was pinned to" if pinned
            else f"the {host:g} CPUs" if host is not None else "the CPUs")
    loads = [f"{label} {value:.2f}" for label, value in
             (("load", load), ("at end", _number(row, "host_load_end")), ("at most", _number(row, "host_load_max")))
             if value is not None]
    if loads and load is not None:
        loads[0] += " at start"
    return f"other processes used {share:.0%} of {cpus} while it ran" + (f" ({', '.join(loads)})" if loads else "")


def _number(row, column: str) -> float | None:
    return _value(getattr(row, column, None))


def _value(value) -> float | None:
    if value is None or pd.isna(value):
        return None
    return float(value)
