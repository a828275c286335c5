"""Campaigns: a matrix in a TOML file (or in options) expanded into a plain list of jobs,
run with real containers, interrupted, resumed, and run twice at once on one results
directory."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import dlbench
from orchestrator import campaign, store
from orchestrator.errors import DeprecatedName, UsageError
from orchestrator.options import RunOptions

EXAMPLE = """\
name = "lenet-sweep"
frameworks = ["caffe", "pytorch"]
datasets = ["mnist"]
profiles = ["quick"]
threads = [1, 2]
repeats = 3
seed = 5

[hyperparameters]
batch_size = [32, 64]

[hyperparameters.caffe]
max_iter = 50

[limits]
memory = "4g"
timeout = 600

[limits.pytorch]
memory = "3g"
"""


def write(tmp_path, text, name="campaign.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def plan_of(path, host_cpus=2, **options):
    return campaign.read(path, RunOptions(**options), host_cpus=host_cpus).plan


# -- where it runs: scheduler, and its old name backend -------------------------------------------
def test_the_campaign_key_scheduler_and_its_deprecated_name_backend(tmp_path):
    assert campaign.read(write(tmp_path, 'name = "s"\nscheduler = "slurm"\n'), RunOptions(),
                         host_cpus=2).scheduler == "slurm"
    with pytest.warns(DeprecatedName, match="backend is deprecated: it is now scheduler"):
        old = campaign.read(write(tmp_path, 'name = "s"\nbackend = "slurm"\n'), RunOptions(),
                            host_cpus=2)
    assert old.scheduler == "slurm"
    with pytest.raises(UsageError, match="give scheduler, not backend as well"):
        campaign.read(write(tmp_path, 'name = "s"\nbackend = "local"\nscheduler = "slurm"\n'),
                      RunOptions(), host_cpus=2)


def test_the_option_scheduler_and_no_more_backend():
    proc = dlbench("run", "--frameworks", "caffe", "--datasets", "mnist", "--backend", "local",
                   "--dry-run")
    assert proc.returncode == 2 and "No such option: --backend" in proc.stderr
    assert "--scheduler" in dlbench("run", "--help", env={"COLUMNS": "200"}).stdout


# -- the matrix, without Docker ----------------------------------------------------------------
def test_a_campaign_file_expands_into_the_plain_list_of_jobs(tmp_path):
    jobs = plan_of(write(tmp_path, EXAMPLE)).jobs
    assert len(jobs) == 2 * 2 * 2 * 3
    assert {j.campaign for j in jobs} == {"lenet-sweep"}
    # repeats are the outer loop: the whole matrix once, then again, with the next seed
    assert [j.repeat for j in jobs] == [0] * 8 + [1] * 8 + [2] * 8
    assert [j.seed for j in jobs[::8]] == [5, 6, 7]
    first = [(j.framework, j.hyperparameters["batch_size"], j.cpus) for j in jobs[:8]]
    assert first == [(fw, bs, cpus) for fw in ("caffe", "pytorch") for bs in (32, 64) for cpus in (1, 2)]
    caffe = [j for j in jobs if j.framework == "caffe"]
    torch = [j for j in jobs if j.framework == "pytorch"]
    assert all(j.hyperparameters["max_iter"] == 50 and j.memory == "4g" for j in caffe)
    assert all("max_iter" not in j.hyperparameters and j.hyperparameters["epochs"] == 1 for j in torch)
    assert all(j.memory == "3g" and j.timeout == 600 for j in torch)
    assert all(j.threads == j.cpus and j.cpuset == ("0" if j.cpus == 1 else "0-1") for j in jobs)
    ids = {j.job_id("image", "data") for j in jobs}
    assert len(ids) == len(jobs)


MATRICES = """\
name = "two"
frameworks = ["caffe"]
datasets = ["mnist"]
profiles = ["quick"]

[[KEY]]
label = "one thread"
threads = [1]

