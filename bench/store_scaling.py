#!/usr/bin/env python3
"""How the results store and the report scale with the number of stored runs.

For each size N (default 1,000 and 10,000) a fresh temporary results directory is
filled as `dlbench run` fills it: per job, one trace file (``store.write_trace``, ~100
samples) and one row file (``store.append``, one row per call, or --rows-per-file rows).
Then the directory is compacted (``store.compact``, as ``dlbench run`` does past 200 row
files; ``--no-compact`` skips it), the rows are loaded (``store.load``), the traces loaded
(``store.load_traces``) and the report built (``report.make_report``, Markdown, so no
terminal or HTML rendering).

Every phase runs in a fresh child process (multiprocessing "spawn"), which reports its
own wall time and its peak resident set size (``getrusage(RUSAGE_SELF).ru_maxrss``, the
kernel's high-water mark): honest for the whole process, including the interpreter and
the imports, whose share (measured right after importing) is printed too.

Prints the figures, the growth factor between the smallest and largest size, and whether
the goals hold: linear growth, and the report under 5 s at 10,000 rows.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import multiprocessing
import os
import random
import resource
import shutil
import tempfile
import time
from pathlib import Path

from _common import Parser, header, positive_int

REPORT_GOAL_S, REPORT_GOAL_ROWS = 5.0, 10_000
LINEAR_SLACK = 1.5   # "linear": grows at most 1.5 x the size ratio (noise, caches)


def positive_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be integers of 1 or more: {text!r}")
    return sorted(set(values))


# -- synthetic runs -------------------------------------------------------------------------
# data set -> (training seconds of the paper profile, accuracy paper, quick); framework -> slowdown
SHAPE = {"mnist": (600.0, 0.99, 0.95), "cifar10": (3000.0, 0.75, 0.40)}
SPEED = {"caffe": 1.0, "tensorflow": 1.6, "torch": 2.2, "pytorch": 2.2, "mxnet": 1.3, "theano": 3.0}


def make_job(rng: random.Random, index: int, samples: int):
    """One job's row (a RunRecord) and its trace samples, shaped like real ones."""
    from orchestrator import __version__, catalog, hostinfo
    from orchestrator.report import paper
    from orchestrator.records import RunRecord
    from orchestrator.schema import dumps
    from dlbench_runner.contract import PAPER_PROFILE, QUICK_PROFILE

    fw, ds = rng.choice(catalog.STUDY_ORDER), rng.choice(catalog.DATASETS)
    profile, threads = rng.choice((PAPER_PROFILE, QUICK_PROFILE, QUICK_PROFILE)), rng.choice((None, 1, 2))
    models = catalog.models(fw)
    hp = paper.defaults(fw, ds, profile)          # the framework's models.json values
    base_s, acc_paper, acc_quick = SHAPE[ds]
    images = models["models"][ds]["settings"]["train_images"]
    train = base_s * SPEED[fw] * (1 if profile == PAPER_PROFILE else 0.05) * rng.uniform(0.9, 1.1)
    epochs = min(int(hp.get("epochs", 10)), 300)
    start = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=index)
    run_id = f"{rng.getrandbits(64):016x}"
    row = dict(
        run_id=run_id, job_id=f"{rng.getrandbits(64):016x}", status="ok", exit_code=0,
        campaign="bench", framework=fw, dataset=ds, model=models["models"][ds]["model"],
        profile=profile, hyperparameters=dumps(hp), batch_size=hp.get("batch_size"),
        learning_rate=hp.get("learning_rate"), device="cpu", seed=index % 7,
        repeat=index % 3, threads=threads, setup_time_s=rng.uniform(2, 20),
        train_time_s=train, test_time_s=train * 0.02, total_time_s=train * 1.05,
        accuracy=min(1.0, (acc_paper if profile == PAPER_PROFILE else acc_quick) + rng.gauss(0, 0.005)),
        test_loss=rng.uniform(0.02, 1.5), train_images_per_s=images * epochs / train,
        test_images_per_s=10000 / (train * 0.02), train_samples=images, test_samples=10000,
        param_count=rng.randint(400_000, 1_700_000),
        epoch_loss=[2.3 / (e + 1) for e in range(epochs)],
        epoch_accuracy=[acc_paper * (1 - 0.5 / (e + 1)) for e in range(epochs)],
        epoch_time_s=[train / epochs] * epochs,
        framework_version=models["version"], python_version="3.9.2", device_name="cpu",
        blas="openblas 0.3.13", threads_env=dumps({"OMP_NUM_THREADS": str(threads or 2)}),
        threads_framework=dumps({"intra_op": threads or 2}),
        libraries=dumps({"numpy": "1.19.5", fw: models["version"]}),
        started_at=start, finished_at=start + dt.timedelta(seconds=train * 1.05),
        wall_time_s=train * 1.1, memory_limit_bytes=8 << 30, timeout_s=86400.0,
        cpu_percent_mean=rng.uniform(90, 200), memory_peak_bytes=rng.randint(300, 3000) << 20,
        memory_peak_cgroup_bytes=rng.randint(300, 3000) << 20, trace_samples=samples,
        image=f"dlbench/{fw}:cpu", image_id=f"sha256:{rng.getrandbits(256):064x}",
        dlbench_version=__version__, docker_version="27.5.1", host_name="bench-host",
        host_cpu_model=hostinfo.cpu_model(), host_cpus=os.cpu_count(),
        host_memory_gb=hostinfo.memory_gb(), host_os="Linux 6.1",
        dataset_sha256=f"{rng.getrandbits(256):064x}", recorded_at=start)
    if rng.random() < 0.02:                         # a few jobs fail, without measurements
        row.update(status=rng.choice(("failed", "timeout", "oom")), exit_code=137,
                   error="the container exited with code 137 (SIGKILL)", accuracy=None,
                   train_time_s=None, test_time_s=None, epoch_loss=[], epoch_accuracy=[],
                   epoch_time_s=[], log_tail="Killed")
    step = row["wall_time_s"] / max(samples, 1)
    trace = [{"t_s": i * step, "cpu_percent": rng.uniform(80, 200),
              "memory_bytes": (200 << 20) + i * (4 << 20), "gpu_util": None,
              "gpu_memory_bytes": None} for i in range(samples)]
    return RunRecord(**row), trace


