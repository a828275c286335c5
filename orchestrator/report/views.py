"""What the report shows, already formatted: its tables as views that every renderer
(text.py for the terminal, Markdown, CSV and JSON; html.py for the page) draws alike."""

from __future__ import annotations

import json
import re

import pandas as pd

from dlbench_runner import contract

from .. import catalog
from ..checks import fair
from . import compare, correlations, paper, verification
from .draw import View, _gib, _pct, _percent, _published, _rate, _ratio, _seconds


RESOURCE_HEADINGS = {"memory_peak_bytes": "peak memory GiB", "cpu_percent_mean": "CPU %",
                     "gpu_util_mean": "GPU %", "gpu_memory_peak_bytes": "GPU memory GiB"}
SPAN_HEADINGS = {"paper_train_time_s": "paper span train s", "paper_test_time_s": "paper span test s"}
SETTINGS = ["framework", "data", "device", "profile", "settings", "threads"]


def section_views(rep: paper.Report, section: paper.Section) -> list[View]:
    groups = rep.groups[rep.groups["section"] == section.index]
    views = [_measured(groups, rep.resources), _against_paper(groups), _ratios(groups)]
    rows = rep.rows[(rep.rows["section"] == section.index) & (rep.rows["disturbed"] != "")]
    return views + ([_disturbed(rows)] if len(rows) else [])


def reference_lines(rep: paper.Report, section: paper.Section) -> tuple[str, list[str]]:
    """A section's quick groups against dlbench's reference rows, one line each, and this
    machine's speed beside the reference machine's: (heading, lines); no lines where the
    section has no quick group."""
    judgement = rep.against_reference
    if judgement is None:
        return "", []
    ids = rep.groups.loc[rep.groups["section"] == section.index, "group"]
    groups = judgement.groups[judgement.groups["group"].isin(ids)]
    if not len(groups):
        return "", []
    lines = []
    for g in groups.itertuples():
        text = rounded(f"{g.framework} {g.dataset} {g.device}, {g.settings}: {g.verdict}")
        if paper.present(g.diff_points):
            text += (f", {_pct(g.accuracy_pct)}% against {_pct(g.reference_accuracy_pct)}% "
                     f"({g.diff_points:+.2f} points, within {g.tolerance_points:g} expected)")
        if paper.present(g.speed_ratio):
            text += (f"; training time {_ratio(g.speed_ratio)} the reference machine's "
                     f"({_seconds(g.train_time_s)} s against {_seconds(g.reference_train_time_s)} s)")
        lines.append(text)
    ratio = judgement.speed_ratio(ids)
    if ratio is not None:
        judged = judgement.judged["group"].isin(ids).sum()
        lines.append(f"speed: training here takes {_ratio(ratio)} the reference machine's time "
                     f"(geometric mean over {judged} group(s))")
    where = judgement.machine or "none ship with this dlbench"
    return f"Quick runs against dlbench's reference rows ({where})", lines


def _setting_cells(g) -> list[str]:
    return [g.framework, g.dataset, g.device, g.profile, rounded(g.settings),
            "-" if pd.isna(g.threads) else str(g.threads)]


# A number written with more decimals than a reader compares (a tuned learning rate:
# 0.006750312521595928), and the significant digits it is shown with.
LONG_NUMBER = re.compile(r"(?<![\w.])\d+\.\d{5,}(?:e[-+]?\d+)?(?![\w.])")
SIGNIFICANT = 4


def rounded(text: str) -> str:
    """Settings (and the verdicts that name them) as shown: each number of five decimals or
    more to ``SIGNIFICANT`` significant digits; the stored rows, the CSV and the JSON keep
    every digit."""
    return LONG_NUMBER.sub(lambda m: f"{float(m.group()):.{SIGNIFICANT}g}", str(text))


SETTING_KEYS = ["framework", "data", "device", "profile", "settings", "threads"]
RESOURCE_KEYS = {"memory_peak_bytes": "memory", "cpu_percent_mean": "cpu", "gpu_util_mean": "gpu",
                 "gpu_memory_peak_bytes": "gpu_memory"}
SPAN_KEYS = {"paper_train_time_s": "paper_train", "paper_test_time_s": "paper_test"}
# every view's column keys, and the ones left out first where a terminal is narrow
MEASURED_KEYS = SETTING_KEYS + ["runs", "train", "test", "accuracy", "train_rate", "test_rate",
                                *SPAN_KEYS.values(), *RESOURCE_KEYS.values()]
MEASURED_DROP = ["gpu_memory", "gpu", "memory", "cpu", "test_rate", "train_rate", "paper_test",
                 "paper_train", "test", "threads", "device"]
AGAINST_KEYS = SETTING_KEYS[:5] + ["accuracy", "published_accuracy", "diff", "accuracy_verdict",
                                   "accuracy_caveats", "train", "published_train", "test",
                                   "published_test", "held_against"]
AGAINST_DROP = ["held_against", "published_test", "test", "published_train", "train",
                "accuracy_caveats", "published_accuracy", "device"]
RATIO_KEYS = SETTING_KEYS + ["span", "train", "ratio", "published_ratio", "ratio_vs_published",
                             "ratio_verdict", "ratio_caveats"]
RATIO_DROP = ["ratio_caveats", "span", "train", "published_ratio", "ratio_vs_published", "threads",
              "device"]
DISTURBED_KEYS = ["run", "framework", "data", "profile", "train", "cpu", "load", "why"]
DISTURBED_DROP = ["load", "cpu", "profile"]
REPORT_KEYS = list(dict.fromkeys(MEASURED_KEYS + AGAINST_KEYS + RATIO_KEYS + DISTURBED_KEYS))


