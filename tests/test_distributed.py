"""Distributed training (Deep500's fourth level): one model trained data-parallel over several
workers with the framework's own engine, each worker a container on a network of the job's
own; verified against the one-worker trajectory and the fair profile's NumPy reference."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from conftest import REPO, dlbench
from dlbench_runner import contract, fair as networks, world
from orchestrator import options, plan
from orchestrator.checks import fair
from orchestrator.errors import UsageError
from orchestrator.runtimes import base, native, workers


def planned(*args) -> list[dict]:
    proc = dlbench("run", "--dry-run", "--format", "json", *args, check=True)
    return [json.loads(line) for line in proc.stdout.splitlines()]


def axes_of(**given):
    return options.Axes(profiles=["quick"], **given)


# -- the sharing of a batch, as arithmetic ------------------------------------------------------
@pytest.mark.parametrize("batch, size", [(10, 2), (7, 2), (64, 3), (5, 5)])
def test_the_scaled_shard_means_average_to_the_batch_mean(batch, size):
    """What the engine averages (each worker's mean loss times its scale, summed, over N) is
    the one-worker mean of the batch, also where N does not divide it; every image is in
    exactly one shard."""
    losses = np.random.RandomState(batch).rand(batch)
    index = np.arange(batch)
    shards = [world.World(size, rank, "w0", 1).shard(index) for rank in range(size)]
    assert sorted(np.concatenate(shards).tolist()) == list(range(batch))
    averaged = sum(world.World(size, rank, "w0", 1).scale(batch) * losses[shard].mean()
                   for rank, shard in enumerate(shards)) / size
    assert averaged == pytest.approx(losses.mean(), rel=1e-12)


def test_a_worker_without_its_place_in_the_environment_is_refused():
    spec = {"workers": 2}
    assert world.from_spec({"workers": None}) is None
    with pytest.raises(world.WorldError, match="DLBENCH_WORKER_RANK"):
        world.from_spec(spec, {})
    with pytest.raises(world.WorldError, match="not a worker of 2"):
        world.from_spec(spec, {contract.WORKER_RANK: "2", contract.WORKER_ADDRESS: "w0:29500"})
    found = world.from_spec(spec, {contract.WORKER_RANK: "1", contract.WORKER_ADDRESS: "w0:29500"})
    assert (found.rank, found.host, found.port, found.leader) == (1, "w0", 29500, False)


# -- the plan -----------------------------------------------------------------------------------
def test_workers_sweep_and_one_worker_is_the_plain_job():
    one, two = plan.expand(axes_of(frameworks=["pytorch"], datasets=["mnist"], workers=[None, 2]), 2).jobs
    alone, = plan.expand(axes_of(frameworks=["pytorch"], datasets=["mnist"]), 2).jobs
    assert (one.workers, two.workers) == (None, 2) and one.unsupported is None is two.unsupported
    assert one.job_id("i", "d") == alone.job_id("i", "d") != two.job_id("i", "d")
    assert two.spec("r", "j")["workers"] == 2


def test_frameworks_without_an_engine_and_batches_too_small_are_unsupported_at_planning():
    jobs = planned("--frameworks", "caffe,torch,theano,mxnet,pytorch,tensorflow", "--profile", "quick",
                   "--workers", "2")
    why = {(j["framework"], j["dataset"]): j["unsupported"] for j in jobs}
    assert why["caffe", "mnist"].startswith("caffe trains on one worker only: Caffe 1.0 has no engine")
    assert why["torch", "mnist"].startswith("torch trains on one worker only")
    assert why["theano", "cifar10"].startswith("theano trains on one worker only")
    assert why["mxnet", "mnist"].startswith("mxnet trains on one worker only: its dist_sync kvstore")
    assert why["pytorch", "mnist"] is None is why["tensorflow", "mnist"] is why["tensorflow", "cifar10"]
    assert why["pytorch", "cifar10"] == ("pytorch/cifar10: a batch of 1 cannot be split over 2 workers "
                                         "(--set batch_size=N, N at least 2)")


@pytest.mark.parametrize("given", ["0", "two", "1.5", "-2"])
def test_a_bad_worker_count_is_a_one_line_usage_error(given):
    proc = dlbench("run", "--dry-run", "--frameworks", "pytorch", "--workers", given)
    assert proc.returncode == 2 and proc.stdout == ""
    line, = proc.stderr.strip().splitlines()
    assert "--workers" in line and "give a number of workers, 1 or more" in line


def test_the_native_runtime_runs_several_workers_but_still_cannot_limit_their_memory():
    job, = plan.expand(axes_of(frameworks=["pytorch"], datasets=["mnist"], workers=[2]), 2).jobs
    assert native.unsupported(base.Target("native:python", None), job) is None
    limited = job.model_copy(update={"memory_bytes": 2 << 30})
    assert "cannot limit memory" in native.unsupported(base.Target("native:python", None), limited)


def test_each_worker_gets_its_rank_the_leaders_address_and_its_share_of_the_cpus():
    job, = plan.expand(axes_of(frameworks=["pytorch"], datasets=["mnist"], workers=[2], threads=[2]), 2).jobs
    base = {"labels": {"org.dlbench.run-id": "r" * 12, "org.dlbench.job-id": "j" * 12, "org.dlbench.role": "job"},
            "environment": dict(job.thread_environment), "network_mode": "none", "cpuset_cpus": "0-1",
            "nano_cpus": 2 * 10**9}
    first, second = (workers.worker_options(base, job, rank, "net", "leader") for rank in (0, 1))
    assert "network_mode" not in first and first["network"] == "net"
    assert (first["cpuset_cpus"], second["cpuset_cpus"]) == ("0", "1")
    assert first["nano_cpus"] == second["nano_cpus"] == 10**9
    assert second["environment"][contract.WORKER_RANK] == "1"
    assert second["environment"][contract.WORKER_ADDRESS] == f"leader:{workers.PORT}"
    assert second["environment"]["OMP_NUM_THREADS"] == "1"
    assert second["labels"]["org.dlbench.worker"] == "1" and first["name"] != second["name"]


# -- the faults a check must catch: the fair reference, with the gradients wrong ---------------
def _trained(data, steps, wrong):
    """The fair MNIST training's first losses in NumPy float64, each step's gradient taken as
    ``wrong`` says: ``summed`` (two workers' gradients added, not averaged) or ``skipped``
    (only the first worker's shard)."""
    layers = fair.Layers("mnist", "first", np.float64)
    current = {k: np.asarray(v, np.float64) for k, v in networks.initial_weights("mnist", 1).items()}
    velocity = {k: np.zeros_like(v) for k, v in current.items()}
    losses = []
    for step in range(steps):
        x, y = data.batch(step)
        loss, gradients = layers.loss(current, x, y)
        losses.append(loss)
        if wrong == "skipped":
            _, gradients = layers.loss(current, x[0::2], y[0::2])
        for name, gradient in gradients.items():
            velocity[name] = data.momentum * velocity[name] + gradient * (2 if wrong == "summed" else 1)
            current[name] = current[name] - data.learning_rate * velocity[name]
    return np.asarray(losses)


@pytest.mark.parametrize("wrong", ["summed", "skipped"])
def test_gradients_summed_or_a_skipped_shard_leave_the_reference_tolerance(data_root, wrong):
    """The verification the two-worker run passes (below) cannot pass a wrong engine: the
    reference's own training with the gradients summed over two workers, or with one worker's
    shard left out, parts from the reference by far more than its tolerance by step 2."""
    hp = dict(contract.fair_hyperparameters("mnist"), steps=4)
    data = networks.FairData(contract.formats.load("mnist", data_root), "mnist", hp, 1)
    right = fair.reference_losses(networks.initial_weights("mnist", 1), data, 4, "first")
    apart = np.abs(_trained(data, 4, wrong) - right) / np.abs(right)
    assert apart[0] == 0 and apart[2] > 100 * fair.REFERENCE_TOLERANCE["mnist"]


# -- real runs: two containers, one model -------------------------------------------------------
@pytest.fixture(scope="module")
def runs(build_image, data_root, tmp_path_factory):
    """pytorch's quick MNIST model (on 2,000 images) and its fair MNIST network (20 steps),
    each at 1 and 2 workers: the rows, by profile and workers; the results directory."""
    build_image("pytorch")
    results = tmp_path_factory.mktemp("distributed")
    common = ("run", "--frameworks", "pytorch", "--datasets", "mnist", "--workers", "1,2", "--cpus", "2",
              "--results", results, "--data-dir", data_root)
    dlbench(*common, "--profile", "quick", "--set", "train_subset=2000", "--set", "robust_images=0",
            check=True)
    dlbench(*common, "--profile", "fair", "--set", "steps=20", "--set", "op_repeats=0", check=True)
    rows = pd.read_parquet(results / "runs")
    return {(r.profile, 1 if pd.isna(r.workers) else int(r.workers)): r for r in rows.itertuples()}, results


@pytest.mark.docker
def test_two_workers_train_the_quick_model_and_the_row_says_how(runs):
    rows, _ = runs
    one, two = rows["quick", 1], rows["quick", 2]
    assert one.status == two.status == "ok", (one.error, two.error)
    assert (two.workers, two.worker_batch_size, two.batch_size) == (2, 5, 10)
    assert (two.dist_engine, two.dist_backend) == ("DistributedDataParallel", "gloo")
    assert len(two.worker_train_time_s) == 2 and min(two.worker_train_time_s) > 0
    assert two.train_time_s == two.worker_train_time_s[0]
    assert pd.isna(one.workers) and pd.isna(one.dist_engine)
    assert two.train_samples == one.train_samples == 2000
    # the same steps from the same weights: one float32 trajectory up to rounding
    assert two.epoch_loss[0] == pytest.approx(one.epoch_loss[0], rel=1e-3)
    assert abs(two.accuracy - one.accuracy) < 0.01
    assert json.loads(two.threads_env)["OMP_NUM_THREADS"] == "1"


@pytest.mark.docker
def test_two_workers_follow_the_one_worker_trajectory_within_the_fair_tolerance(runs, data_root):
    """Under the fair profile, 2 workers with the global batch of 64 (32 each) take the steps
    one worker takes: their losses are within the NumPy reference's float32 tolerance of it,
    as the one worker's are, and within it of the one worker's."""
    _, results = runs
    assert_follows_the_reference(results, "pytorch", data_root)


@pytest.mark.docker
def test_a_killed_worker_ends_the_job_as_failed_naming_it_and_leaves_nothing(build_image, data_root, tmp_path):
    import docker
    build_image("pytorch")
    client = docker.from_env()
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "run", "--frameworks", "pytorch",
                             "--datasets", "mnist", "--profile", "quick", "--workers", "2",
                             "--set", "robust_images=0", "--results", str(results), "--data-dir", str(data_root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, killed = time.monotonic() + 300, None
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        found = client.containers.list(filters={"label": "org.dlbench.worker=1"})
        found = [c for c in found if c.labels.get("org.dlbench.results") == str(results.resolve())]
        if found and "train" in found[0].logs().decode(errors="replace"):
            found[0].kill()
            killed = found[0]
        time.sleep(0.5)
    out, err = proc.communicate(timeout=300)
    assert killed is not None, err
    row, = pd.read_parquet(results / "runs").itertuples()
    assert row.status == "failed"
    assert row.error.startswith("worker 1 of 2: the container exited with code 137 (SIGKILL); "
                                "the others were stopped"), row.error
    labelled = {"label": f"org.dlbench.results={results.resolve()}"}
    assert client.containers.list(all=True, filters=labelled) == []
    assert client.networks.list(filters=labelled) == []


@pytest.mark.docker
def test_tensorflow_trains_over_two_workers_with_its_strategy(build_image, data_root, tmp_path):
    """TensorFlow's MNIST model (the deep MNIST tutorial's, 100 steps) at 1 and 2 workers:
    MultiWorkerMirroredStrategy's all-reduce over gRPC, 25 images a worker of each 50."""
    build_image("tensorflow")
    dlbench("run", "--frameworks", "tensorflow", "--datasets", "mnist", "--profile", "quick",
            "--workers", "1,2", "--set", "max_steps=100", "--set", "robust_images=0",
            "--results", tmp_path, "--data-dir", data_root, check=True)
    rows = {1 if pd.isna(r.workers) else int(r.workers): r for r in pd.read_parquet(tmp_path / "runs").itertuples()}
    one, two = rows[1], rows[2]
    assert one.status == two.status == "ok", (one.error, two.error)
    assert (two.dist_engine, two.dist_backend, two.worker_batch_size) == ("MultiWorkerMirroredStrategy", "gRPC ring", 25)
    assert len(two.worker_train_time_s) == 2
    # the model's dropout draws its masks per worker: not one trajectory, the same training
    assert abs(two.accuracy - one.accuracy) < 0.05 and two.accuracy > 0.5
    assert two.epoch_loss[0] == pytest.approx(one.epoch_loss[0], rel=0.2)
    # its fair network: the one-worker steps, within the reference's tolerance
    fair_results = tmp_path / "fair"
    dlbench("run", "--frameworks", "tensorflow", "--datasets", "mnist", "--profile", "fair",
            "--workers", "1,2", "--set", "steps=20", "--set", "op_repeats=0",
            "--results", fair_results, "--data-dir", data_root, check=True)
    assert_follows_the_reference(fair_results, "tensorflow", data_root)


def assert_follows_the_reference(results, framework, data_root):
    """The fair rows of ``results`` at 1 and 2 workers: each within the NumPy reference's
    tolerance, and the two within it of each other."""
    from orchestrator import store
    rows = pd.read_parquet(results / "runs")
    steps = store.load_steps(results)
    curves = {}
    for row in rows[rows["profile"] == "fair"].itertuples():
        assert row.status == "ok", row.error
        n = 1 if pd.isna(row.workers) else int(row.workers)
        curves[n] = steps[steps["run_id"] == row.run_id].sort_values("step")["loss"].to_numpy()
        reference, held = fair.reference_check(row, fair.TIE_RULES[framework], data_root, steps=len(curves[n]))
        difference = np.max(np.abs(curves[n][:held] - reference[:held]) / np.abs(reference[:held]))
        assert difference <= fair.REFERENCE_TOLERANCE["mnist"], (n, difference)
    assert sorted(curves) == [1, 2] and len(curves[2]) == 20
    assert np.max(np.abs(curves[2] - curves[1]) / curves[1]) <= fair.REFERENCE_TOLERANCE["mnist"]


def test_the_report_scales_strong_and_weak_from_the_rows(tmp_path):
    """The committed PyTorch quick rows (strong scaling: batch 10 at 1 and 2 workers), and
    the same two-worker rows turned into a job of batch 20 (10 a worker) at 1.6 times one
    worker's images per second: weak scaling, speed-up 1.6, efficiency 0.80."""
    from orchestrator import store
    from orchestrator.report import paper, views

    rows = pd.read_parquet(REPO / "docs/measurements/2026-12-02-distributed/runs")
    quick = rows[(rows.framework == "pytorch") & (rows.profile == "quick")]
    one = quick[quick.workers.isna()]
    weak = quick[quick.workers == 2].copy()
    weak["batch_size"], weak["worker_batch_size"] = 20, 10
    weak["hyperparameters"] = [json.dumps(dict(json.loads(h), batch_size=20), sort_keys=True)
                               for h in weak.hyperparameters]
    weak["overrides"] = json.dumps({"batch_size": 20})
    weak["train_images_per_s"] = one.train_images_per_s.median() * 1.6
    weak["run_id"] = [r + "w" for r in weak.run_id]
    weak["job_id"] = [j[:-1] + "w" for j in weak.job_id]
    folder = tmp_path / "runs"
    folder.mkdir()
    pd.concat([quick, weak]).to_parquet(folder / "part.parquet")
    records = views.scaling_records(paper.build(store.load(tmp_path)).rows)
    strong = {r["workers"]: r for r in records if r["kind"] == "strong" and r["label"] == "own defaults"}
    assert strong[2]["speedup"] == pytest.approx(one.train_time_s.median()
                                                 / quick[quick.workers == 2].train_time_s.median())
    assert strong[2]["nodes"] == 1 and strong[1]["runs"] == 3
    found = {r["workers"]: r for r in records if r["kind"] == "weak"}
    assert found[1]["label"] == found[2]["label"] == "batch 10 a worker"
    assert found[2]["speedup"] == pytest.approx(1.6) and found[2]["batch"] == 20
    report = dlbench("report", "--results", tmp_path, "--format", "md", check=True).stdout
    assert "weak scaling" in report and "| 1.60 | 0.80 |" in report


@pytest.mark.parametrize("first", [0, 1])
def test_native_workers_the_first_that_fails_is_the_one_named(tmp_path, first):
    """Two host processes as one job's workers: whichever fails first is the job's failure;
    the other is stopped at once, never waited for (it sleeps a minute)."""
    from orchestrator.runtimes import native as native_runtime, native_workers

    job, = plan.expand(axes_of(frameworks=["pytorch"], datasets=["mnist"], workers=[2]), 2).jobs
    script = (f'if [ "$DLBENCH_WORKER_RANK" = {first} ]; then echo "rank $DLBENCH_WORKER_RANK gives up"; '
              'exit 3; fi; exec sleep 60')
    started = time.monotonic()
    group = native_workers.start_local(job, ["sh", "-c", script], {"PATH": "/usr/bin:/bin"}, tmp_path,
                                       tmp_path, native_runtime._start)
    code = group.leader.wait(90)
    group.finish(code)
    assert time.monotonic() - started < 20 and all(p.poll() is not None for p in group.processes)
    assert group.failed[0] == (first, 3)
    if first == 0:
        assert group.error([]) is None          # worker 0's own failure: the job's, as for one process
    else:
        assert group.error([]) == ("worker 1 of 2: the process exited with code 3; the others were "
                                   "stopped (its last line: rank 1 gives up)")


def test_native_workers_cpu_time_is_the_jobs_own_not_other_work(tmp_path):
    """The other workers are the host's children, not worker 0's: their CPU seconds are
    added to the job's, which the row's ``other_cpu_s`` leaves out of the host's busy time
    (else every job of several workers would look disturbed by its own workers)."""
    import os

    from orchestrator.runtimes import native as native_runtime, native_workers

    job, = plan.expand(axes_of(frameworks=["pytorch"], datasets=["mnist"], workers=[2]), 2).jobs
    burn = "import time\nwhile time.process_time() < 0.5: pass"
    group = native_workers.start_local(job, [sys.executable, "-c", burn], {"PATH": "/usr/bin:/bin"},
                                       tmp_path, tmp_path, native_runtime._start)
    _, status, usage = os.wait4(group.leader.pid, 0)
    group.leader.returncode = os.waitstatus_to_exitcode(status)
    group.finish(0)
    assert group.failed == [] and 0.5 <= group.others_cpu_s() < 2.0
    assert 1.0 <= native_runtime._job_cpu_s(usage, group) < 4.0