# -- the phases, each run in a fresh child process ------------------------------------------
def phase(name: str, results: str, rows: int, rows_per_file: int, samples: int, seed: int):
    """Run one phase; return (seconds, details, peak RSS bytes, RSS after imports)."""
    from orchestrator import report, store
    from orchestrator.report import paper, text
    imported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB
    folder, details = Path(results), {}
    start = time.perf_counter()
    if name == "append":      # time only the store's writes, not making the synthetic rows
        rng, spent, pending = random.Random(seed), {"rows": 0.0, "traces": 0.0}, []
        for index in range(rows):
            record, trace = make_job(rng, index, samples)
            t = time.perf_counter()
            store.write_trace(folder, record.run_id, trace)
            spent["traces"] += time.perf_counter() - t
            pending.append(record)
            if len(pending) == rows_per_file or index == rows - 1:
                t = time.perf_counter()
                store.append(folder, pending)
                spent["rows"] += time.perf_counter() - t
                pending = []
        seconds, details = spent["rows"] + spent["traces"], spent
    elif name == "compact":
        rows, traces, *_ = store.compact(folder)       # then the other side tables
        details.update({"row files merged": rows, "trace files merged": traces})
    elif name == "load rows":
        details["rows"] = len(store.load(folder))
    elif name == "load traces":
        details["samples"] = len(store.load_traces(folder))
    else:                     # the whole `dlbench report`, its steps timed as it calls them
        for module, attr in ((store, "load"), (store, "load_traces"), (paper, "build"),
                             (text, "render_report")):
            _time_calls(module, attr, details)
        page = Path(results) / "_html" if name == "report html" else None
        if page:              # imported here: the HTML page alone needs plotly
            from orchestrator.report import html
            _time_calls(html, "write_page", details)
        report.make_report(folder, None if page else "md", page, 1.0)
    if name != "append":
        seconds = time.perf_counter() - start
    return seconds, details, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, imported


def _time_calls(module, attr, spent: dict) -> None:
    """Wrap module.attr (in this child only) to add its time to spent[attr]."""
    original = getattr(module, attr)

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[attr] = spent.get(attr, 0.0) + time.perf_counter() - t
    setattr(module, attr, timed)