def _measured(groups: pd.DataFrame, resources: list[str]) -> View:
    metrics = [("train_time_s", _seconds), ("test_time_s", _seconds), ("accuracy_pct", _pct),
               ("train_images_per_s", _rate), ("test_images_per_s", _rate)]
    columns = SETTINGS + ["runs", "train s", "test s", "accuracy %", "train img/s", "test img/s"]
    keys = SETTING_KEYS + ["runs", "train", "test", "accuracy", "train_rate", "test_rate"]
    spans = [m for m in ("paper_train_time_s", "paper_test_time_s")
             if groups[f"{m}_median"].notna().any()]      # shown where the rows measured them
    metrics += [(m, _seconds) for m in spans]
    columns += [SPAN_HEADINGS[m] for m in spans]
    columns += [RESOURCE_HEADINGS[c] for c in resources]
    keys += [SPAN_KEYS[m] for m in spans] + [RESOURCE_KEYS[c] for c in resources]
    rows = []
    for g in groups.itertuples():
        runs = (f"{g.ok}/{g.runs} ok" + (f" ({g.not_ok})" if g.not_ok else "")
                + (f", {g.disturbed} disturbed" if g.disturbed else ""))
        cells = _setting_cells(g) + [runs] + [_stat(g, metric, fmt) for metric, fmt in metrics]
        cells += [_stat(g, c, _gib if c.endswith("bytes") else _percent) for c in resources]
        rows.append(cells)
    return View("Measured: median [min–max] over the ok runs", columns, rows,
                numeric=set(range(len(SETTINGS) + 1, len(columns))), wrap={4, 6}, keys=keys,
                drop=MEASURED_DROP)


# The share of attacked images whose input gradient vanished above which a job's attacks are
# not a robustness figure: an attack along a gradient of zeros or rounding moves nothing, and
# the model looks robust where its gradient is masked.
MASKED_SHARE = 0.01
MASKED = "gradient masked: not a robustness figure"


def vanished_share(rows: pd.DataFrame) -> float | None:
    """The largest share of a job's (or a group's) attacked images whose input gradient
    vanished, over its attack rows; None where none counted them (rows before robustness
    schema 2)."""
    if "vanished_gradients" not in rows:
        return None
    counted = rows[rows["vanished_gradients"].notna() & (rows["images"] > 0)]
    if not len(counted):
        return None
    return float((counted["vanished_gradients"].astype(float) / counted["images"].astype(float)).max())


def _attack_notes(rows: pd.DataFrame) -> set[str]:
    """What a group's attack rows say of themselves: masked (``MASKED_SHARE``), or attacked
    along float32's own cross-entropy gradient (rows before robustness schema 2)."""
    from ..schema import OLD_ATTACK_LOSS
    notes = set()
    share = vanished_share(rows)
    if share is not None and share > MASKED_SHARE:
        notes.add(f"{MASKED} ({100 * share:.1f}% of the images' gradients vanished)")
    if "attack_loss" in rows and (rows["attack_loss"] == OLD_ATTACK_LOSS).any():
        notes.add("attacked along float32's own cross-entropy gradient (before robustness schema 2): "
                  "vanished gradients not counted, may be gradient-masked")
    return notes


def robustness_views(rep: paper.Report, section: paper.Section) -> list[View]:
    """A section's accuracy under attack: one table per data set, a row per group that has
    any (a framework, its device, profile and settings), a column per attack and epsilon
    (the median over the group's ok runs), beside the trained model's size; the largest
    share of images whose gradient vanished, and a group above ``MASKED_SHARE`` flagged."""
    found = rep.robustness
    if found is None or not len(found):
        return []
    rows = rep.rows[(rep.rows["section"] == section.index) & (rep.rows["status"] == "ok")]
    found = found.merge(rows[["run_id", "group"]], on="run_id")
    if not len(found):
        return []
    groups = rep.groups.set_index("group")
    found = found.assign(dataset=found["group"].map(groups["dataset"]))
    order = {"none": 0, "fgsm": 1, "pgd": 2}
    views = []
    for dataset, part in found.groupby("dataset", sort=True):
        attacks = sorted({(a, float(e)) for a, e in zip(part["attack"], part["epsilon"])},
                         key=lambda pair: (order.get(pair[0], 3), pair[1]))
        heads = [("clean %" if a == "none" else f"{a.upper()} {_epsilon(e)} %") for a, e in attacks]
        cells = []
        for group, same in part.groupby("group", sort=True):
            g = groups.loc[group]
            mine = rows[rows["group"] == group]
            accuracy = {}
            for (attack, epsilon), one in same.groupby(["attack", "epsilon"]):
                values = one["accuracy"].dropna()
                accuracy[attack, float(epsilon)] = _pct(100 * values.median()) if len(values) else "-"
            size = mine["model_size_bytes"].dropna() if "model_size_bytes" in mine else []
            seconds = mine["robustness_time_s"].dropna() if "robustness_time_s" in mine else []
            error = mine["gradient_error"].dropna() if "gradient_error" in mine else []
            migrated = mine["migrated_accuracy"].dropna() if "migrated_accuracy" in mine else []
            mismatches = mine["migration_mismatches"].dropna() if "migration_mismatches" in mine else []
            reasons = set(same["reason"].dropna()) | _attack_notes(same)
            share = vanished_share(same)
            if "migration_reason" in mine:
                reasons |= {f"ONNX: {r}" for r in mine["migration_reason"].dropna()}
            cells.append([g.framework, g.device, g.profile, rounded(g.settings), str(same["run_id"].nunique()),
                          "/".join(str(n) for n in sorted(set(same["images"])))]
                         + [accuracy.get(pair, "") for pair in attacks]
                         + [_pct(100 * migrated.median()) if len(migrated) else "-",
                            str(int(mismatches.max())) if len(mismatches) else "-",
                            f"{size.median() / 1e6:.2f}" if len(size) else "-",
                            f"{error.max():.1e}" if len(error) else "-",
                            _seconds(seconds.median()) if len(seconds) else "-",
                            "-" if share is None else _pct(100 * share),
                            "; ".join(sorted(reasons))])
        title = (f"Robustness on {dataset}: accuracy under white-box attack (ε in the [0, 1] "
                 "pixel scale), median over the ok runs; the model exported to ONNX, run by "
                 "onnxruntime on the images the job tested (its accuracy, and the most images "
                 "it classified otherwise than the framework over the runs); the trained "
                 "model's size; the input gradient's finite-difference check (its largest "
                 "error over the runs); the check's and the attacks' seconds; the most "
                 f"attacked images whose input gradient vanished (above {100 * MASKED_SHARE:g}%: "
                 f"{MASKED})")
        columns = (["framework", "device", "profile", "settings", "runs", "images"] + heads
                   + ["ONNX %", "mism.", "model MB", "grad err", "robust s", "vanished %", "why empty"])
        keys = (["framework", "device", "profile", "settings", "runs", "images"]
                + [a for a, _ in attacks] + ["onnx", "mismatches", "model", "check", "time", "vanished",
                                             "why"])
        numeric = set(range(4, len(columns) - 1))
        views.append(View(title, columns, cells, numeric=numeric, wrap={3, len(columns) - 1},
                          keys=keys, drop=["why", "settings", "time", "check", "device", "runs", "images",
                                           "mismatches"]))
    return views


