"""`dlbench tune`: the space of a framework, its points as ordinary jobs, the study kept in
Optuna's journal beside the rows, a Ctrl-C that the study survives, and the campaign file
that checks the winner against the default."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pandas as pd
import pytest

from conftest import NO_CHECKS, REPO, dlbench
from orchestrator import campaign, options, tune

QUICK = tune.TuneRequest(framework="caffe", dataset="mnist", profile="quick")


def test_the_space_is_what_the_framework_has():
    space = tune.space_of(QUICK, host_cpus=2)
    assert space["blas"][0] == "openblas-pthread" and "atlas" in space["blas"]
    assert space["threads"] == [1, 2]
    assert space["batch_size"] == [16, 32, 64, 128, 256]       # 64 x 1/4 ... 4
    assert space["learning_rate"] == pytest.approx((0.001, 0.1))
    assert space["length"] == [0.25, 0.5, 0.75, 1.0]
    # one CPU: no thread axis; TensorFlow: no BLAS axis
    assert "threads" not in tune.space_of(QUICK, host_cpus=1)
    tf = tune.space_of(tune.TuneRequest(framework="tensorflow", dataset="mnist"), host_cpus=2)
    assert "blas" not in tf and "length" in tf


def test_a_point_is_an_ordinary_job():
    """Caffe's quick LeNet (500 iterations) at half its length, a quarter of its batch, twice its rate,
    one CPU and ATLAS: one job, the lengths and rates scaled as models.json says."""
    point = {"blas": "atlas", "threads": 1, "batch_size": 16, "learning_rate": 0.02, "length": 0.5}
    request = tune.TuneRequest(framework="caffe", dataset="mnist", fixed={"robust_images": 0})
    from orchestrator.plan import expand
    job, = expand(tune.axes_of(request, point, "tune:x", 2), 2).jobs
    assert (job.threads, job.cpus, job.blas, job.campaign) == (1, 1, "atlas", "tune:x")
    hp = job.hyperparameters
    assert (hp["batch_size"], hp["learning_rate"], hp["max_iter"], hp["robust_images"]) == (16, 0.02, 250, 0)
    default = tune.default_point(request, tune.space_of(request, 2), 2)
    assert default == {"blas": "openblas-pthread", "threads": 2, "batch_size": 64,
                       "learning_rate": 0.01, "length": 1.0}


@pytest.mark.parametrize("args, message", [
    (("--frameworks", "caffe,torch", "--datasets", "mnist"),
     "dlbench tune searches one framework on one data set: give one of each (--frameworks caffe "
     "--datasets mnist)"),
    (("--frameworks", "tensorflow", "--datasets", "mnist", "--space", "blas"),
     "--space blas: no axis is free to search (tensorflow cannot switch BLAS libraries)"),
    (("--frameworks", "caffe", "--datasets", "mnist", "--min-accuracy", "101"),
     "--min-accuracy 101: an accuracy is more than 0 and at most 100 %"),
    (("--frameworks", "caffe", "--datasets", "mnist", "--floor", "120"),
     "--floor 120: points below the default's accuracy, 0 to 100"),
    (("--frameworks", "caffe", "--datasets", "mnist", "--space", "speed"),
     "--space 'speed': choose from blas, threads, batch_size, learning_rate, length, omp_threads"),
    (("--frameworks", "caffe", "--datasets", "mnist", "--space", "length", "--set", "max_iter=10"),
     "--set max_iter: the search sets it (--space); leave it out of one"),
    (("--frameworks", "caffe", "--datasets", "mnist", "--set", "epochs=3"),
     "caffe/mnist has no hyper-parameter 'epochs' (it has: batch_size, epsilons, export_onnx, gamma, "
     "learning_rate, lr_policy, max_iter, momentum, omp_threads, pgd_epsilon, power, robust_images, snapshot, "
     "snapshot_after_train, test_batch_size, test_interval, test_iter, weight_decay)"),
])
def test_bad_input_is_one_line_before_any_trial(tmp_path, args, message):
    proc = dlbench("tune", *args, "--results", tmp_path / "results")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"dlbench: error: {message}"]
    assert not (tmp_path / "results" / "tune").exists() or not any((tmp_path / "results" / "tune").iterdir())


def test_the_campaign_it_writes_runs_the_best_beside_the_default(tmp_path):
    found = tune.Outcome("caffe-mnist-quick", "x", 0.97, [
        tune.Trial(0, {"blas": "openblas-pthread", "length": 1.0}, True, "COMPLETE", 20.0, 0.975, True, "r0", None),
        tune.Trial(1, {"blas": "atlas", "length": 0.5}, False, "COMPLETE", 9.0, 0.972, True, "r1", None),
        tune.Trial(2, {"blas": "blis-pthread", "length": 0.25}, False, "COMPLETE", 5.0, 0.95, False, "r2", None)],
        {"length": 0.9, "blas": 0.1}, None)
    assert [t.number for t in found.best] == [1, 0]     # trial 2 is faster, under the floor
    path = tmp_path / "best.toml"
    path.write_text(tune.best_campaign(QUICK, found, repeats=2))
    document, _ = campaign.load(path)          # written from the campaign file's model
    assert [m["label"] for m in document["matrix"]] == ["default", "trial 1"]
    assert document["matrix"][1]["blas"] == ["atlas"] and document["repeats"] == 2
    plan = campaign.read(path, options.RunOptions(), host_cpus=2).plan
    assert plan.campaign == "best-caffe-mnist-quick"
    assert [(j.repeat, j.blas, j.hyperparameters["max_iter"]) for j in plan.jobs] == [
        (0, None, 500), (0, "atlas", 250), (1, None, 500), (1, "atlas", 250)]
    assert {j.cpus for j in plan.jobs} == {os.cpu_count(), 2}     # the default pinned as its trial was
    lines = tune.summary(found)
    assert "  trial 1: train 9.0 s, accuracy 97.20%, 2.22x the default's speed  blas=atlas length=0.5  run r1" in lines


# -- real trials -------------------------------------------------------------------------------
@pytest.mark.docker
def test_a_study_stopped_by_ctrl_c_and_resumed_ends_with_its_trials(build_image, data_root, tmp_path):
    """Three trials of Caffe's quick LeNet over its length and BLAS library; SIGINT while the
    second runs, then --resume: three counted trials, each an ok row of campaign
    tune:<study>, the interrupted one marked and not counted, and --write's campaign."""
    build_image("caffe")
    results = tmp_path / "results"
    args = ["tune", "--frameworks", "caffe", "--datasets", "mnist", "--trials", "3", "--space",
            "blas,length", "--results", str(results), "--data-dir", str(data_root)]
    args += [a for s in NO_CHECKS for a in ("--set", s)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLBENCH_")}
    first = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and first.poll() is None:
        runs = results / "runs"
        if runs.is_dir() and len(list(runs.glob("*.parquet"))) >= 1:
            time.sleep(3)               # into the second trial's job
            break
        time.sleep(1)
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 130, err
    journal = results / "tune" / "caffe-mnist-quick.journal"
    assert journal.is_file()
    proc = dlbench("tune", *args[1:], "--resume", "--write", tmp_path / "best.toml")
    assert proc.returncode == 0, proc.stderr
    study = optuna.load_study(study_name="caffe-mnist-quick", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal))))
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 3 and complete[0].user_attrs["default"]
    assert any(k.startswith("interrupted-") for k in study.user_attrs)
    frame = pd.read_parquet(results / "runs")
    ok = frame[(frame.status == "ok") & (frame.campaign == "tune:caffe-mnist-quick")]
    assert sorted(ok.run_id) == sorted(t.user_attrs["run_id"] for t in complete)
    assert f"study caffe-mnist-quick: 3 trial(s), kept in {journal}" in proc.stdout
    text = (tmp_path / "best.toml").read_text()
    plan = campaign.read(tmp_path / "best.toml", options.RunOptions(), host_cpus=2).plan
    assert len(plan.jobs) == 6 and 'label = "default"' in text
    assert json.loads(ok.iloc[0].hyperparameters)["robust_images"] == 0