def in_child(*args):
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(phase, *args).result()


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=positive_ints, default=[1000, 10000],
                        help="comma-separated numbers of stored runs (default 1000,10000)")
    parser.add_argument("--rows-per-file", type=positive_int, default=1,
                        help="rows per store.append call; 1 is what `dlbench run` does (default 1)")
    parser.add_argument("--samples", type=positive_int, default=100,
                        help="trace samples per job (default 100)")
    parser.add_argument("--html", action="store_true", help="also time the report's HTML page")
    parser.add_argument("--no-compact", action="store_true",
                        help="read the directory as appended, one file per job (no compaction)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to make the temporary results directories (default: $TMPDIR)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the synthetic rows (default 1)")
    args = parser.parse_args()
    if args.dir is not None and not args.dir.is_dir():
        parser.error(f"--dir {args.dir}: no such directory")
    header()
    print(f"setup    one trace file per job ({args.samples} samples), {args.rows_per_file} row(s) "
          f"per row file{'' if args.no_compact else ', then compacted'}; each phase in a fresh "
          f"process; peak = peak RSS of that process\n")
    phases = ["append"] + ([] if args.no_compact else ["compact"]) + \
        ["load rows", "load traces", "report"] + (["report html"] if args.html else [])
    figures = {}                                   # (phase, size) -> (seconds, details, peak, base)
    for size in args.sizes:
        folder = Path(tempfile.mkdtemp(prefix=f"dlbench-bench-{size}-", dir=args.dir))
        try:
            for name in phases:
                figures[name, size] = result = in_child(name, str(folder), size, args.rows_per_file,
                                                        args.samples, args.seed)
                counted = "".join(f"  ({v:,} {k})" for k, v in result[1].items() if isinstance(v, int))
                print(f"  {size:>7,} rows  {name:<12} {result[0]:8.2f} s  "
                      f"peak {result[2] / 2**20:7.0f} MiB{counted}", flush=True)
            files = list(folder.rglob("*.parquet"))
            print(f"  {size:>7,} rows  on disk: {len(files):,} files, "
                  f"{sum(f.stat().st_size for f in files) / 2**20:.1f} MiB\n")
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    summarize(figures, phases, args)


def summarize(figures: dict, phases: list[str], args) -> None:
    small, large, many = args.sizes[0], args.sizes[-1], len(args.sizes) > 1
    ratio, slack = large / small, large / small * LINEAR_SLACK
    print(f"{'phase':<14}" + "".join(f"{f'{n:,} rows':>24}" for n in args.sizes)
          + (f"{f'growth x{ratio:g} rows':>22}" if many else ""))
    print(f"{'':<14}" + f"{'seconds':>12}{'peak MiB':>12}" * len(args.sizes)
          + (f"{'time':>11}{'peak*':>11}" if many else ""))
    slower = []                                     # phases and report steps worse than linear
    for name in phases:
        line = f"{name:<14}" + "".join(f"{figures[name, n][0]:12.2f}{figures[name, n][2] / 2**20:12.0f}"
                                       for n in args.sizes)
        if many:
            (t0, _, m0, b0), (t1, _, m1, b1) = figures[name, small], figures[name, large]
            line += f"{t1 / t0:10.1f}x{max(m1 - b1, 0) / max(m0 - b0, 1):10.1f}x"
            slower += [f"{name} {t1 / t0:.1f}x"] if t1 / t0 > slack else []
        print(line)
    if many:
        print(f"* peak memory growth above what the imports alone take "
              f"({figures['report', small][3] / 2**20:.0f} MiB)")
    print("\nbreakdown (seconds)")
    for n in args.sizes:
        for name in [p for p in phases if p.startswith(("append", "report"))]:
            print(f"  {n:>7,} rows  {name:<12} " + ", ".join(f"{k} {v:.2f}" for k, v in figures[name, n][1].items()))
        row_files, spent = -(-n // args.rows_per_file), figures["append", n][1]
        if not args.no_compact:
            continue
        print(f"  {n:>7,} rows  per file (ms): write row file {1000 * spent['rows'] / row_files:.2f}, "
              f"trace file {1000 * spent['traces'] / n:.2f}; read row file "
              f"{1000 * figures['load rows', n][0] / row_files:.2f}, trace file {1000 * figures['load traces', n][0] / n:.2f}")
    if many:
        steps = figures["report", large][1]
        slower += [f"report step {k} {v / figures['report', small][1][k]:.1f}x" for k, v in steps.items()
                   if v > 0.1 and v / max(figures["report", small][1][k], 1e-9) > slack]
    print("\ngoals")
    if many:
        print(f"  linear growth (at most {LINEAR_SLACK}x the size ratio): " +
              (f"MISSED: {', '.join(slower)} for {ratio:g}x rows" if slower else "met"))
    if REPORT_GOAL_ROWS not in args.sizes:
        print(f"  report under {REPORT_GOAL_S:g} s at {REPORT_GOAL_ROWS:,} rows: not measured "
              f"(add {REPORT_GOAL_ROWS} to --sizes)")
        return
    seconds, _, peak, _ = figures["report", REPORT_GOAL_ROWS]
    top = sorted(figures["report", REPORT_GOAL_ROWS][1].items(), key=lambda kv: -kv[1])[:3]
    print(f"  report under {REPORT_GOAL_S:g} s at {REPORT_GOAL_ROWS:,} rows: "
          + (f"met ({seconds:.2f} s)" if seconds < REPORT_GOAL_S else
             f"MISSED ({seconds:.2f} s; most in {', '.join(f'{k} {v:.1f} s' for k, v in top)})"))


if __name__ == "__main__":
    main()
