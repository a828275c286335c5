"""What dlbench itself costs: the same quick job run three (or four) ways, alternating.

    (a) plain      the framework's training loop in its image, driven by
                   bench/plain_loop.py: no runner, no events, no result file (the
                   container started as in (b), the script mounted at /bench)
    (b) runner     the dlbench runner in the same image, its container started with
                   dlbench's own options (runtimes/docker.container_options: job
                   directory, mounts, limits, hardening), result.json read back
    (c) dlbench    `dlbench run --repeats 4` end to end: CLI, image check, data
                   verification, four containers one after another, trace, collection,
                   Parquet writes, the summary
    (d) native     with --native-python: `dlbench run --runtime native` on the host

Printed per framework (medians over the rounds):
    b/a      training throughput of the runner over the plain loop       goal >= 0.98
    c/b      wall time of `dlbench run` a job over the runner's container
    check    the migration check on the host after each job (the job's ONNX model
             run with onnxruntime on the images it tested): a measurement of its own,
             not the harness, so left out of the two below
    per job  what each job adds around its runner's own total: from one runner's end to
             the next one's start (the container stopped and removed, the job's row and
             trace stored, the next container created and started, its Python started),
             the check left out; the median of the gaps after the first, which also
             holds the run's first write (pyarrow imports pandas)          goal < 1 s
    per run  what the run adds once: `dlbench run`'s wall time less the runners' totals,
             the checks and the per-job share of each job (Python's start and imports,
             the plan, the data and image checks, the summary at the end)
    d/c   native throughput over the container's (--native-python)    goal >= 0.97

With --checks, instead: the quick profile of each framework on both data sets, one job each
a round, and for each job what its checks after training cost against its training and
testing: the robustness check (FGSM and PGD on the quick profile's images, in the job), the
ONNX export (in the job), the migration check (the host runs the model) and, where the jobs
ask for any (``--platforms``, none by default in the quick profile), the deployments on the
platforms ("host": the two on the host), summed, over
train_time_s + test_time_s                                          goal <= 0.10
Beside it, ``work``: the checks' model work over the job's, counted in passes of one image
through the model, an estimate of what the share would be if every pass cost what a
training pass costs:

    checks   the attacks on R images (a clean prediction, the gradient, four FGSM
             predictions, ten PGD gradients and their prediction: 17 forward passes and
             11 backward ones, each of those one more pass, since an attack needs no
             weight gradients: 28 R) and the host's pass over the T tested images (T)
    job      training S images (forward, and a backward pass for the activations and one
             for the weights: 3 S) and testing T

    work = (28 R + T) / (3 S + T)

The gradient check, the export and the programs' starts come on top; batches of 100 (the
attacks') or 500 (the host's) against training's smaller ones make the checks' passes
cheaper.  Where ``work`` is far above the goal, the share is the quick profile's brief
training, not the checks' code.

The order of the ways rotates each round so that none always runs first.  Run it on a
quiet machine: every way trains for real, and other load moves the figures.

    python bench/overhead.py --data-dir DIR [--frameworks caffe,torch] [--rounds 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from dlbench_runner.contract import QUICK_PROFILE  # noqa: E402
from orchestrator import build, catalog, datasets, hostinfo, jobdir, owners, plan  # noqa: E402
from orchestrator.options import Axes  # noqa: E402
from orchestrator.runtimes import docker as docker_runtime, native  # noqa: E402

GOALS = {"b/a": 0.98, "per job": 0.5, "d/c": 0.97, "checks": 0.10}
CHECKS = ("robustness_time_s", "migration_time_s", "migration_host_time_s", "platforms_time_s")
PASSES_PER_ATTACKED = 17 + 11       # an attacked image's passes, forward and backward (``work``)


def fail(message: str) -> None:
    sys.stderr.write(f"overhead: error: {message}\n")
    sys.exit(2)


def job_of(client, framework, cpus):
    """The quick MNIST job as `dlbench run --cpus N` plans it, with dlbench's default memory limit."""
    job, = plan.expand(Axes(frameworks=[framework], datasets=["mnist"], profiles=[QUICK_PROFILE],
                            threads=[cpus])).jobs
    return job.model_copy(update={"memory_bytes": docker_runtime.default_memory(client)})


