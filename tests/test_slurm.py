"""The Slurm scheduler on a real local Slurm cluster: two slurmd nodes, one slurmctld,
munged (``scripts/slurm-cluster``), real arrays, real containers, real MNIST.

The faults are real too: a node whose every process is killed (slurmd, its job
steps, the dlbench process and its container), a task ``scancel``ed, a task past
its Slurm time limit (its container frozen with ``docker pause``, a job that hangs).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, dlbench

pytestmark = [pytest.mark.slurm, pytest.mark.docker]

SCRIPT = REPO / "scripts" / "slurm-cluster"
NODES = ("n1", "n2")


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.env = {"SLURM_CONF": str(root / "slurm.conf")}

    def run(self, *args, check=True) -> subprocess.CompletedProcess:
        return subprocess.run([str(a) for a in args], capture_output=True, text=True, check=check,
                              env={**os.environ, **self.env}, timeout=120)

    def script(self, *args):
        return self.run(SCRIPT, *args, self.root)

    def queue(self) -> list[str]:
        return self.run("squeue", "-h", "-r", "-o", "%i %T %N").stdout.split("\n")[:-1]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root (network namespaces, a bridge)")
    root = tmp_path_factory.mktemp("slurm")
    try:
        up = subprocess.run([SCRIPT, "up", root], capture_output=True, text=True, timeout=600)
        assert up.returncode == 0, up.stderr
        yield Cluster(root)
    finally:         # also after a failed start: what did start is stopped
        _down_and_gone(root)
        assert [c for c in _campaigns_of_running() if c.startswith("slurm-test-")] == []


def _down_and_gone(root: Path) -> None:
    """`down`, then nothing of the cluster is left: no namespace, no daemon, no slot."""
    slot = (root / "slot").read_text().strip() if (root / "slot").exists() else None
    subprocess.run([SCRIPT, "down", root], check=True, capture_output=True, timeout=300)
    if slot is not None:
        assert not [n for n in os.listdir("/run/netns") if n.startswith(f"dlbench-slurm-{slot}-")]
        assert not Path(f"/run/dlbench-slurm/{slot}").exists()
    leftovers = subprocess.run(["pgrep", "-af", str(root)], capture_output=True, text=True).stdout
    assert leftovers.strip() == "", leftovers


def test_a_second_cluster_runs_beside_the_first_and_goes_down_alone(cluster, tmp_path):
    """Clusters of other directories (another test run's, one a killed run left up) do
    not stand in each other's way: each has its own slot, bridge, subnet and namespaces."""
    other = tmp_path / "other"
    try:
        up = subprocess.run([SCRIPT, "up", other], capture_output=True, text=True, timeout=600)
        assert up.returncode == 0, up.stderr
        slots = {(cluster.root / "slot").read_text(), (other / "slot").read_text()}
        assert len(slots) == 2
        nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True,
                               env={**os.environ, "SLURM_CONF": str(other / "slurm.conf")})
        assert sorted(nodes.stdout.split("\n")[:-1]) == ["n1 idle", "n2 idle"], nodes.stderr
    finally:
        _down_and_gone(other)
    assert cluster.script("status").returncode == 0     # the first one is still up


def _containers(*labels) -> list[str]:
    args = ["docker", "ps", "-aq"]
    for label in labels:
        args += ["--filter", f"label={label}"]
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout.split()


def _campaigns_of_running() -> list[str]:
    ids = _containers("org.dlbench.role=job")
    if not ids:
        return []
    out = subprocess.run(["docker", "inspect", "-f", '{{index .Config.Labels "org.dlbench.campaign"}}',
                          *ids], capture_output=True, text=True).stdout
    return out.split()


def _rows(results: Path) -> pd.DataFrame:
    from orchestrator import store
    return store.load(results)


def _campaign() -> str:
    return f"slurm-test-{uuid.uuid4().hex[:6]}"


def _one_line_error(proc):
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlbench: error:"), proc.stderr
    return lines[0]


def test_a_missing_data_directory_is_one_line_and_makes_no_results_folder(cluster, tmp_path):
    results = tmp_path / "results"
    proc = dlbench("run", "--scheduler", "slurm", "--frameworks", "caffe", "--datasets", "mnist",
                   "--profile", "quick", "--results", results, "--data-dir", tmp_path / "no-data",
                   env=cluster.env)
    assert "no-data" in _one_line_error(proc)
    assert not results.exists()             # nothing written before every input was checked