def platform_views(rep: paper.Report, section: paper.Section) -> list[View]:
    """A section's trained models where they were deployed (``checks/platforms.py``): one
    table per data set, a row per group and platform, the median over the group's ok runs
    of the deployed model's accuracy and its change against the framework's own on the
    same test images, the most images classified otherwise, the largest logit error, the
    model's size, the latency at batch 1 and the throughput, the FGSM images' accuracy; a
    platform that failed, or a job whose model could not be deployed, with its reason."""
    found = rep.platforms
    rows = rep.rows[(rep.rows["section"] == section.index) & (rep.rows["status"] == "ok")]
    if "platforms" not in rows or not rows["platforms"].notna().any():
        return []
    found = (found.merge(rows[["run_id", "group", "accuracy"]].rename(columns={"accuracy": "own"}), on="run_id")
             if found is not None and len(found) else None)
    groups = rep.groups.set_index("group")
    order = {name: n for n, name in enumerate(catalog.PLATFORMS)}
    views = []
    for dataset in sorted(set(groups.loc[rows["group"].unique(), "dataset"])):
        cells = []
        for group in sorted(rows["group"].unique()):
            g = groups.loc[group]
            if g.dataset != dataset:
                continue
            mine = rows[rows["group"] == group]
            same = found[found["group"] == group] if found is not None else None
            if same is None or not len(same):
                why = "; ".join(sorted(set(mine["platforms_reason"].dropna()))) or "no platform rows"
                cells.append([g.framework, g.profile, rounded(g.settings), "-", str(len(mine))]
                             + ["-"] * 9 + [why])
                continue
            for platform, one in sorted(same.groupby("platform"), key=lambda pair: order.get(pair[0], 99)):
                ok = one[one["status"] == "ok"]
                drop = (ok["accuracy"] - ok["own"]).dropna()
                cells.append([g.framework, g.profile, rounded(g.settings), platform,
                              f"{len(ok)}/{len(one)}",
                              _median_pct(ok["accuracy"]),
                              f"{round(100 * drop.median(), 2) + 0.0:+.2f}" if len(drop) else "-",
                              _most(ok["mismatches"]), _largest(ok["max_logit_error"]),
                              _median(ok["model_bytes"], lambda v: f"{v / 1e6:.2f}"),
                              _median(ok["latency_ms"], lambda v: f"{v:.3g}"),
                              _median(ok["throughput"], lambda v: f"{v:,.0f}"),
                              _median(ok["conversion_s"], _seconds),
                              _median_pct(ok["adversarial_accuracy"]),
                              "; ".join(sorted(set(one["reason"].dropna())))])
        if not cells:
            continue
        title = (f"Platforms on {dataset}: each trained model deployed after training (the "
                 "mobile runtime in float32 and 8-bit, ONNX Runtime 8-bit, a WebAssembly engine in "
                 "headless Chromium), median over the ok runs: its accuracy on the images the job "
                 "tested and the change in points against the framework's own, the most images it "
                 "classified otherwise, the largest relative logit error, its size, ms per image "
                 "at batch 1, images per second, the conversion's seconds, its accuracy on the "
                 "job's FGSM images")
        columns = ["framework", "profile", "settings", "platform", "ok", "acc %", "Δ pts", "mism.",
                   "logit err", "MB", "ms", "img/s", "convert s", "FGSM %", "why failed"]
        keys = ["framework", "profile", "settings", "platform", "ok", "accuracy", "drop", "mismatches",
                "error", "size", "latency", "throughput", "conversion", "fgsm", "why"]
        views.append(View(title, columns, cells, numeric=set(range(4, len(columns) - 1)),
                          wrap={2, len(columns) - 1}, keys=keys,
                          drop=["why", "settings", "conversion", "error", "throughput", "fgsm", "ok",
                                "profile"]))
    return views


def scaling_records(rows: pd.DataFrame) -> list[dict]:
    """The ok rows' distributed training beside one worker (``docs/distributed.md``), a
    record per kind of scaling, group and worker count (one worker included):

    - ``strong``: the global batch the same (the jobs of one settings group and their
      one-worker group: same settings, CPUs and threads);
    - ``weak``: each worker's share of the batch the same as one worker's whole batch (a
      job of N workers at batch N·b beside one worker at batch b, all else the same).

    Each holds the median training time and images per second over the runs, the
    speed-up (the one-worker time over this one for strong scaling; the images per second
    over one worker's for weak, as its steps are fewer), the efficiency (speed-up over
    workers), the slowest worker's time over the fastest's and the hosts the workers used.
    Empty where no row has several workers."""
    rows = rows[rows["status"] == "ok"]
    if "workers_n" not in rows or not (rows["workers_n"] > 1).any():
        return []
    rows = rows.assign(per_worker_batch=[
        (wb if pd.notna(wb) else b) for wb, b in zip(rows.get("worker_batch_size", rows["batch_size"]),
                                                     rows["batch_size"])],
        others=[_without_batch(h) for h in rows["hyperparameters"]],
        blas_asked=rows["blas"].fillna("") if "blas" in rows else "",
        onednn_asked=rows["onednn"].fillna("") if "onednn" in rows else "")
    records = []
    place = ["section", "framework", "dataset", "profile", "device", "threads"]
    for key, part in rows.groupby(place + ["settings_base"], sort=True, dropna=False):
        if (part["workers_n"] > 1).any():
            alone = part[part["workers_n"] == 1]["train_time_s"].median()
            for n, runs in part.groupby("workers_n", sort=True):
                records.append(_scaling_record("strong", key, key[-1], int(n), runs,
                                               alone / runs["train_time_s"].median()
                                               if alone == alone else None))
    same = place + ["others", "blas_asked", "onednn_asked"]
    based = set()
    for key, part in rows.groupby(same, sort=True, dropna=False):
        singles = part[part["workers_n"] == 1]
        for (n, share), runs in part[part["workers_n"] > 1].groupby(["workers_n", "per_worker_batch"], sort=True):
            base = singles[singles["batch_size"] == share]
            if base.empty:
                continue
            rate = base["train_images_per_s"].median()
            label = f"batch {int(share)} a worker"
            if (repr(key), label) not in based:
                based.add((repr(key), label))
                records.append(_scaling_record("weak", key, label, 1, base, 1.0))
            records.append(_scaling_record("weak", key, label, int(n), runs,
                                           runs["train_images_per_s"].median() / rate if rate else None))
    return records