def container_run(client, job, data, scratch, owner, command=None, entrypoint=None, mounts=None):
    """Start one container exactly as dlbench starts a job's (its options, job directory,
    mounts, limits and hardening), with another command if given; returns (wall seconds,
    exit code, output, job directory)."""
    job_dir = Path(tempfile.mkdtemp(dir=scratch)) / "jobs" / "bench"
    job_dir.mkdir(parents=True)
    docker_runtime.prepare_job_dir(job_dir, job.spec("bench", "0" * 16)).close()
    kwargs = docker_runtime.container_options(job, build.image_tag(job.framework), "bench", "0" * 16,
                                              job_dir, data / "mnist", owner.token)
    kwargs["labels"][f"{build.LABEL}.role"] = "bench"
    if command is not None:
        kwargs["command"] = command
    if entrypoint is not None:
        kwargs["entrypoint"] = entrypoint
    kwargs["volumes"].update(mounts or {})
    started = time.perf_counter()
    container = client.containers.run(**kwargs)
    try:
        code = container.wait()["StatusCode"]
        wall = time.perf_counter() - started
        return wall, code, container.logs().decode("utf-8", "replace"), job_dir
    finally:
        container.remove(force=True)


def way_plain(client, job, data, scratch, owner):
    wall, code, out, _ = container_run(
        client, job, data, scratch, owner, entrypoint=["python3"],
        command=["/bench/plain_loop.py", "--threads", str(job.cpus)],
        mounts={str(REPO / "bench"): {"bind": "/bench", "mode": "ro"}})
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if code != 0 or not lines:
        raise RuntimeError(f"{job.framework} plain loop failed ({code}): {out[-500:]}")
    return {"ips": json.loads(lines[-1])["train_images_per_s"], "wall": wall}


def way_runner(client, job, data, scratch, owner):
    wall, code, out, job_dir = container_run(client, job, data, scratch, owner)
    raw, _ = jobdir.read_output(job_dir, "result.json", 1 << 20)
    result = json.loads(raw) if raw else {}
    if code != 0 or result.get("status") != "ok":
        raise RuntimeError(f"{job.framework} runner failed ({code}): {out[-500:]}")
    return {"ips": result["train_images_per_s"], "wall": wall, "total": result["total_time_s"]}


JOBS = 4      # way (c)'s jobs a run: the first gap also holds the first write's imports (once a run)


def run_quick(framework, datasets, data, cpus, scratch, *options, what=""):
    """`dlbench run` of the framework's quick profile on ``datasets`` into a fresh results
    folder: its rows and its wall time."""
    results = Path(tempfile.mkdtemp(dir=scratch))
    command = [sys.executable, "-m", "orchestrator", "run", "--frameworks", framework,
               "--datasets", datasets, "--profile", QUICK_PROFILE, "--cpus", str(cpus),
               "--results", str(results), "--data-dir", str(data), *options]
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"dlbench run {framework}{what} failed: {proc.stderr[-500:]}")
    return pd.read_parquet(results / "runs"), wall


def way_dlbench(framework, data, cpus, scratch, runtime="docker", python=None):
    native_options = ["--runtime", "native", "--python", python] if runtime == "native" else []
    rows, wall = run_quick(framework, "mnist", data, cpus, scratch, "--repeats", str(JOBS),
                           *native_options, what=f" ({runtime})")
    rows = rows.sort_values("started_at")
    checks = rows[["migration_host_time_s", "platforms_time_s"]].fillna(0.0).sum(axis=1)
    # The runner's clock and the host's are the same kernel's: from one runner's end to the
    # next one's start, less the check the host ran on the first one's model in between.
    gaps = ((pd.to_datetime(rows["started_at"]).diff().dt.total_seconds().iloc[1:]
             - rows["total_time_s"].iloc[:-1].to_numpy()) - checks.iloc[:-1].to_numpy()).tolist()
    per_job = statistics.median(gaps[1:])   # the first holds pyarrow's import of pandas, once a run
    outside = wall - rows["total_time_s"].sum() - checks.sum()
    return {"ips": rows["train_images_per_s"].median(), "wall": wall / JOBS, "per_job": per_job,
            "per_run": outside - JOBS * per_job, "check": checks.median()}


def way_checks(framework, data, cpus, scratch, round_, rounds):
    """One quick run of the framework on both data sets, all its checks on: its rows."""
    rows, _ = run_quick(framework, "mnist,cifar10", data, cpus, scratch)
    sys.stderr.write(f"round {round_ + 1}/{rounds} {framework}: {len(rows)} jobs\n")
    return rows