[[KEY]]
label = "two threads, ATLAS"
threads = [2]
blas = ["atlas"]
"""


@pytest.mark.parametrize("key", ["matrix", "variants"])
def test_several_matrices_in_one_file_the_old_key_variants_too(tmp_path, key):
    the_plan = plan_of(write(tmp_path, MATRICES.replace("KEY", key)))
    assert [(j.cpus, j.blas) for j in the_plan.jobs] == [(1, None), (2, "atlas")]


def test_a_matrix_problem_names_the_key_as_written_and_not_both_keys(tmp_path):
    text = MATRICES.replace("KEY", "variants").replace("threads = [1]", "threads = [\"one\"]")
    with pytest.raises(UsageError) as error:
        plan_of(write(tmp_path, text))
    assert str(error.value) == f"{tmp_path / 'campaign.toml'}:8: variants[0].threads[0]: Input should be a valid integer"
    both = MATRICES.replace("KEY", "matrix") + "\n[[variants]]\nthreads = [1]\n"
    with pytest.raises(UsageError, match=r"campaign.toml:15: variants: give matrix, not variants as well"):
        plan_of(write(tmp_path, both))


def test_command_line_options_replace_the_files_axes(tmp_path):
    path = write(tmp_path, EXAMPLE)
    jobs = plan_of(path, frameworks=["caffe"], threads=[1], repeats=1, name="short",
                   hyperparameters={"batch_size": [16]}, memory="2g").jobs
    assert [(j.framework, j.hyperparameters["batch_size"], j.cpus, j.campaign, j.memory)
            for j in jobs] == [("caffe", 16, 1, "short", "2g")]
    assert jobs[0].hyperparameters["max_iter"] == 50        # the file's per-framework value stays


def test_the_same_axes_as_options_without_a_file():
    the_plan = campaign.read(None, RunOptions(
        frameworks=["caffe"], datasets=["mnist"], profiles=["quick"], threads=[1, 2],
        devices=[None, 0], hyperparameters={"batch_size": [8, 16], "max_iter": [10]}, repeats=2),
        host_cpus=2).plan
    assert len(the_plan.jobs) == 2 * 2 * 2 * 2
    assert {j.device for j in the_plan.jobs} == {"cpu", "cuda"}
    assert the_plan.campaign is None and the_plan.gpus == [0]


def test_the_job_id_ignores_the_campaign_name_and_limits(tmp_path):
    a = plan_of(write(tmp_path, EXAMPLE)).jobs[0]
    b = plan_of(write(tmp_path, EXAMPLE.replace("lenet-sweep", "other").replace('"4g"', '"8g"'))).jobs[0]
    assert (a.campaign, a.memory) != (b.campaign, b.memory)
    assert a.job_id("image", "data") == b.job_id("image", "data")


@pytest.mark.parametrize("change, expected", [
    (("max_iter = 50", "epochs = 2"),
     r"campaign.toml:13: hyperparameters.caffe.epochs: caffe/mnist has no hyper-parameter 'epochs'"),
    (("batch_size = [32, 64]", "batch_size = [32, \"big\"]"),
     r"campaign.toml:10: hyperparameters.batch_size: caffe/mnist: hyper-parameter 'batch_size' must be int"),
    (("threads = [1, 2]", "threads = [1, 0]"), r"campaign.toml:5: threads\[1\]: .*greater than or equal to 1"),
    (("threads = [1, 2]", "threads = [1, 4]"), r"campaign.toml:5: threads: .*this host has 2 CPUs"),
    (("repeats = 3", "repeat = 3"), r"campaign.toml:6: repeat: unknown key"),
    (('memory = "3g"', 'memory = "lots"'), r"campaign.toml:20: limits.pytorch.memory: memory 'lots'"),
    (("[hyperparameters.caffe]", "[hyperparameters.cafe]"),
     r"campaign.toml:12: hyperparameters.cafe: a table here must be named after a framework"),
    (('"caffe", "pytorch"]', '"caffe", "torhc"]'), r"campaign.toml:2: frameworks: unknown framework 'torhc'"),
    (('profiles = ["quick"]', 'profiles = ["fast"]'), r"campaign.toml:4: profiles: unknown profile 'fast'"),
    (("seed = 5", "sead = 5"), r"campaign.toml:7: sead: unknown key"),
    (('name = "lenet-sweep"\n', ''), r"campaign.toml: name: required key is missing"),
    (("batch_size = [32, 64]", "batch_size = [32, 64"), r"campaign.toml:\d+: not valid TOML"),
    (("timeout = 600", "timeout = -1"), r"campaign.toml:17: limits.timeout: .*greater than 0"),
])
def test_every_mistake_is_one_line_naming_the_file_line_and_key(tmp_path, change, expected):
    path = write(tmp_path, EXAMPLE.replace(*change))
    with pytest.raises(UsageError) as raised:
        plan_of(path)
    message = str(raised.value)
    assert "\n" not in message
    assert __import__("re").search(expected, message), message


def test_a_file_with_several_problems_lists_them_all_each_with_its_line(tmp_path):
    text = (EXAMPLE.replace('profiles = ["quick"]', 'profiles = ["fast"]')
            .replace("threads = [1, 2]", "threads = [1, 0]").replace("repeats = 3", "repeat = 3")
            .replace('memory = "3g"', 'memory = "lots"').replace("timeout = 600", "timeout = -1"))
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as raised:
        plan_of(path)
    assert str(raised.value).splitlines() == [
        f"{path}:4: profiles: unknown profile 'fast' (choose from paper, quick, fair) (and 4 more problems)",
        f"{path}:5: threads[1]: Input should be greater than or equal to 1",
        f"{path}:6: repeat: unknown key",
        f"{path}:17: limits.timeout: Input should be greater than 0",
        f"{path}:20: limits.pytorch.memory: memory 'lots': give a size such as 512m or 4g"]


def test_every_bad_hyper_parameter_is_listed_once(tmp_path):
    text = EXAMPLE.replace("max_iter = 50", "epochs = 2").replace("batch_size = [32, 64]",
                                                                   'batch_size = [32, "big"]')
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as raised:
        plan_of(path)
    first, second = str(raised.value).splitlines()
    assert first.startswith(f"{path}:10: hyperparameters.batch_size: caffe/mnist: hyper-parameter "
                            "'batch_size' must be int") and first.endswith(" (and 1 more problem)")
    assert second.startswith(f"{path}:13: hyperparameters.caffe.epochs: caffe/mnist has no "
                             "hyper-parameter 'epochs'")


def test_past_20_problems_the_rest_are_counted_and_nothing_is_written(tmp_path):
    path = write(tmp_path, 'name = "many"\n' + "".join(f"k{i} = 1\n" for i in range(25)))
    proc = dlbench("run", "--campaign", path, "--results", tmp_path / "results")
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert lines[0] == f"dlbench: error: {path}:2: k0: unknown key (and 24 more problems)"
    assert lines[1:20] == [f"dlbench: error: {path}:{i + 2}: k{i}: unknown key" for i in range(1, 20)]
    assert lines[20:] == [f"dlbench: error: {path}: 5 more problems not shown"]
    assert not (tmp_path / "results").exists()


TRICKY = '''\
name = "lenet-sweep"
description = """
What a line scan takes for keys:
sead = 1
[limits]
memory = "lots"
"""
datasets = [\'\'\'mnist\'\'\', # seed = [
  ]
slurm = {partition = "gpu[1-4", sbatch_options = ["--comment=x]", "--comment={"]}
hyperparameters = {caffe = {max_iter = [10,
  20]}, batch_size = 32}
frameworks = ["caffe"]
limits = {timeout = 600, memory = "4g"}
'''


@pytest.mark.parametrize("change, expected", [
    (("frameworks", "sead = 5\nframeworks"), r"campaign.toml:13: sead: unknown key"),
    (("max_iter", "epochs"), r"campaign.toml:11: hyperparameters.caffe.epochs: caffe/mnist has no "),
    (('"4g"}', '"lots"}'), r"campaign.toml:14: limits.memory: memory 'lots'"),
])
def test_keys_after_multi_line_strings_and_inline_tables_are_found_on_their_lines(tmp_path, change,
                                                                                  expected):
    with pytest.raises(UsageError) as raised:
        plan_of(write(tmp_path, TRICKY.replace(*change)))
    assert __import__("re").search(expected, str(raised.value)), str(raised.value)


DEEP = 600                  # past the standard library's TOML reader's recursion


@pytest.mark.parametrize("text, expected", [
    ("a = " + "[" * DEEP + "]" * DEEP, r"campaign.toml:2: arrays and inline tables nested more than 32 deep"),
    ("a = " + "{b = " * DEEP + "1" + "}" * DEEP,
     r"campaign.toml:2: arrays and inline tables nested more than 32 deep"),
    ("a = [" + "{b = [" * DEEP, r"campaign.toml:2: arrays and inline tables nested more than 32 deep"),
    (".".join(["a"] * 20_000) + " = 1", r"campaign.toml:2: a dotted key of more than 32 parts"),
    ("[" + ".".join(['"a"'] * 20_000) + "]", r"campaign.toml:2: a dotted key of more than 32 parts"),
    ("a = 1" + "0" * 5000, r"campaign.toml: not valid TOML: Exceeds the limit \(4300 digits\)"),
])
def test_deep_nesting_long_keys_and_huge_numbers_are_one_line_and_quick(tmp_path, text, expected):
    """The standard library's reader recurses into arrays and tables (a RecursionError past
    about 500 levels) and takes time quadratic in a key's parts (20,000: 6 s)."""
    with pytest.raises(UsageError) as raised:
        plan_of(write(tmp_path, 'name = "deep"\n' + text + "\n"))
    assert "\n" not in str(raised.value)
    assert __import__("re").search(expected, str(raised.value)), str(raised.value)