def _without_batch(hyperparameters) -> str:
    try:
        found = json.loads(hyperparameters) if isinstance(hyperparameters, str) else {}
    except ValueError:
        found = {}
    return json.dumps({k: v for k, v in found.items() if k != "batch_size"}, sort_keys=True)


def _scaling_record(kind: str, key: tuple, label: str, n: int, runs: pd.DataFrame, speedup) -> dict:
    spread = [max(t) / min(t) for t in runs.get("worker_train_time_s", pd.Series(dtype=object))
              if t is not None and len(t) and min(t) > 0]
    nodes = pd.to_numeric(runs.get("nodes", pd.Series(dtype=float)), errors="coerce").dropna()
    return {"kind": kind, "key": key, "section": key[0], "framework": key[1], "dataset": key[2],
            "profile": key[3], "device": key[4], "label": label, "workers": n, "runs": len(runs),
            "nodes": int(nodes.max()) if len(nodes) else 1,
            "batch": int(runs["batch_size"].median()) if runs["batch_size"].notna().any() else None,
            "train_time_s": runs["train_time_s"].median(), "rate": runs["train_images_per_s"].median(),
            "speedup": speedup if speedup and speedup == speedup else None,
            "spread": max(spread) if spread else None, "accuracy": runs["accuracy"]}


def scaling_views(rep: paper.Report, section: paper.Section) -> list[View]:
    """A section's jobs trained over several workers beside one worker (``scaling_records``):
    a strong-scaling table, and a weak-scaling one where the rows hold both batches.  None
    where no row of the section has several workers."""
    records = [r for r in scaling_records(rep.rows) if r["section"] == section.index]
    views = []
    for kind, what in (("strong", "the global batch the same, beside one worker with the same settings "
                                  "and CPUs"),
                       ("weak", "each worker's share of the batch the same as one worker's whole batch, "
                                "beside that worker; the speed-up is in images per second")):
        cells = [[r["framework"], r["dataset"], r["profile"], rounded(r["label"]), str(r["workers"]),
                  str(r["nodes"]), str(r["runs"]), str(r["batch"] or "-"), _seconds(r["train_time_s"]),
                  _rate(r["rate"]), _rate(r["rate"] / r["workers"]) if r["rate"] == r["rate"] else "-",
                  f"{r['speedup']:.2f}" if r["speedup"] else "-",
                  f"{r['speedup'] / r['workers']:.2f}" if r["speedup"] else "-",
                  f"{r['spread']:.2f}" if r["spread"] else "-", _median_pct(r["accuracy"])]
                 for r in records if r["kind"] == kind]
        if not cells:
            continue
        title = (f"Distributed training, {kind} scaling: each job trained data-parallel over its "
                 f"workers ({what}); median over the ok runs of the training time, images per second "
                 "in all and per worker, the speed-up over one worker and its efficiency (speed-up / "
                 "workers), the slowest worker's training time over the fastest's, the accuracy; "
                 "nodes: the hosts the workers ran on")
        columns = ["framework", "data", "profile", "settings", "workers", "nodes", "runs", "batch",
                   "train s", "img/s", "img/s/worker", "speed-up", "efficiency", "slowest/fastest", "acc %"]
        keys = ["framework", "data", "profile", "settings", "workers", "nodes", "runs", "batch", "train",
                "rate", "rate_worker", "speedup", "efficiency", "spread", "accuracy"]
        views.append(View(title, columns, cells, numeric=set(range(4, len(columns))), wrap={3}, keys=keys,
                          drop=["settings", "spread", "nodes", "rate_worker", "runs", "batch", "profile"]))
    return views


def platform_records(rep: paper.Report) -> list[dict]:
    """Every platform row of the report's ok runs, with its run's group, data set and the
    framework's own accuracy, for the JSON report."""
    if rep.platforms is None or not len(rep.platforms):
        return []
    rows = rep.rows[rep.rows["status"] == "ok"][["run_id", "group", "framework", "dataset", "accuracy"]]
    found = rep.platforms.merge(rows.rename(columns={"accuracy": "own_accuracy"}), on="run_id")
    return [{k: (None if pd.isna(v) else v.item() if hasattr(v, "item") else v) for k, v in record.items()}
            for record in found.to_dict(orient="records")]


def _median_pct(values: pd.Series) -> str:
    values = values.dropna()
    return _pct(100 * values.median()) if len(values) else "-"


def _median(values: pd.Series, fmt) -> str:
    values = values.dropna()
    return fmt(values.median()) if len(values) else "-"


def _most(values: pd.Series) -> str:
    values = values.dropna()
    return str(int(values.max())) if len(values) else "-"


def _largest(values: pd.Series) -> str:
    values = values.dropna()
    return f"{values.max():.1e}" if len(values) else "-"