def report_checks(rows, args):
    """Per framework and data set, the medians over the rounds of each check's seconds and
    of all of them over the training and testing."""
    print(f"dlbench checks after training, {dt.date.today().isoformat()}, {hostinfo.cpu_model()}, "
          f"{os.cpu_count()} CPUs, {hostinfo.memory_gb()} GB, {platform.system()} {platform.release()}")
    print(f"command: python bench/overhead.py {' '.join(sys.argv[1:])}")
    print(f"quick profile, --cpus {args.cpus}, medians of {args.rounds} round(s), seconds")
    rows = rows.assign(train_test=rows["train_time_s"] + rows["test_time_s"],
                       **{name: rows[name].fillna(0.0) for name in CHECKS})
    rows["checks"] = rows[list(CHECKS)].sum(axis=1)
    rows["share"] = rows["checks"] / rows["train_test"]
    robust = rows["hyperparameters"].map(lambda text: json.loads(text).get("robust_images") or 0)
    trained = rows["train_images_per_s"] * rows["train_time_s"]
    rows["work"] = (PASSES_PER_ATTACKED * robust + rows["test_samples"]) / (3 * trained + rows["test_samples"])
    print(f"{'framework':<11} {'dataset':<8} {'images':>6} {'train+test':>10} {'robust':>7} "
          f"{'export':>7} {'host':>6} {'checks':>7} {'share':>6} {'work':>6}")
    worst = 0.0
    for (framework, dataset), group in rows.groupby(["framework", "dataset"], sort=False):
        m = group[["train_test", *CHECKS, "checks", "share", "work"]].median()
        images = json.loads(group["hyperparameters"].iloc[0]).get("robust_images")
        worst = max(worst, m["share"])
        print(f"{framework:<11} {dataset:<8} {images:>6} {m['train_test']:>9.1f}s "
              f"{m['robustness_time_s']:>6.2f}s {m['migration_time_s']:>6.2f}s "
              f"{m['migration_host_time_s'] + m['platforms_time_s']:>5.2f}s {m['checks']:>6.2f}s {m['share']:>6.3f} {m['work']:>6.3f}")
    print(f"all jobs together: checks {rows['checks'].sum():.1f} s, training and testing "
          f"{rows['train_test'].sum():.1f} s, share {rows['checks'].sum() / rows['train_test'].sum():.3f}; "
          f"jobs within the goal: {int((rows['share'] <= GOALS['checks']).sum())} of {len(rows)}")
    print(f"goal checks <= {GOALS['checks']:.2f} of training and testing: "
          f"{'met' if worst <= GOALS['checks'] else 'MISSED'} (highest {worst:.3f})")


def median(runs, key):
    return statistics.median(r[key] for r in runs)


