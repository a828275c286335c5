"""The whole pipeline as a user runs it: real images, real containers, real MNIST.

The pytorch image is built (or found up to date) once; one quick run leaves a
row that the other tests read, and every bad input is tried against that
results directory to prove that nothing stored is lost.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from conftest import assert_migration, assert_model_size, assert_robustness, dlbench
from orchestrator import hostinfo

pytestmark = pytest.mark.docker

FRAMEWORK = "pytorch"


@pytest.fixture(scope="module")
def quick_dir(quick_run) -> Path:
    """The results directory of one quick pytorch run on MNIST, which the tests read."""
    return quick_run(FRAMEWORK, "mnist")


def snapshot(results: Path) -> dict:
    return {str(p.relative_to(results)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(results.rglob("*")) if p.is_file()}


def test_quick_run_stores_an_ok_row_with_provenance(quick_dir, data_root):
    frame = pd.read_parquet(quick_dir / "runs")
    assert len(frame) == 1
    row = frame.iloc[0]
    assert (row.framework, row.dataset, row.profile, row.status) == ("pytorch", "mnist", "quick", "ok")
    assert row.accuracy >= 0.94                 # the first 20,000 images, once: 95.7%
    assert row.param_count == 169506            # 832 + 51264 + 115400 + 2010
    assert_model_size(row, at_most=1.01)        # the state_dict: float32 weights
    found = assert_robustness(quick_dir, row)   # attacked with autograd's input gradients
    assert found["none", 0.0].accuracy >= 0.9 and found["fgsm", 0.3].accuracy < 0.5
    assert_migration(quick_dir, row)            # torch.onnx.export of pixels -> log-probabilities
    assert row.train_time_s > 0 and row.test_time_s > 0 and row.setup_time_s > 0
    assert row.wall_time_s > row.total_time_s   # includes the container's start and stop
    assert len(row.epoch_loss) == 1 and row.train_samples == 20000 and row.test_samples == 10000
    assert row.image == "dlbench/pytorch:cpu" and row.image_id.startswith("sha256:")
    assert row.framework_version.startswith("1.7") and row.blas_loaded == "openblas-pthread"
    assert row.docker_version and row.host_cpu_model and row.dlbench_version
    # the host's timing facts: the load when the run started, as this host shows it
    assert 0 <= row.host_load_avg and row.host_isolated_cpus == hostinfo.isolated_cpus()
    assert (row.host_cpu_governor if pd.notna(row.host_cpu_governor) else None) == hostinfo.cpu_governor()
    assert row.dataset_sha256 == __import__("orchestrator.datasets", fromlist=["x"]).verify(
        "mnist", data_root).sha256
    assert json.loads(row.threads_env)["OMP_NUM_THREADS"] == str(row.threads)
    job_dir = quick_dir / "_jobs" / row.run_id
    assert {p.name for p in job_dir.iterdir()} == {"job.json", "result.json", "log.txt"}


def test_results_command_prints_table_csv_and_json(quick_dir):
    as_json = json.loads(dlbench("results", "--results", quick_dir, "--format", "json",
                                 check=True).stdout)
    assert as_json[0]["status"] == "ok" and as_json[0]["framework"] == "pytorch"
    as_csv = dlbench("results", "--results", quick_dir, "--format", "csv", check=True).stdout
    assert as_csv.splitlines()[0].startswith("schema_version,written_schema_version,run_id,job_id,status")
    table = dlbench("results", "--results", quick_dir, check=True).stdout
    assert "1 stored run(s)" in table and "pytorch" in table


def test_a_second_build_with_nothing_changed_reuses_every_image(built):
    again = dlbench("build-images", "--frameworks", "pytorch", check=True)
    assert "dlbench/base:bullseye: up to date" in again.stderr
    assert "dlbench/pytorch:cpu: up to date" in again.stderr
    assert again.stdout.split()[1] == built.stdout.split()[1]     # same image id


def test_images_carry_their_labels(built):
    import docker
    labels = docker.from_env().images.get("dlbench/pytorch:cpu").labels
    assert labels["org.dlbench.framework"] == "pytorch"
    assert labels["org.dlbench.framework-version"] == "1.7.1-7"
    assert labels["org.dlbench.debian-suite"] == "bullseye"
    assert labels["org.dlbench.build-date"] and labels["org.dlbench.version"]


def one_line_error(proc, pattern):
    import re
    assert proc.returncode != 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in proc.stderr


def test_bad_inputs_fail_in_one_line_and_lose_no_results(quick_dir, data_root, tmp_path):
    before = snapshot(quick_dir)
    base = ["run", "--frameworks", "pytorch", "--datasets", "mnist", "--profile", "quick",
            "--results", quick_dir]

    one_line_error(dlbench("run", "--frameworks", "tensorfow", "--results", quick_dir),
                   r"^dlbench: error: unknown framework 'tensorfow'")

    one_line_error(dlbench(*base, "--data-dir", data_root,
                           env={"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}),
                   r"cannot reach the Docker daemon")

    broken = tmp_path / "data"
    shutil.copytree(data_root / "mnist", broken / "mnist")
    labels = broken / "mnist" / "train-labels-idx1-ubyte.gz"
    labels.write_bytes(gzip.compress(gzip.decompress(labels.read_bytes())[:-10]))
    one_line_error(dlbench(*base, "--data-dir", broken),
                   r"train-labels-idx1-ubyte\.gz: 59998 bytes, expected 60008")

    one_line_error(dlbench(*base, "--data-dir", data_root, "--gpu", "99"),
                   r"--gpu 99: (this host has no NVIDIA GPU|no such GPU)")

    assert snapshot(quick_dir) == before
    assert len(pd.read_parquet(quick_dir / "runs")) == 1


def test_images_trust_the_hosts_ca_bundle(built):
    """Every certificate of the host's bundle is in the images' system bundle (proxies)."""
    import docker

    from orchestrator.build import find_ca_bundle

    host = find_ca_bundle().read_text()
    certs = {block.split("-----END CERTIFICATE-----")[0].strip()
             for block in host.split("-----BEGIN CERTIFICATE-----")[1:]}
    image_bundle = docker.from_env().containers.run(
        "dlbench/pytorch:cpu", entrypoint=["cat", "/etc/ssl/certs/ca-certificates.crt"],
        remove=True, network_mode="none").decode()
    env = docker.from_env().images.get("dlbench/base:bullseye").attrs["Config"]["Env"]
    assert certs and all(cert in image_bundle for cert in certs)
    assert "PIP_CERT=/etc/ssl/certs/ca-certificates.crt" in env


def test_a_job_over_its_time_limit_is_a_timeout_row_and_stale_containers_go(built, data_root, tmp_path):
    import subprocess
    import sys

    import docker

    from orchestrator import owners

    client = docker.from_env()
    # a dlbench that died: its lock file is here, and nobody holds it
    code = "import os; from orchestrator import owners; print(owners.Owner().token, flush=True); os._exit(0)"
    dead = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    stale_dir = tmp_path / "results" / "_jobs" / "00000000deadbeef"
    stale_dir.mkdir(parents=True)
    stale = client.containers.run(
        "dlbench/pytorch:cpu", entrypoint=["sleep", "600"], detach=True, network_mode="none",
        labels={"org.dlbench.role": "job", "org.dlbench.owner": dead,
                "org.dlbench.run-id": stale_dir.name, "org.dlbench.results": str(tmp_path / "results")})
    try:
        proc = dlbench("run", "--frameworks", "pytorch", "--datasets", "mnist", "--profile", "quick",
                       "--results", tmp_path / "results", "--data-dir", data_root, "--timeout", "4")
        assert proc.returncode == 3, proc.stderr
        row = pd.read_parquet(tmp_path / "results" / "runs").iloc[0]
        assert row.status == "timeout" and "time limit of 4 s" in row.error
        assert 4 <= row.wall_time_s < 60
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(stale.id)
        assert not stale_dir.exists() and not (owners.owners_dir() / f"{dead}.lock").exists()
        assert not client.containers.list(all=True, filters={"label": f"org.dlbench.run-id={row.run_id}"})
    finally:
        try:
            stale.remove(force=True)
        except docker.errors.NotFound:
            pass


def test_resume_skips_jobs_already_stored_as_ok(quick_dir, data_root):
    before = snapshot(quick_dir)
    proc = dlbench("run", "--frameworks", "pytorch", "--datasets", "mnist", "--profile", "quick",
                   "--results", quick_dir, "--data-dir", data_root, "--resume", check=True)
    assert "resume: 1 job(s) already stored as ok, 0 to run" in proc.stderr
    assert snapshot(quick_dir) == before


def test_a_running_job_is_pinned_limited_and_locked_down(built, data_root, tmp_path):
    import subprocess
    import sys
    import time

    import docker

    client = docker.from_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "--frameworks", "pytorch", "--datasets", "mnist",
         "--profile", "quick", "--cpus", "1", "--memory", "3g", "--timeout", "30",
         "--results", str(tmp_path / "results"), "--data-dir", str(data_root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        attrs = None
        deadline = time.monotonic() + 120
        while attrs is None and time.monotonic() < deadline and proc.poll() is None:
            for container in client.containers.list(filters={"label": "org.dlbench.role=job"}):
                if str(tmp_path / "results") in str(container.attrs["HostConfig"]["Binds"]):
                    attrs = container.attrs
            time.sleep(0.5)
        assert attrs is not None, "no running job container was seen"
        host = attrs["HostConfig"]
        assert host["CpusetCpus"] == "0" and host["NanoCpus"] == 10**9
        assert host["Memory"] == 3 * 2**30
        assert host["NetworkMode"] == "none"
        assert host["ReadonlyRootfs"] is True and "noexec" in host["Tmpfs"]["/tmp"].split(",")
        assert host["Init"] is True and host["PidsLimit"] > 0
        assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
        assert attrs["Config"]["User"] not in ("", "0", "root", "0:0")
        assert attrs["Config"]["Env"].count("OMP_NUM_THREADS=1") == 1
        binds = {b.split(":")[1]: b.split(":")[2] for b in host["Binds"]}
        assert binds["/data/mnist"] == "ro" and binds["/job.json"] == "ro" and binds["/out"] == "rw"
    finally:
        proc.wait(timeout=300)
    row = pd.read_parquet(tmp_path / "results" / "runs").iloc[0]
    assert row.threads == 1 and row.cpus == 1 and row.cpuset == "0"