def test_brackets_and_dots_in_strings_and_comments_are_not_nesting(tmp_path):
    text = ('name = "x"\ndescription = """' + "[{" * DEEP + '"""  # ' + "[" * DEEP + "\n"
            "frameworks = ['caffe'] # " + "a." * 100 + "\n[hyperparameters]\n"
            + "\n".join(f"k{i} = '{'x.' * 100}'" for i in range(3)) + "\n")
    path = write(tmp_path, text)
    assert campaign.validate(campaign.load(path)[0])[0].description == "[{" * DEEP
    nested = "x = " + "[" * 32 + "]" * 32 + "\n" + ".".join(["k"] * 32) + " = 1\n"
    assert campaign.too_deep(nested) is None
    assert campaign.too_deep("[" + nested) == (1, "arrays and inline tables nested more than 32 deep")


def dry_run(campaign_file, timeout=60) -> subprocess.CompletedProcess:
    """``dlbench run --campaign FILE --dry-run`` with at most 3 GiB of address space: a reader
    that takes the file whole fails fast instead of taking the machine's memory."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    return subprocess.run([sys.executable, "-m", "orchestrator", "run", "--campaign", str(campaign_file),
                           "--dry-run"], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit)


def test_a_campaign_file_is_a_regular_file_of_at_most_1_mib_checked_before_it_is_read(tmp_path):
    big = write(tmp_path, 'name = "big"\ndescription = "' + "x" * (50 << 20) + '"\n', "big.toml")
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for path, why in [("/dev/zero", "not a regular file (a character device)"),
                      (fifo, "not a regular file (a FIFO)"), (tmp_path, "not a regular file (a directory)"),
                      (big, f"{big.stat().st_size} bytes (limit {campaign.MAX_BYTES})")]:
        proc = dry_run(path)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr == (f"dlbench: error: --campaign {path}: {why}: a campaign file is a "
                               "regular file of at most 1 MiB\n")


def test_a_campaign_of_1_mib_of_keys_is_read_in_a_few_seconds(tmp_path):
    """Each key's line was found by counting the line ends before it: 200,000 keys, 89 s."""
    import itertools
    import string
    import time

    names = ("".join(t) for n in (1, 2, 3) for t in itertools.product(string.ascii_letters, repeat=n))
    lines = ['name = "keys"']
    for name in names:
        lines.append(f"{name}=1")
        if len(lines) * 6 > campaign.MAX_BYTES:
            break
    path = write(tmp_path, "\n".join(lines[:-1]) + "\n")
    assert path.stat().st_size <= campaign.MAX_BYTES
    started = time.monotonic()
    proc = dry_run(path)
    assert time.monotonic() - started < 30
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"dlbench: error: {path}:2: a: unknown key (and ")