def test_a_campaign_runs_as_one_array_over_both_nodes(cluster, data_root, tmp_path):
    results, name = tmp_path / "results", _campaign()
    proc = dlbench("run", "--scheduler", "slurm", "--frameworks", "mxnet,caffe", "--datasets", "mnist",
                   "--profile", "quick", "--repeats", "2", "--name", name, "--results", results,
                   "--data-dir", data_root, env=cluster.env, check=True)
    array_id = proc.stdout.strip()
    assert array_id.isdigit()
    assert f"submitted 4 job(s) as Slurm array {array_id}" in proc.stderr
    assert "4/4 stored" in proc.stderr
    frame = _rows(results)
    assert len(frame) == 4
    assert list(frame.status) == ["ok"] * 4
    assert set(frame.node) == set(NODES)                  # spread over both nodes
    assert set(frame.slurm_job_id) == {array_id}
    assert sorted(frame.slurm_array_task_id) == [0, 1, 2, 3]
    assert set(frame.campaign) == {name}
    assert (frame.accuracy > 0.9).all()
    # the image that ran, by id: the one the submitter saved for the nodes
    for _, row in frame.iterrows():
        saved = results / "_slurm" / "images" / f"{row.image_id.replace(':', '-')}.tar"
        assert saved.is_file()
        assert row.image == f"dlbench/{row.framework}:cpu"
    assert cluster.queue() == []
    report = dlbench("report", "--results", results, "--format", "csv", check=True)
    assert "mxnet" in report.stdout and "caffe" in report.stdout
    status = dlbench("status", "--results", results, check=True)
    assert f"array {array_id} ({name}): 4 job(s): 4 stored ok" in status.stdout