def transfer_views(rep: paper.Report, section: paper.Section) -> list[View]:
    """A section's transfer matrices (report/transfer.py), one table each: a row per run
    whose FGSM images are tried, a column per run whose ONNX model is, the accuracy %."""
    views = []
    for matrix in rep.transfer:
        if matrix.section != section.index:
            continue
        labels = [e.label for e in matrix.entries]
        cells = []
        for i, a in enumerate(matrix.entries):
            why = ([a.images_reason] if a.images_reason else
                   [f"{b.label}: {r}" for b, r in zip(matrix.entries, matrix.reasons[i]) if r])
            cells.append([a.label, _epsilon(a.epsilon) if a.epsilon is not None else "-",
                          str(a.images) if a.images else "-",
                          _pct(100 * a.own_fgsm) if a.own_fgsm is not None else "-"]
                         + [_pct(100 * v) if v is not None else "-" for v in matrix.accuracy[i]]
                         + ["; ".join(why)])
        title = (f"Transfer attacks on {matrix.dataset}, {matrix.profile} profile: accuracy % of "
                 "each column's ONNX model (onnxruntime) on each row's FGSM images at its ε, the "
                 "latest ok run of each; the diagonal is a model on its own white-box images, "
                 "about its own FGSM accuracy (\"own FGSM %\")")
        columns = ["images of", "ε", "images", "own FGSM %"] + [f"model: {label}" for label in labels] + ["why empty"]
        keys = ["images_of", "epsilon", "images", "own"] + [f"model{j}" for j in range(len(labels))] + ["why"]
        views.append(View(title, columns, cells, numeric=set(range(1, len(columns) - 1)),
                          wrap={0, len(columns) - 1}, keys=keys, drop=["why", "images", "epsilon"]))
    return views


def correlation_views(rep: paper.Report, section: paper.Section) -> list[View]:
    """A section's settings against its measures (report/correlations.py): a row per family
    and axis, a column per measure: ρ for an axis of numbers, ε² (and the best value) for
    one of names."""
    found = rep.correlations
    if found is None or not len(found):
        return []
    found = found[found["section"] == section.index]
    if not len(found):
        return []
    measures = [name for name, _ in correlations.MEASURES.values()]
    keys = ["framework", "dataset", "profile", "device", "axis"]
    cells = []
    for values, part in found.groupby(keys + ["values"], sort=False):
        by = {r.measure: r for r in part.itertuples()}
        cells.append(list(values[:4]) + [values[4].removeprefix("hp."), values[5],
                                         str(int(part["runs"].max()))]
                     + [_association(by[m]) if m in by else "" for m in measures])
    title = ("How the varied settings relate to the measures, over each family's ok runs: "
             "Spearman's ρ for a setting of numbers (-1 to 1; 1: the measure grows with it); "
             "for one of names the value with the best median and ×, the largest median over "
             "the smallest, with the Kruskal-Wallis ε² (0 to 1: the share of the measure's rank "
             "variance the values explain) where each value has 2 runs or more; each setting "
             "alone, whatever the others did")
    columns = ["framework", "data", "profile", "device", "setting", "values", "runs"] + measures
    return [View(title, columns, cells, numeric=set(range(6, len(columns))), wrap={5},
                 keys=["framework", "data", "profile", "device", "setting", "values", "runs",
                       "train", "accuracy", "cpu", "memory"],
                 drop=["values", "device", "runs", "profile"])]


def fair_views(rep: paper.Report, section: paper.Section) -> list[View]:
    """A section's fair runs (report/verification.py): their logits against the NumPy
    reference, where two frameworks' step losses part, and the speed of the same work."""
    rows = rep.rows[rep.rows["section"] == section.index]
    if not len(verification.fair_rows(rows)):
        return []
    views = []
    found = verification.logits(rows)
    if len(found):
        views.append(View(
            f"Fair profile, verified: each framework's logits of the probe images before "
            f"training against the NumPy reference of the same network and weights (the largest "
            f"difference over the largest reference logit; tolerance {fair.LOGIT_TOLERANCE:g})",
            ["data", "framework", "runs", "logit error", "within"],
            [[r.dataset, r.framework, str(r.runs), f"{r.logit_error:.2e}", "yes" if r.within else "NO"]
             for r in found.itertuples()], numeric={2, 3}, wrap=set(),
            keys=["data", "framework", "runs", "logit_error", "within"]))
    found = rep.fair_reference
    found = None if found is None else found[found["section"] == section.index]
    if found is not None and len(found):
        tolerances = ", ".join(f"{d} {t:.0e}".replace("e-0", "e-") for d, t in fair.REFERENCE_TOLERANCE.items())
        views.append(View(
            f"Fair profile, verified: each framework's first {fair.REFERENCE_STEPS} step losses "
            f"against the NumPy reference training (float64, the same weights, batches and "
            f"settings) under the framework's max-pooling tie rule (first: a tied window's "
            f"gradient to its first maximum; every: to each tied maximum): the largest relative "
            f"difference over its runs; tolerance, derived from float32 rounding: {tolerances}; "
            f"under the every rule only the steps before a tie that rounding decides (a tied "
            f"maximum neither 0 nor a bias: docs/fair.md)",
            ["data", "framework", "ties", "runs", "steps", "difference", "within"],
            [[r.dataset, r.framework, r.ties, str(r.runs), str(r.steps),
              "" if pd.isna(r.difference) else f"{r.difference:.2e}",
              f"not checked: {r.reason}" if pd.isna(r.within) else "yes" if r.within else "NO"]
             for r in found.itertuples()], numeric={3, 4, 5}, wrap={6},
            keys=["data", "framework", "ties", "runs", "steps", "difference", "within"]))
    found = verification.losses(rows, rep.steps)
    if len(found):
        views.append(View(
            f"Fair profile, verified: two frameworks' losses step by step (same weights, "
            f"batches and settings): the largest relative difference over the first "
            f"{fair.AGREED_STEPS} steps, and the first step (from 0) where they differ by more "
            f"than {fair.LOSS_TOLERANCE:g}",
            ["data", "framework", "other", "steps", f"first {fair.AGREED_STEPS}", "parts at"],
            [[r.dataset, r.framework, r.other, str(r.steps), f"{r.first_difference:.2e}",
              "never" if pd.isna(r.parts_at) else str(int(r.parts_at))] for r in found.itertuples()],
            numeric={3, 4, 5}, wrap=set(),
            keys=["data", "framework", "other", "steps", "first_difference", "parts_at"]))
    found = verification.speeds(rows)
    if len(found):
        views.append(View(
            "Fair speed: the same network, initial weights and batches in every framework, so "
            "this is a comparison of the frameworks' speed (the ratio tables above compare "
            "each framework's own default model); × is the median training time over the "
            "fastest framework's",
            ["data", "settings", "threads", "framework", "runs", "train s", "img/s", "×"],
            [[r.dataset, rounded(r.settings), _num(r.threads, str), r.framework, str(r.runs),
              _seconds(r.train_time_s), _num(r.images_per_s, lambda v: f"{v:,.0f}"), f"{r.ratio:.2f}"]
             for r in found.itertuples()], numeric={2, 4, 5, 6, 7}, wrap={1},
            keys=["data", "settings", "threads", "framework", "runs", "train", "images_per_s", "ratio"],
            drop=["settings", "threads", "runs"]))
    found = verification.op_times(rows, rep.ops)
    for dataset, part in found.groupby("dataset", sort=False):
        views.append(op_view(dataset, part))
    return views + today_views(rep, section)