def test_an_axis_value_a_model_lacks_is_an_error_on_the_command_line_too():
    proc = dlbench("run", "--frameworks", "caffe", "--datasets", "mnist", "--sweep", "epochs=1,2",
                   "--dry-run")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "dlbench: error: caffe/mnist has no hyper-parameter 'epochs' (it has: batch_size, epsilons, "
        "export_onnx, gamma, learning_rate, lr_policy, max_iter, momentum, omp_threads, pgd_epsilon, power, "
        "robust_images, snapshot, snapshot_after_train, test_batch_size, test_interval, test_iter, "
        "weight_decay)"]


def test_dry_run_prints_the_plan_and_touches_no_docker(tmp_path):
    path = write(tmp_path, EXAMPLE)
    proc = dlbench("run", "--campaign", path, "--dry-run", "--format", "json", "--threads", "1,2",
                   env={"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}, check=True)
    jobs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(jobs) == 24 and "24 job(s) in campaign lenet-sweep" in proc.stderr
    assert jobs[0]["framework"] == "caffe" and jobs[0]["overrides"] == {"batch_size": 32, "max_iter": 50}
    assert not (tmp_path / "dlbench-results").exists()


def test_cross_settings_in_a_file_and_as_an_option(tmp_path):
    text = EXAMPLE.replace("seed = 5\n", 'seed = 5\nsettings_from = ["own", "caffe"]\n')
    jobs = plan_of(write(tmp_path, text), repeats=1).jobs
    # caffe's own jobs appear once; torch's with its own and with caffe's defaults
    assert {(j.framework, j.settings_from) for j in jobs} == {
        ("caffe", None), ("pytorch", None), ("pytorch", "caffe")}
    assert len(jobs) == (2 + 2 + 2) * 2       # x batch sizes x threads
    with pytest.raises(UsageError, match=r"campaign.toml:8: settings_from\[1\]: 'cafe': give own, a framework "):
        plan_of(write(tmp_path, text.replace('"caffe"]', '"cafe"]')))
    proc = dlbench("run", "--frameworks", "pytorch", "--datasets", "mnist", "--settings-from", "cafe",
                   "--dry-run")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "dlbench: error: --settings-from 'cafe': give own, a framework (caffe, tensorflow, torch, "
        "pytorch, mxnet, theano, pytorch2, jax) or FRAMEWORK/DATASET (mnist, cifar10)"]
    proc = dlbench("run", "--frameworks", "pytorch", "--datasets", "mnist", "--settings-from", "caffe",
                   "--dry-run", "--format", "json", check=True)
    job, = [json.loads(line) for line in proc.stdout.splitlines()]
    assert job["settings_from"] == "caffe" and job["hyperparameters"]["batch_size"] == 64


# -- real campaigns ----------------------------------------------------------------------------
# Two frameworks with short jobs: caffe counts iterations (max_iter), mxnet can stop
# each epoch after max_batches.
SHORT = """\
name = "short-sweep"
frameworks = ["caffe", "mxnet"]
datasets = ["mnist"]
profiles = ["quick"]
threads = [1, 2]
repeats = 1

[hyperparameters]
batch_size = [32, 64]
test_batch_size = 500

[hyperparameters.caffe]
max_iter = 50

[hyperparameters.mxnet]
max_batches = 20

[limits]
timeout = 600
"""


def start(*args, sigint_ignored=False) -> subprocess.Popen:
    """dlbench as a user starts it; ``sigint_ignored`` as a shell starts a background job
    (SIGINT ignored, which Python keeps: dlbench must install its own handler)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DLBENCH_DATA_DIR", "DLBENCH_RESULTS_DIR")}
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    return subprocess.Popen([sys.executable, "-m", "orchestrator", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=ignore)


def campaign_containers(name: str, all_=True) -> list:
    import docker
    return docker.from_env().containers.list(all=all_, filters={
        "label": ["org.dlbench.role=job", f"org.dlbench.campaign={name}"]})


class JobStarts:
    """Docker's start events of a campaign's job containers, pushed by the daemon: the
    test acts at a known point of the run instead of polling for it.  Subscribed
    before dlbench starts, so no event is missed."""

    def __init__(self, campaign_name: str):
        import docker
        self.stream = docker.from_env().events(decode=True, filters={
            "type": "container", "event": "start",
            "label": ["org.dlbench.role=job", f"org.dlbench.campaign={campaign_name}"]})

    def wait(self, count: int, proc: subprocess.Popen, timeout: float):
        """Block until the ``count``-th job container has started; returns its labels."""
        import threading
        timer = threading.Timer(timeout, self.stream.close)
        timer.start()
        try:
            seen = 0
            for event in self.stream:
                seen += 1
                if seen == count:
                    return event["Actor"]["Attributes"]
        finally:
            timer.cancel()
        raise AssertionError(f"saw {seen} job start(s) of {count} in {timeout} s "
                             f"(dlbench exit code {proc.poll()})")

    def close(self):
        self.stream.close()


def row_files(results: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in store.row_files(results)}


@pytest.mark.docker
def test_a_campaign_interrupted_in_the_middle_then_resumed(tmp_path, data_root):
    name = f"short-sweep-{os.getpid()}"
    path = write(tmp_path, SHORT.replace('name = "short-sweep"', f'name = "{name}"'))
    results = tmp_path / "results"
    args = ("run", "--campaign", path, "--results", results, "--data-dir", data_root)
    starts = JobStarts(name)
    # started as CI's shell starts a background job: SIGINT ignored on the way in
    proc = start(*args, sigint_ignored=True)
    try:
        # the third job's container has started, so the first two rows are stored: Ctrl-C
        starts.wait(3, proc, 900)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        starts.close()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted; the rows stored so far are kept" in stderr
    assert campaign_containers(name) == []          # the running job's container is gone
    kept = row_files(results)
    assert len(kept) == 2, stderr
    # the interrupted job's directory went with it; the finished jobs' stay
    assert {p.name for p in (results / store.JOBS).iterdir()} == set(store.load(results).run_id)
    assert (store.load(results)["status"] == "ok").all()

    resumed = dlbench(*args, "--resume", check=True)
    # (an image rebuilt in between, e.g. its adapter edited, gives new job ids: all would run)
    assert f"resume: {len(kept)} job(s) already stored as ok, {8 - len(kept)} to run" in resumed.stderr, \
        resumed.stderr
    after = row_files(results)
    assert {k: after[k] for k in kept} == kept     # the rows from before are untouched
    frame = store.load(results)
    assert len(frame) == 8 and (frame["status"] == "ok").all(), frame[["status", "error"]]
    assert frame["job_id"].is_unique and set(frame["campaign"]) == {name}
    cells = set(zip(frame.framework, frame.batch_size, frame.threads))
    assert cells == {(fw, bs, t) for fw in ("caffe", "mxnet") for bs in (32, 64) for t in (1, 2)}
    assert set(frame.cpuset) == {"0", "0-1"}
    assert all(json.loads(h)["test_batch_size"] == 500 for h in frame.hyperparameters)
    # every ok job has its resource trace, and a peak memory the kernel agrees with
    traces = store.load_traces(results)
    assert set(traces.run_id) == set(frame.run_id)
    for row in frame.itertuples():
        assert row.trace_samples == (traces.run_id == row.run_id).sum() > 0
        # the sampled peak against the kernel's: the robustness and migration checks after
        # training allocate for a second or less, between two samples (14% below, once)
        assert row.memory_peak_bytes <= 1.05 * row.memory_peak_cgroup_bytes
        assert row.memory_peak_bytes >= 0.75 * row.memory_peak_cgroup_bytes
    # a second --resume has nothing to do
    again = dlbench(*args, "--resume", check=True)
    assert "resume: 8 job(s) already stored as ok, 0 to run" in again.stderr, again.stderr
    assert row_files(results) == after


@pytest.mark.docker
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_stops_and_removes_the_running_container(tmp_path, data_root, signum):
    results = tmp_path / "results"
    name = f"stop-{signum.name.lower()}-{os.getpid()}"
    starts = JobStarts(name)
    proc = start("run", "--frameworks", "caffe", "--datasets", "mnist", "--profile", "quick",
                 "--name", name, "--results", results, "--data-dir", data_root)
    try:
        starts.wait(1, proc, 600)
        assert len(list((results / store.JOBS).iterdir())) == 1
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=60)
    finally:
        starts.close()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum and "interrupted" in stderr, stderr
    assert campaign_containers(name) == []
    assert row_files(results) == {}                 # an unfinished job leaves no row
    assert list((results / store.JOBS).iterdir()) == []     # and no job directory


@pytest.mark.docker
def test_two_runs_at_once_on_one_results_directory_corrupt_nothing(tmp_path, data_root):
    results = tmp_path / "results"
    common = ("--frameworks", "caffe", "--datasets", "mnist", "--profile", "quick",
              "--set", "max_iter=30", "--set", "test_batch_size=500", "--threads", "1",
              "--results", results, "--data-dir", data_root)
    first = start("run", "--name", "first", "--batch-sizes", "16,32", *common)
    second = start("run", "--name", "second", "--batch-sizes", "48,64", *common)
    outputs = [p.communicate(timeout=900) for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, outputs
    frame = store.load(results)
    assert len(frame) == 4 and (frame["status"] == "ok").all()
    assert sorted(zip(frame.campaign, frame.batch_size)) == [
        ("first", 16), ("first", 32), ("second", 48), ("second", 64)]
    assert len(pd.read_parquet(results / "runs")) == 4
    assert not [p for p in results.rglob("*") if p.name.endswith(".tmp")]
    for row in frame.itertuples():
        job = results / "_jobs" / row.run_id
        assert {p.name for p in job.iterdir()} == {"job.json", "result.json", "log.txt"}
        assert json.loads((job / "result.json").read_text())["run_id"] == row.run_id
        assert store.trace_path(results, row.run_id).is_file()


def test_concurrent_writers_never_lose_or_tear_a_row(tmp_path):
    """Two processes appending rows to one directory while a third reads it."""
    results = tmp_path / "results"
    code = ("import sys; from pathlib import Path; from orchestrator import store;"
            "from test_store import record_for;"
            "tmp = Path(sys.argv[1]); rec = record_for(tmp, exit_code=1);"
            "[store.append(Path(sys.argv[2]), [rec.model_copy(update={'run_id': f'{sys.argv[3]}{i:05d}'})])"
            " for i in range(150)]")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent))
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    writers = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / name), str(results), name],
                                env=env) for name in ("a", "b")]
    seen = 0
    while any(w.poll() is None for w in writers):
        if results.is_dir():
            seen = max(seen, len(store.load(results)))   # never a torn or half-written file
    assert [w.wait(timeout=300) for w in writers] == [0, 0]
    frame = store.load(results)
    assert len(frame) == 300 and frame["run_id"].is_unique and seen <= 300
    assert not list(results.rglob("*.tmp"))             # no temporary file left behind


# -- a stop signal while a job's files are made or its row is stored ---------------------------
class Immediate:
    """A runtime whose jobs end at once with a valid result (no Docker)."""

    name, default_memory, gpus = "native", None, None

    def host_facts(self):
        return {}

    def target(self, framework, variant):
        from orchestrator.runtimes import Target
        return Target("immediate", "immediate")

    def unsupported(self, target, job):
        return None

    def run(self, job, target, run_id, job_id, job_dir, dataset_path, display, inputs=None):
        from conftest import immediate_result
        from orchestrator.runtimes import Outcome

        immediate_result(job, run_id, job_id, job_dir)
        return Outcome(exit_code=0, wall_time_s=0.1, log_tail=[])

    def cancel(self):
        pass

    def close(self):
        pass


@pytest.fixture
def signal_at(monkeypatch):
    """``signal_at(module, name)``: SIGTERM arrives, as the signal handler takes it, just
    after ``module.name`` is called (the handlers are put back after the test)."""
    from orchestrator import datasets, interrupts

    monkeypatch.setattr(interrupts, "received", [])
    monkeypatch.setattr(datasets, "prepare", lambda names, *a, **k: {
        name: datasets.VerifiedDataset(name, Path("/nonexistent"), "0" * 64, {}, None) for name in names})
    saved = {signum: signal.getsignal(signum) for signum in interrupts.STOP_SIGNALS}

    def at(module, name):
        real = getattr(module, name)

        def then_a_signal(*args, **kwargs):
            done = real(*args, **kwargs)
            interrupts._interrupt(signal.SIGTERM, None)
            return done
        monkeypatch.setattr(module, name, then_a_signal)
    yield at
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def kept(results: Path) -> tuple[list, list, list]:
    """The run ids of the stored rows, of the job directories, and the rescue files."""
    rows = sorted(store.load(results)["run_id"]) if store.row_files(results) else []
    return (rows, sorted(p.name for p in (results / store.JOBS).iterdir()) if (results / store.JOBS).is_dir() else [],
            sorted(p.name for p in (results / store.RESCUED).iterdir()) if (results / store.RESCUED).is_dir() else [])


@pytest.mark.parametrize("module, name", [("run", "collect"), ("store", "write_side"), ("store", "append")])
def test_a_stop_signal_while_a_row_is_stored_keeps_the_row_with_its_job_directory(tmp_path, signal_at,
                                                                                  module, name):
    """A signal within milliseconds of a row's write left a job directory without its row."""
    from orchestrator import run

    results = tmp_path / "results"
    signal_at({"run": run, "store": store.rescue}[module], name)     # where store_row looks them up
    with pytest.raises(KeyboardInterrupt):
        run.run_plan(plan_of(None, frameworks=["caffe"], datasets=["mnist"], profiles=["quick"],
                             repeats=2), results, runtime=Immediate())
    rows, job_dirs, rescued = kept(results)
    assert len(rows) == 1 and job_dirs == rows and rescued == []
    assert {p.name for p in (results / store.JOBS / rows[0]).iterdir()} == {"job.json", "log.txt", "result.json"}


def test_a_stop_signal_while_a_jobs_files_are_made_leaves_none_of_them(tmp_path, signal_at):
    """A signal just after the room for the row was set aside left it, blank, for good."""
    from orchestrator import run

    results = tmp_path / "results"
    signal_at(store, "Rescue")
    with pytest.raises(KeyboardInterrupt):
        run.run_plan(plan_of(None, frameworks=["caffe"], datasets=["mnist"], profiles=["quick"]),
                     results, runtime=Immediate())
    assert kept(results) == ([], [], [])