def main():
    parser = argparse.ArgumentParser(description="dlbench's own overhead, measured.")
    parser.add_argument("--data-dir", type=Path, default=os.environ.get("DLBENCH_DATA_DIR"),
                        help="data sets in the canonical layout (default: $DLBENCH_DATA_DIR)")
    parser.add_argument("--frameworks", default=",".join(catalog.STUDY_ORDER))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=os.cpu_count())
    parser.add_argument("--native-python", help="a Python with the frameworks, for way (d)")
    parser.add_argument("--checks", action="store_true",
                        help="measure the checks after training of each quick job instead")
    args = parser.parse_args()
    if args.data_dir is None:
        fail("give --data-dir or set DLBENCH_DATA_DIR")
    if args.rounds < 1 or not 1 <= args.cpus <= (os.cpu_count() or 1):
        fail("--rounds must be >= 1 and --cpus between 1 and this host's CPUs")
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    if unknown := [f for f in frameworks if f not in catalog.names()]:
        fail(f"unknown framework(s): {', '.join(unknown)}")
    try:
        datasets.verify("mnist", args.data_dir)
        client = docker.from_env(timeout=600)
        for framework in frameworks:
            client.images.get(build.image_tag(framework))
    except docker.errors.ImageNotFound as exc:
        fail(f"{exc.explanation}: build the images first with `dlbench build-images`")
    except docker.errors.DockerException as exc:
        fail(f"Docker: {exc}")
    except Exception as exc:  # noqa: BLE001 - a bad data directory, said on one line
        fail(str(exc))

    if args.checks:
        scratch = Path(tempfile.mkdtemp(prefix="dlbench-overhead-"))
        try:
            rows = [way_checks(f, args.data_dir, args.cpus, scratch, r, args.rounds)
                    for r in range(args.rounds) for f in frameworks]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        report_checks(pd.concat(rows), args)
        return
    native_ok = set()
    if args.native_python:
        python = native.check_python(args.native_python)
        for framework in frameworks:
            reason = native.Interpreter(python, framework).reason
            if reason:
                sys.stderr.write(f"no native runs of {framework}: {reason}\n")
            else:
                native_ok.add(framework)
    runs = {(f, w): [] for f in frameworks for w in "abcd"}
    jobs = {f: job_of(client, f, args.cpus) for f in frameworks}
    owner = owners.current()
    scratch = Path(tempfile.mkdtemp(prefix="dlbench-overhead-"))
    try:
        for round_ in range(args.rounds):
            for framework in frameworks:
                ways = ["a", "b", "c"] + (["d"] if framework in native_ok else [])
                order = ways[round_ % len(ways):] + ways[:round_ % len(ways)]
                for way in order:
                    if way == "a":
                        runs[framework, way].append(way_plain(client, jobs[framework], args.data_dir,
                                                              scratch, owner))
                    elif way == "b":
                        runs[framework, way].append(way_runner(client, jobs[framework], args.data_dir,
                                                               scratch, owner))
                    elif way == "c":
                        runs[framework, way].append(way_dlbench(framework, args.data_dir, args.cpus, scratch))
                    else:
                        runs[framework, way].append(way_dlbench(framework, args.data_dir, args.cpus,
                                                                scratch, "native", args.native_python))
                    sys.stderr.write(f"round {round_ + 1}/{args.rounds} {framework} ({way}): "
                                     f"{runs[framework, way][-1]['ips']:.0f} images/s\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(frameworks, runs, args)


def report(frameworks, runs, args):
    print(f"dlbench overhead, {dt.date.today().isoformat()}, {hostinfo.cpu_model()}, "
          f"{os.cpu_count()} CPUs, {hostinfo.memory_gb()} GB, {platform.system()} {platform.release()}")
    print(f"command: python bench/overhead.py {' '.join(sys.argv[1:])}")
    print(f"quick MNIST job, --cpus {args.cpus}, medians of {args.rounds} round(s), images/s of training")
    header = f"{'framework':<11} {'a plain':>9} {'b runner':>9} {'b/a':>6} {'b wall':>8} " \
             f"{'c wall':>8} {'c/b':>6} {'check':>6} {'per job':>8} {'per run':>8}"
    if args.native_python:
        header += f" {'d native':>9} {'d/c':>6}"
    print(header)
    worst = {"b/a": [], "per job": [], "d/c": []}
    for f in frameworks:
        a, b, c = (runs[f, w] for w in "abc")
        ba = median(b, "ips") / median(a, "ips")
        cb = median(c, "wall") / median(b, "wall")
        per_job = median(c, "per_job")
        line = f"{f:<11} {median(a, 'ips'):>9.0f} {median(b, 'ips'):>9.0f} {ba:>6.3f} " \
               f"{median(b, 'wall'):>7.1f}s {median(c, 'wall'):>7.1f}s {cb:>6.3f} {median(c, 'check'):>5.2f}s " \
               f"{per_job:>7.2f}s {median(c, 'per_run'):>7.2f}s"
        worst["b/a"].append(ba)
        worst["per job"].append(per_job)
        if runs[f, "d"]:
            dc = median(runs[f, "d"], "ips") / median(c, "ips")
            line += f" {median(runs[f, 'd'], 'ips'):>9.0f} {dc:>6.3f}"
            worst["d/c"].append(dc)
        elif args.native_python:
            line += f" {'-':>9} {'-':>6}"
        print(line)
    print(f"goal b/a >= {GOALS['b/a']}: {'met' if min(worst['b/a']) >= GOALS['b/a'] else 'MISSED'} "
          f"(lowest {min(worst['b/a']):.3f})")
    print(f"goal fixed cost a job < {GOALS['per job']:g} s: "
          f"{'met' if max(worst['per job']) < GOALS['per job'] else 'MISSED'} "
          f"(highest {max(worst['per job']):.2f} s)")
    if worst["d/c"]:
        print(f"goal native/container >= {GOALS['d/c']}: "
              f"{'met' if min(worst['d/c']) >= GOALS['d/c'] else 'MISSED'} (lowest {min(worst['d/c']):.3f})")


if __name__ == "__main__":
    main()