# The frameworks of the "today" table: dlbench's own today's ones, and TensorFlow, the one of
# the study's that is still the choice of many
TODAY = (*catalog.TODAY_ORDER, "tensorflow")


def today_views(rep: paper.Report, section: paper.Section) -> list[View]:
    """Today's frameworks side by side, where a section has the fair runs of any of them: per
    data set and framework (``TODAY``), the fair network's step and compile time, accuracy and
    checks, beside the same section's quick runs of the framework's own model (its accuracy,
    PGD accuracy, the ONNX model's mismatches, and its verdict against the reference rows)."""
    rows = rep.rows[(rep.rows["section"] == section.index) & (rep.rows["status"] == "ok")
                    & rep.rows["framework"].isin(TODAY)]
    fair_runs = verification.fair_rows(rows)
    if not len(fair_runs) or not fair_runs["framework"].isin(catalog.TODAY_ORDER).any():
        return []
    logits = verification.logits(fair_runs).set_index(["dataset", "framework"])["within"]
    trained = rep.fair_reference
    trained = (pd.Series(dtype=object) if trained is None else
               trained[trained["section"] == section.index].set_index(["dataset", "framework"])["within"])
    verdicts = {}
    if rep.against_reference is not None:
        for g in rep.against_reference.groups.itertuples():
            verdicts[g.group] = g.verdict
    quick = rows[rows["profile"] == contract.QUICK_PROFILE]
    cells = []
    for (dataset, framework), part in fair_runs.groupby(["dataset", "framework"], sort=True):
        steps = part["hyperparameters"].map(lambda text: json.loads(text).get("steps"))
        step_ms = (1000 * part["train_time_s"] / steps.astype(float)).median()
        compiled = part["compile_time_s"].dropna() if "compile_time_s" in part else []
        verified = _verified(logits.get((dataset, framework)), trained.get((dataset, framework)))
        own = quick[(quick["dataset"] == dataset) & (quick["framework"] == framework)]
        cells.append([dataset, framework, f"{step_ms:.1f}", _seconds(compiled.median()) if len(compiled) else "-",
                      _pct(100 * part["accuracy"].median()), verified]
                     + _own_cells(rep, own, verdicts))
    return [View(
        "Today's frameworks: the fair network in each (its mean training step, the seconds "
        "compiled ahead, its accuracy, and whether its logits and first losses matched the "
        "NumPy reference), beside the quick runs of its own model on this machine (their "
        "median accuracy, PGD accuracy, the most test images the ONNX model classified "
        "otherwise, and the verdict against dlbench's reference rows)",
        ["data", "framework", "fair step ms", "compile s", "fair %", "verified", "own model",
         "own %", "PGD %", "ONNX mism.", "verdict"], cells,
        numeric={2, 3, 4, 7, 8, 9}, verdicts={10}, wrap={6, 10},
        keys=["data", "framework", "step", "compile", "fair_accuracy", "verified", "model",
              "accuracy", "pgd", "mismatches", "verdict"],
        drop=["model", "mismatches", "pgd", "compile"])]


def _verified(*checks) -> str:
    """Whether a fair run matched the reference: "NO" where a check failed, "yes" where
    every check passed, else "not checked"."""
    known = [bool(c) for c in checks if c is not None and not pd.isna(c)]
    if not all(known):
        return "NO"
    return "yes" if len(known) == len(checks) else "not checked"


def _own_cells(rep: paper.Report, own: pd.DataFrame, verdicts: dict) -> list[str]:
    """The cells of a framework's quick runs of its own model (dashes where it has none)."""
    if not len(own):
        return ["-", "-", "-", "-", "no quick run"]
    pgd = "-"
    if rep.robustness is not None and len(rep.robustness):
        attacked = rep.robustness[rep.robustness["run_id"].isin(own["run_id"])
                                  & (rep.robustness["attack"] == "pgd")]["accuracy"].dropna()
        pgd = _pct(100 * attacked.median()) if len(attacked) else "-"
    mismatches = own["migration_mismatches"].dropna() if "migration_mismatches" in own else []
    found = {verdicts[g] for g in own["group"] if g in verdicts}
    return [own["model"].iloc[0], _pct(100 * own["accuracy"].median()), pgd,
            str(int(mismatches.max())) if len(mismatches) else "-",
            "; ".join(sorted(found)) or "not judged"]


def op_view(dataset: str, part: pd.DataFrame) -> View:
    """Where one data set's fair time goes: a row per layer, the sum of the layers, the
    network timed whole and the training's step; a column per framework, its forward and
    backward milliseconds together (the JSON and the page have them apart)."""
    frameworks = list(dict.fromkeys(part["framework"]))
    by = {(r.framework, r.layer): r for r in part.itertuples()}
    layers = part[part["index"] >= 0].drop_duplicates("layer").sort_values("index", kind="stable")

    def ms(value) -> str:
        return "" if value is None or pd.isna(value) else f"{value * 1e3:.1f}"

    def both(r) -> str:
        return "" if r is None else ms(r.forward_s + r.backward_s)

    cells = [[r.layer, r.shape] + [both(by.get((f, r.layer))) for f in frameworks]
             for r in layers.itertuples()]
    sums = []
    for f in frameworks:
        own = part[(part["framework"] == f) & (part["index"] >= 0)]
        sums.append(ms(own["forward_s"].sum() + own["backward_s"].sum()) if len(own) else "")
    cells.append(["layers", "sum"] + sums)
    cells.append(["network", "as one"] + [both(by.get((f, "network"))) for f in frameworks])
    cells.append(["step", "training's"] + [ms(getattr(by.get((f, "step")), "step_s", None))
                                           for f in frameworks])
    return View(
        f"Where the fair time goes, {dataset}: milliseconds of each layer's forward and backward "
        f"pass, timed alone at its training shape (input with the batch; medians), their sum, the "
        f"network timed as one model, and the training's mean step (data, loss and update "
        f"included); the JSON and the page give forward and backward apart",
        ["layer", "input"] + frameworks, cells, numeric=set(range(2, 2 + len(frameworks))), wrap=set(),
        keys=["layer", "input"] + frameworks, drop=["input"])