def _wait(predicate, what: str, timeout: float = 180.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def _task_containers(array_file: Path, campaign: str) -> dict[int, str]:
    """The running job containers of the array, by task index (matched by job id; only
    the campaign's own: other runs on this host may run the very same job)."""
    if not array_file.exists():
        return {}
    tasks = {t["job_id"]: i for i, t in enumerate(json.loads(array_file.read_text())["tasks"])}
    found = {}
    for cid in _containers("org.dlbench.role=job", f"org.dlbench.campaign={campaign}"):
        out = subprocess.run(["docker", "inspect", "-f",
                              '{{index .Config.Labels "org.dlbench.job-id"}} {{.State.Running}}', cid],
                             capture_output=True, text=True).stdout.split()
        if len(out) == 2 and out[0] in tasks and out[1] == "true":
            found[tasks[out[0]]] = cid
    return found


def test_tasks_that_slurm_ends_leave_one_row_each_and_resume_reruns_them(cluster, data_root, tmp_path):
    results, name = tmp_path / "results", _campaign()
    args = ["run", "--scheduler", "slurm", "--frameworks", "mxnet", "--datasets", "mnist",
            "--profile", "quick", "--repeats", "4", "--name", name, "--results", results,
            "--data-dir", data_root]
    env = {**os.environ, **cluster.env, "PYTHONUNBUFFERED": "1"}
    env.pop("DLBENCH_DATA_DIR", None)
    follower = subprocess.Popen([os.sys.executable, "-m", "orchestrator", *map(str, args)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        arrays = results / "_slurm" / "arrays"
        array_file = _wait(lambda: next(iter(arrays.glob("*.json")), None) if arrays.is_dir() else None,
                           "the submission", timeout=300)
        array_id = array_file.stem
        # tasks 0 and 1 start first, one on each node: freeze both jobs as soon as they run
        first = _wait(lambda: (lambda c: c if {0, 1} <= set(c) else None)(_task_containers(array_file, name)),
                      "tasks 0 and 1 to run")
        for index in (0, 1):
            cluster.run("docker", "pause", first[index])
        nodes = dict(line.split()[::2] for line in cluster.queue() if line.split()[1] == "RUNNING")
        crashed, survivor = nodes[f"{array_id}_0"], nodes[f"{array_id}_1"]
        assert {crashed, survivor} == set(NODES)
        # task 0: its node dies (slurmd, the job, its container)
        cluster.script("kill-node", crashed)
        assert 0 not in _task_containers(array_file, name)
        # task 1: scancel
        cluster.run("scancel", f"{array_id}_1")
        # task 2 then runs on the surviving node: frozen, and given a one-minute limit
        third = _wait(lambda: _task_containers(array_file, name).get(2), "task 2 to run")
        cluster.run("docker", "pause", third)
        cluster.run("scontrol", "update", f"JobId={array_id}_2", "TimeLimit=1")
        # task 3 runs normally; the follower returns once the array has left the queue
        out, err = follower.communicate(timeout=400)
    finally:
        if follower.poll() is None:
            follower.kill()
        if "array_id" in locals():      # a failure here leaves no task for the next tests
            cluster.run("scancel", array_id, check=False)
    assert follower.returncode == 3, err            # some jobs are not ok
    assert f"array {array_id}:" in err and "queue:" in err
    frame = _rows(results)
    assert len(frame) == 4                            # exactly one row per task
    by_task = frame.set_index("slurm_array_task_id")
    assert by_task.loc[0, "status"] == "node_fail" and by_task.loc[0, "node"] == crashed
    assert by_task.loc[1, "status"] == "cancelled" and by_task.loc[1, "node"] == survivor
    assert by_task.loc[2, "status"] == "timeout"
    assert by_task.loc[3, "status"] == "ok"
    assert "Slurm ended the task: NODE_FAIL" in by_task.loc[0, "error"]
    assert cluster.queue() == []
    assert _task_containers(array_file, name) == {}         # no job container left
    status = dlbench("status", "--results", results, check=True)
    assert "1 cancelled, 1 node_fail, 1 stored ok, 1 timeout" in status.stdout

    cluster.script("up")                               # the crashed node comes back
    again = dlbench(*args, "--resume", env=cluster.env, check=True)
    assert "resume: 1 job(s) already stored as ok, 3 to run" in again.stderr
    frame = _rows(results)
    assert len(frame) == 7
    rerun = frame[frame.slurm_job_id != array_id]
    assert sorted(rerun.status) == ["ok"] * 3
    failed_jobs = set(frame[frame.status != "ok"].job_id)
    assert set(rerun.job_id) == failed_jobs
    assert set(frame[frame.status == "ok"].job_id) == set(frame.job_id)   # all jobs now ok
    assert "already stored as ok, 0 to run" not in again.stderr
    nothing = dlbench(*args, "--resume", env=cluster.env, check=True)
    assert "nothing to run" in nothing.stderr


@pytest.mark.parametrize("case", ["no sbatch", "unknown partition", "read-only results",
                                  "campaign's unknown partition"])
def test_bad_submissions_are_one_line_errors_before_anything_is_submitted(
        case, cluster, data_root, tmp_path):
    results = tmp_path / "results"
    env = dict(cluster.env)
    extra = []
    mounted = None
    if case == "no sbatch":
        empty = tmp_path / "bin"
        empty.mkdir()
        env["PATH"] = str(empty)
    elif case == "unknown partition":
        extra = ["--partition", "no-such-partition"]
    elif case == "campaign's unknown partition":     # scheduler and [slurm] from a campaign file
        campaign = tmp_path / "c.toml"
        campaign.write_text('name = "slurm-test-file"\nscheduler = "slurm"\n'
                            '[slurm]\npartition = "no-such-partition"\n')
        extra = ["--campaign", campaign]
    else:
        mounted = tmp_path / "ro"
        mounted.mkdir()
        subprocess.run(["mount", "--bind", "-o", "ro", mounted, mounted], check=True)
        results = mounted / "results"
    scheduler = [] if case.startswith("campaign") else ["--scheduler", "slurm"]
    try:
        before = cluster.run("squeue", "-h", "-o", "%i").stdout
        proc = dlbench("run", *scheduler, "--frameworks", "mxnet", "--datasets", "mnist",
                       "--profile", "quick", "--results", results, "--data-dir", data_root,
                       *extra, env=env)
        line = _one_line_error(proc)
        assert {"no sbatch": "sbatch is not on PATH",
                "unknown partition": "invalid partition specified: no-such-partition",
                "campaign's unknown partition": "invalid partition specified: no-such-partition",
                "read-only results": "cannot be written (Read-only file system)"}[case] in line
        assert cluster.run("squeue", "-h", "-o", "%i").stdout == before == ""
        assert not (results / "_slurm" / "arrays").exists()
    finally:
        if mounted is not None:
            subprocess.run(["umount", mounted], check=True)


def test_a_node_without_the_image_loads_the_saved_copy_checked_by_id(tmp_path):
    """The load path, for real: a small image of our own is saved, removed, then found
    missing by the node's check and loaded back from the saved file, the same id."""
    import docker

    from orchestrator.errors import DlbenchError
    from orchestrator.runtimes import Target
    from orchestrator.runtimes import docker as docker_runtime

    client = docker.from_env()
    tag = f"dlbench-test/slurm-load:{uuid.uuid4().hex[:8]}"
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM dlbench/root:bullseye\nLABEL org.dlbench.role=test\nRUN echo {tag} > /marker\n")
    image, _ = client.images.build(path=str(context), tag=tag, rm=True, forcerm=True,
                                   labels={"org.dlbench.role": "test"})
    folder = tmp_path / "results" / "_slurm" / "images"
    try:
        archive = docker_runtime.save_image(image, folder, lambda text: None)
        assert archive.parent == folder and archive.stat().st_size > 0
        client.images.remove(image.id, force=True)
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(image.id)
        loaded = docker_runtime.ensure_image(client, Target(tag, image.id), archive)
        assert loaded.id == image.id and tag in loaded.tags
        missing = Target(tag + "x", "sha256:" + "0" * 64)
        with pytest.raises(DlbenchError, match="not on this node and there is no saved copy"):
            docker_runtime.ensure_image(client, missing, None)
    finally:
        try:
            client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass


def test_a_tune_study_runs_each_round_of_trials_as_one_array(cluster, data_root, tmp_path):
    """dlbench tune --scheduler slurm --parallel 2: the default and one more trial as one
    array of two tasks, then the last trial; the study in a database (an SQLite URL, as a
    PostgreSQL one would be given), each trial a stored row of campaign tune:<study>."""
    import optuna

    results, study = tmp_path / "results", _campaign()
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    proc = dlbench("tune", "--scheduler", "slurm", "--frameworks", "caffe", "--datasets", "mnist",
                   "--trials", "3", "--parallel", "2", "--space", "length", "--study", study,
                   "--storage", url, "--set", "robust_images=0", "--set", "export_onnx=0",
                   "--results", results, "--data-dir", data_root, env=cluster.env)
    assert proc.returncode == 0, proc.stderr
    assert f"study {study}: 3 trial(s), kept in {url}" in proc.stdout
    frame = _rows(results)
    assert list(frame.status) == ["ok"] * 3 and set(frame.campaign) == {f"tune:{study}"}
    assert frame.groupby("slurm_job_id").size().sort_values().tolist() == [1, 2]    # two arrays
    trials = optuna.load_study(study_name=study, storage=url).trials
    assert sorted(t.user_attrs["run_id"] for t in trials) == sorted(frame.run_id)
    assert not (results / "tune").exists()          # the database holds the study, not a journal


@pytest.mark.training
def test_native_workers_span_the_nodes_of_a_task_and_a_killed_one_fails_it(cluster, data_root, tmp_path):
    """--runtime native --workers 2: the job's task holds both nodes (an array of its own),
    srun starts a worker on each at the node's address, TensorFlow's strategy all-reduces
    between them; the row says 2 workers on 2 nodes.  Then a worker killed on the second
    node while the job runs: srun stops the other, the row is failed and names the worker
    and its node, and no process of the job is left on either."""
    import psutil

    python = REPO / ".venv-native" / "tensorflow" / "bin" / "python"
    if not python.exists():
        subprocess.run([str(REPO / "scripts" / "native-env"), "tensorflow"], check=True)
    args = ["run", "--scheduler", "slurm", "--runtime", "native", "--python", python,
            "--frameworks", "tensorflow", "--datasets", "mnist", "--profile", "quick",
            "--workers", "2", "--cpus", "2", "--set", "max_steps=60", "--set", "robust_images=0",
            "--data-dir", data_root]
    ok = tmp_path / "ok"
    proc = dlbench(*args, "--name", _campaign(), "--results", ok, env=cluster.env, check=True)
    assert "as Slurm array" in proc.stderr and "each on 2 nodes" in proc.stderr, proc.stderr
    row = _rows(ok).iloc[0]
    assert row.status == "ok", row.error
    assert (row.workers, row.nodes, row.dist_engine) == (2, 2, "MultiWorkerMirroredStrategy")
    assert row.runtime == "native" and row.node in NODES and len(row.worker_train_time_s) == 2
    assert row.accuracy > 0.5

    def workers(results, rank):
        found = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if "dlbench_runner" in " ".join(p.info["cmdline"] or []) and \
                        str(results.resolve()) in " ".join(p.info["cmdline"] or []) and \
                        p.environ().get("DLBENCH_WORKER_RANK") == rank:
                    found.append(p)
            except psutil.Error:
                pass
        return found

    killed = tmp_path / "killed"
    follower = subprocess.Popen([os.sys.executable, "-m", "orchestrator", *map(str, args), "--name",
                                 _campaign(), "--results", str(killed)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **cluster.env})
    try:
        other = _wait(lambda: [p for p in workers(killed, "1") if p.cpu_times().user > 5],
                      "worker 1 to train", timeout=300, every=0.5)[0]
        node = other.environ().get("SLURMD_NODENAME")
        other.kill()
        _, err = follower.communicate(timeout=300)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 3, err
    row = _rows(killed).iloc[0]
    assert row.status == "failed" and row.nodes == 2
    assert row.error.startswith(f"worker 1 of 2 (on {node}): "), row.error
    assert "srun stopped the others" in row.error
    assert workers(killed, "0") == workers(killed, "1") == []
    assert cluster.queue() == []