def correlation_records(rep: paper.Report) -> list[dict]:
    """The correlation table's records, for the JSON report."""
    found = rep.correlations
    if found is None or not len(found):
        return []
    records = found.to_dict(orient="records")
    for record in records:
        record["section"] = int(record["section"])
        record["runs"] = int(record["runs"])
        for key in ("value", "spread"):
            record[key] = None if pd.isna(record[key]) else float(record[key])
    return records


def _association(record) -> str:
    def given(value):
        return value is not None and not pd.isna(value)
    if record.statistic == "rho":
        return f"ρ {record.value:+.2f}" if given(record.value) else "-"
    found = f"{record.best}" + (f" ×{record.spread:.2f}" if given(record.spread) else "")
    return (f"ε² {record.value:.2f}, " if given(record.value) else "") + found


def transfer_records(rep: paper.Report) -> list[dict]:
    """Every cell of the transfer matrices, for the JSON report."""
    return [record for matrix in rep.transfer for record in matrix.records()]


def robustness_records(rep: paper.Report) -> list[dict]:
    """The robustness tables as records, for the JSON report: one per group, attack and
    epsilon."""
    found = rep.robustness
    if found is None or not len(found):
        return []
    rows = rep.rows[rep.rows["status"] == "ok"][["run_id", "section", "group", "framework", "dataset",
                                                 "device", "profile", "settings"]]
    merged = found.merge(rows, on="run_id")
    keys = ["section", "group", "framework", "dataset", "device", "profile", "settings", "attack",
            "epsilon", "steps"]
    records = []
    for values, part in merged.groupby(keys, sort=False):
        accuracy, seconds = part["accuracy"].dropna(), part["time_s"].dropna()
        records.append(dict(zip(keys, values)) | {
            "images": int(part["images"].max()), "runs": int(part["run_id"].nunique()),
            "accuracy_median": float(accuracy.median()) if len(accuracy) else None,
            "accuracy_min": float(accuracy.min()) if len(accuracy) else None,
            "accuracy_max": float(accuracy.max()) if len(accuracy) else None,
            "time_s_median": float(seconds.median()) if len(seconds) else None,
            "attack_loss": sorted(set(part["attack_loss"].dropna())) if "attack_loss" in part else [],
            "vanished_share_max": vanished_share(part),
            "reasons": sorted(set(part["reason"].dropna()) | _attack_notes(part))})
    for record in records:
        for key in ("section", "group", "steps"):
            record[key] = int(record[key])
        record["epsilon"] = float(record["epsilon"])
    return records


def _epsilon(value: float) -> str:
    """An epsilon as it was likely written: 4/255 for a multiple of 1/255 below 0.1, else
    the number."""
    steps = value * 255
    if 0 < value < 0.1 and abs(steps - round(steps)) < 1e-6:
        return f"{round(steps)}/255"
    return f"{value:g}"


def _disturbed(rows: pd.DataFrame) -> View:
    """The runs the noise rule marks, and why (``noise.RULE``)."""
    columns = ["run", "framework", "data", "profile", "train s", "CPU %", "load", "why disturbed"]
    cells = [[r.run_id[:8], r.framework, r.dataset, r.profile, _num(r.train_time_s, _seconds),
              _num(r.cpu_percent_mean, _percent), _num(r.host_load_avg, lambda v: f"{v:.2f}"),
              r.disturbed] for r in rows.sort_values("recorded_at").itertuples()]
    return View("Disturbed runs: other work took CPUs from them", columns, cells,
                numeric={4, 5, 6}, wrap={7}, keys=DISTURBED_KEYS, drop=DISTURBED_DROP)


def _against_paper(groups: pd.DataFrame) -> View:
    """The group's accuracy and times beside the published cell: the times held against the
    published ones are the paper spans where the group has them (the "span" column says)."""
    columns = SETTINGS[:5] + ["accuracy %", "published accuracy %", "Δ points", "accuracy verdict",
                              "caveats", "train s", "published train s", "test s",
                              "published test s †", "times held against the paper"]
    rows = []
    for g in groups.itertuples():
        train = "paper_train_time_s" if g.train_time_span == paper.PAPER_SPAN else "train_time_s"
        test = "paper_test_time_s" if g.test_time_span == paper.PAPER_SPAN else "test_time_s"
        rows.append([g.framework, g.dataset, g.device, g.profile, rounded(g.settings)] + [
            _num(g.accuracy_pct_median, _pct), _num(g.published_accuracy_pct, _pct),
            _num(g.accuracy_diff_points, lambda v: f"{v:+.2f}"), rounded(g.accuracy_verdict),
            _caveats(g.accuracy_caveats),
            _num(getattr(g, f"{train}_median"), _seconds), _num(g.published_train_time_s, _published),
            _num(getattr(g, f"{test}_median"), _seconds),
            _num(g.published_test_time_s, _published)
            + (" †" if paper.present(g.published_test_time_note) else ""),
            _spans(g)])
    return View("Against the paper (GTDLBench, Server1)", columns, rows,
                numeric={5, 6, 7, 10, 11, 12, 13}, verdicts={8}, wrap={4, 8, 9, 14},
                keys=AGAINST_KEYS, drop=AGAINST_DROP)


def _spans(g) -> str:
    if g.train_time_span == paper.PAPER_SPAN and g.test_time_span == paper.PAPER_SPAN:
        return paper.PAPER_SPAN
    return f"train: {g.train_time_span}; test: {g.test_time_span}"


def _ratios(groups: pd.DataFrame) -> View:
    """Every group's training-time ratio and its verdict; a group in no ratio set (alone on its
    device, or with other settings) shows only why it is not comparable."""
    columns = ["framework", "data", "device", "profile", "settings", "threads", "span", "train s",
               "÷ baseline here", "÷ baseline in paper", "here ÷ paper", "ratio verdict", "caveats"]
    rows = []
    for g in groups.itertuples():
        if paper.present(g.ratio_baseline):
            train = "paper_train_time_s" if g.ratio_span == paper.PAPER_SPAN else "train_time_s"
            measured = [g.ratio_span, _num(getattr(g, f"{train}_median"), _seconds),
                        f"{_ratio(g.train_time_ratio)} (÷ {g.ratio_baseline})",
                        _num(g.published_train_time_ratio, _ratio), _num(g.ratio_vs_published, _ratio)]
        else:
            measured = ["-"] * 5
        rows.append(_setting_cells(g) + measured + [rounded(g.ratio_verdict), _caveats(g.ratio_caveats)])
    return View("Training-time ratios: times differ across machines, ratios compare", columns, rows,
                numeric={7, 8, 9, 10}, verdicts={11}, wrap={4, 11, 12}, keys=RATIO_KEYS,
                drop=RATIO_DROP)


def _caveats(caveats) -> str:
    return "; ".join(caveats) if len(caveats) else "-"


def _stat(g, metric: str, fmt) -> str:
    median, low, high = (getattr(g, f"{metric}_{s}") for s in ("median", "min", "max"))
    if not paper.present(median):
        return "-"
    text = fmt(median)
    if g.ok > 1 and high > low:
        text += f" [{fmt(low)}–{fmt(high)}]"
    return text


def _num(value, fmt) -> str:
    return fmt(value) if paper.present(value) else "-"


# --- two sets of runs (`dlbench compare`) ---

COMPARISON_KEYS = ["group", "a", "b", "ratio", "p", "verdict", "a_runs", "b_runs", "versions",
                   "images", "machines"]
COMPARISON_DROP = ["machines", "images", "versions", "b_runs", "a_runs", "p"]


def comparison_view(cmp) -> View:
    """One line per pair of groups (``compare.Comparison``): medians, B ÷ A, p, verdict."""
    _, _, unit, _ = compare.METRICS[cmp.metric]
    fmt = _pct if unit == "%" else _seconds
    columns = ["group", f"A {unit}", f"B {unit}", "B ÷ A [95% CI]", "p", "verdict", "A runs",
               "B runs", "framework version A / B", "image A / B", "machine A / B"]
    rows = []
    for g in cmp.groups.itertuples():
        threads = _pair_of(g.a_split, g.b_split, "threads")
        across = "".join(f"; {k} {_pair_of(g.a_split, g.b_split, k)}" for k in cmp.across)
        group = f"{g.framework} {g.dataset} {g.device} {g.profile}, {rounded(g.settings)}{across}, " + (
            f"threads {threads}" if "/" in threads else f"{threads} threads")
        ratio = "-" if not paper.present(g.ratio) else _ratio(g.ratio) + (
            f" [{_ratio(g.ratio_low)}–{_ratio(g.ratio_high)}]" if paper.present(g.ratio_low) else "")
        rows.append([group, _num(g.a_median, fmt), _num(g.b_median, fmt), ratio,
                     _num(g.p_value, _p), g.verdict, _runs(g.a_runs, g.a_disturbed),
                     _runs(g.b_runs, g.b_disturbed)]
                    + [_pair_of(g.a_split, g.b_split, k) for k in ("framework_version", "image_id",
                                                                    "host_name")])
    return View(f"{cmp.metric}: B ({cmp.b.label}) against A ({cmp.a.label})", columns, rows,
                numeric={1, 2, 3, 4, 6, 7}, verdicts=set(), wrap={0, 3, 5, 6, 7, 8, 9, 10},
                keys=COMPARISON_KEYS, drop=COMPARISON_DROP)


def _runs(runs, disturbed) -> str:
    if not paper.present(runs):
        return "-"
    return f"{int(runs)}" + (f" ({int(disturbed)} disturbed)" if disturbed else "")


def _pair_of(a, b, key: str) -> str:
    def one(split):
        if not isinstance(split, dict) or not paper.present(split.get(key)):
            return "-"
        value = str(split[key])
        return value.removeprefix("sha256:")[:12] if key == "image_id" else value
    return one(a) if one(a) == one(b) else f"{one(a)} / {one(b)}"


def _p(v: float) -> str:
    return "<0.001" if v < 0.001 else f"{v:.3f}"


# --- the plan (`dlbench run --dry-run`) ---

PLAN_KEYS = ["job", "framework", "data", "model", "profile", "device", "threads", "changed", "repeat",
             "estimate", "note"]
PLAN_DROP = ["model", "repeat", "threads", "estimate", "device"]


def plan_view(jobs, seconds) -> View:
    """The jobs of a plan, one a line: what each is, what it changes from its profile's
    defaults, and ``seconds(job)``, its estimated time on this machine (None: not known)."""
    from .estimate import duration

    rows = []
    for n, job in enumerate(jobs, 1):
        changed = [f"{k}={v}" for k, v in job.overrides.items()]
        changed += [f"{k}={v}" for k, v in (("release", job.version),
                                             ("settings_from", job.settings_from), ("blas", job.blas),
                                             ("onednn", job.onednn), ("workers", job.workers),
                                             ("cpus", job.cpus),
                                             ("gpu", job.gpu)) if v is not None]
        took = None if job.unsupported else seconds(job)
        rows.append([str(n), job.framework, job.dataset, job.model, job.profile, job.device,
                     str(job.threads), rounded(", ".join(changed)) or "-", str(job.repeat),
                     "-" if took is None else duration(took),
                     f"not run: {job.unsupported}" if job.unsupported else ""])
    return View(f"{len(jobs)} planned job(s), in the order they run",
                ["#", "framework", "data", "model", "profile", "device", "threads", "changed",
                 "repeat", "about", "note"], rows, numeric={0, 6, 8, 9}, wrap={7, 10},
                keys=PLAN_KEYS, drop=PLAN_DROP)
