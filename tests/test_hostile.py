"""A job's output is hostile input; clean-up trusts only lock files; every job container
runs with the CIS defaults.

The container tests run a tiny job image (``fixtures/hostile/hostile.py`` on the base
image) in place of a framework image: it plants symbolic links to a host file (by
absolute and relative paths), links to devices and directories, FIFOs and big files
under the names the host writes and reads.  The host file must stay as it was, none
of it may reach a row or the results directory, and each row must say what happened.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import build, campaign, jobdir, owners, run, runtimes, store
from orchestrator.display import NullDisplay
from orchestrator.options import RunOptions
from orchestrator.runtimes import docker as docker_runtime, follow_output

HOSTILE = Path(__file__).parent / "fixtures" / "hostile"
TEST_LABEL = "org.dlbench.test"


# -- the reader, on the host (no Docker) -------------------------------------------------

@pytest.fixture
def job_dir(tmp_path) -> Path:
    path = tmp_path / "results" / store.JOBS / "0123456789abcdef"
    path.mkdir(parents=True)
    (path / jobdir.OUT).mkdir()
    return path


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "secret"
    path.write_text('{"schema_version": 1, "status": "SECRET-reader"}')
    path.chmod(0o600)
    return path


def plant(job_dir: Path, make) -> tuple[bytes | None, str | None]:
    make(job_dir / jobdir.OUT / "result.json")
    return jobdir.read_output(job_dir, "result.json", 100)


def test_the_reader_takes_a_regular_file_within_the_cap(job_dir):
    (job_dir / "out" / "result.json").write_bytes(b"{}")
    assert jobdir.read_output(job_dir, "result.json", 100) == (b"{}", None)
    assert jobdir.take_result(job_dir, 100) == (b"{}", None)
    assert (job_dir / "result.json").read_bytes() == b"{}"
    assert not (job_dir / "out").exists()


@pytest.mark.parametrize("make, why", [
    (lambda p, s: p.symlink_to(s), "result.json is not a regular file (a symbolic link)"),
    (lambda p, s: p.symlink_to(os.path.relpath(s, p.parent)), "result.json is not a regular file (a symbolic link)"),
    (lambda p, s: p.symlink_to("/dev/zero"), "result.json is not a regular file (a symbolic link)"),
    (lambda p, s: p.symlink_to(p.parent / "nowhere"), "result.json is not a regular file (a symbolic link)"),
    (lambda p, s: os.mkfifo(p), "result.json is not a regular file (a FIFO)"),
    (lambda p, s: p.mkdir(), "result.json is not a regular file (a directory)"),
    (lambda p, s: p.write_bytes(b"x" * 101), "result.json is 101 bytes (limit 100)"),
    (lambda p, s: None, "the runner wrote no result.json"),
])
def test_the_reader_refuses_links_fifos_directories_and_big_files(job_dir, secret, make, why):
    before = (secret.read_bytes(), secret.stat().st_mtime_ns)
    # a FIFO nobody writes to would block a plain open(): the reader must not wait
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        found = pool.submit(plant, job_dir, lambda p: make(p, secret)).result(timeout=60)
    assert found == (None, why)
    assert (secret.read_bytes(), secret.stat().st_mtime_ns) == before


def test_the_reader_follows_no_link_in_place_of_out(job_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "result.json").write_text("{}")
    (job_dir / "out").rmdir()
    (job_dir / "out").symlink_to(elsewhere)
    data, why = jobdir.take_result(job_dir, 100)
    assert data is None and why.startswith("out/ is not a directory the job made")
    assert (elsewhere / "result.json").read_text() == "{}"


def test_removing_out_follows_no_link_inside_it(job_dir, tmp_path):
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "file").write_text("stays")
    (job_dir / "out" / "link").symlink_to(kept)
    (job_dir / "out" / "sub").mkdir()
    (job_dir / "out" / "sub" / "link").symlink_to(kept / "file")
    jobdir.take_result(job_dir, 100)
    assert not (job_dir / "out").exists()
    assert (kept / "file").read_text() == "stays"


def test_host_files_are_created_new_never_through_a_link(tmp_path, secret):
    job = tmp_path / "job"
    job.mkdir()
    (job / "log.txt").symlink_to(secret)
    with pytest.raises(FileExistsError):
        jobdir.prepare(job, {"a": 1})
    assert secret.read_text() == '{"schema_version": 1, "status": "SECRET-reader"}'


def test_the_log_file_is_capped(tmp_path):
    log = jobdir.create(tmp_path / "log.txt")
    tail = follow_output((f"line {i:04d}" for i in range(1000)), log, NullDisplay(),
                                 keep=3, limit=100)
    assert tail == ["line 0997", "line 0998", "line 0999"]
    lines = (tmp_path / "log.txt").read_text().splitlines()
    assert lines == [f"line {i:04d}" for i in range(10)] + ["[dlbench: the log stops here: over 100 bytes]"]


def test_out_usage_counts_without_following_links(job_dir, tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * (1 << 20))
    (job_dir / "out" / "link").symlink_to(big)
    (job_dir / "out" / "small").write_bytes(b"x" * 4096)
    used, entries, depth = jobdir.out_usage(job_dir)
    assert entries == 2 and 4096 <= used < (1 << 20) and depth == 0
    assert jobdir.over_limit(job_dir) is None


def deep_tree(top: Path, levels: int, bottom=lambda fd: None) -> None:
    """Directories ``levels`` deep in ``top`` (``d/d/d/...``), made as a job makes them:
    each relative to the one above, so no path is ever longer than a name."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    bottom(fd)
    os.close(fd)


def test_a_tree_deeper_than_pythons_recursion_limit_is_measured_and_removed(job_dir, tmp_path):
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "file").write_text("stays")

    def plant(fd):
        os.symlink(kept, "link", dir_fd=fd)
        os.close(os.open("file", os.O_WRONLY | os.O_CREAT, dir_fd=fd))

    deep_tree(job_dir / "out", 1100, plant)
    (job_dir / "out" / "result.json").write_text("{}")
    assert jobdir.over_limit(job_dir) == (
        f"the job nested directories more than {jobdir.OUT_LIMIT_DEPTH} deep in /out")
    assert jobdir.out_usage(job_dir).depth == jobdir.OUT_LIMIT_DEPTH + 1   # counted no deeper
    assert jobdir.take_result(job_dir, 100) == (b"{}", None)
    assert not (job_dir / "out").exists()
    assert (kept / "file").read_text() == "stays"
    deep_tree(job_dir, 3000)                # an interrupted job's directory goes whole
    jobdir.remove(job_dir)
    assert not job_dir.exists() and (kept / "file").read_text() == "stays"


def test_out_within_the_depth_bound_but_past_the_entry_bound(job_dir):
    deep_tree(job_dir / "out", jobdir.OUT_LIMIT_DEPTH)
    assert jobdir.over_limit(job_dir) is None
    for i in range(jobdir.OUT_LIMIT_ENTRIES - jobdir.OUT_LIMIT_DEPTH + 1):
        (job_dir / "out" / f"f{i}").touch()
    assert jobdir.over_limit(job_dir) == f"the job made more than {jobdir.OUT_LIMIT_ENTRIES} files in /out"


class FakeContainer:
    def __init__(self):
        self.killed = __import__("threading").Event()

    def kill(self):
        self.killed.set()


def test_a_watch_of_out_that_fails_stops_the_job(job_dir, monkeypatch):
    def broken(job_dir):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(jobdir, "over_limit", broken)
    container = FakeContainer()
    watch = docker_runtime.OutWatch(job_dir, container, interval=0.01).start()
    assert container.killed.wait(30), "the job went on unwatched"
    watch.stop()
    assert watch.verdict() == ("dlbench could not check /out (RecursionError: maximum recursion "
                               "depth exceeded); the job was stopped")


# -- owners: a lock file held by the live process ------------------------------------------

def test_an_owner_is_alive_while_its_lock_is_held(tmp_path):
    owner = owners.Owner(tmp_path)
    assert owners.TOKEN.fullmatch(owner.token)
    assert owners.Lapsed.claim(owner.token, tmp_path) is None       # held (another open file)
    assert owners.sweep_lock_files(root=tmp_path) == 0
    owner.release()
    assert not owner.path.exists()
    assert owners.Lapsed.claim(owner.token, tmp_path) is None       # gone: not this machine's


def dead_owner(root: Path) -> str:
    """The token of a process that made its lock file and died without releasing it."""
    code = ("import os, sys; from orchestrator import owners; "
            "print(owners.Owner(__import__('pathlib').Path(sys.argv[1])).token, flush=True); os._exit(0)")
    return subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_lock_of_a_dead_owner_is_claimed_once(tmp_path):
    token = dead_owner(tmp_path)
    assert (tmp_path / f"{token}.lock").is_file()
    lapsed = owners.Lapsed.claim(token, tmp_path)
    assert lapsed is not None
    assert owners.Lapsed.claim(token, tmp_path) is None             # a second sweeper waits its turn
    lapsed.close()
    assert not (tmp_path / f"{token}.lock").exists()
    assert owners.Lapsed.claim("host:1234", tmp_path) is None       # the old label: never touched
    kept = dead_owner(tmp_path)
    assert owners.sweep_lock_files(keep={kept}, root=tmp_path) == 0
    assert owners.sweep_lock_files(root=tmp_path) == 1


# -- the hostile job image --------------------------------------------------------------------

@pytest.fixture(scope="module")
def arena(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hostile")
    secret = path / "secret"
    # looks like a result, so that a host reading it through a link would quote it in the row
    secret.write_text('{"schema_version": 1, "status": "SECRET-%s"}' % secrets.token_hex(8))
    secret.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def hostile_image(arena):
    import docker

    client = docker.from_env()
    base = build.Builder(client, say=lambda *a: None).base()
    (arena / "image").mkdir()
    (arena / "image" / "hostile.py").write_bytes((HOSTILE / "hostile.py").read_bytes())
    (arena / "image" / "Dockerfile").write_text(
        f"FROM {base.id}\nENV HOSTILE_SECRET={arena / 'secret'}\nCOPY hostile.py /hostile.py\n"
        'ENTRYPOINT ["python3", "/hostile.py"]\n')
    tag = f"dlbench-test/hostile:{os.getpid()}"
    image, _ = client.images.build(path=str(arena / "image"), tag=tag, rm=True,
                                   labels={TEST_LABEL: "hostile"})
    yield tag, image
    for old in client.images.list(filters={"label": f"{TEST_LABEL}=hostile"}):
        client.images.remove(old.id, force=True)


def run_hostile(monkeypatch, image, results, data_root, seed, repeats=1, during=None):
    """Run the hostile image as the jobs of a small plan, in a thread (a hang fails the test)."""
    tag, found = image
    monkeypatch.setattr(docker_runtime.DockerRuntime, "targets",
                        lambda self, images: ((i, docker_runtime.Target(tag, found.id, None))
                                              for i in images))
    plan = campaign.read(None, RunOptions(
        frameworks=["caffe"], datasets=["mnist"], profiles=["quick"], threads=[1],
        seed=seed, repeats=repeats)).plan
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        runtime = runtimes.make("docker", display=NullDisplay())
        records = pool.submit(run.run_plan, plan, results, runtime, data_root)
        if during is not None:
            during()
        return records.result(timeout=600)


def secret_state(arena: Path):
    path = arena / "secret"
    info = path.lstat()
    return path.read_bytes(), info.st_mtime_ns, info.st_mode, info.st_uid


def everything_stored(results: Path) -> str:
    frame = store.load(results)
    return frame.astype(str).to_csv() + "".join(
        p.read_bytes().decode("latin-1") for p in results.rglob("*") if p.is_file())


@pytest.mark.docker
def test_links_fifos_devices_and_big_files_in_out_reach_nothing_on_the_host(
        arena, hostile_image, data_root, monkeypatch):
    results = arena / "results"
    before = secret_state(arena)
    records = run_hostile(monkeypatch, hostile_image, results, data_root, seed=1, repeats=9)

    assert secret_state(arena) == before
    marker = json.loads(before[0])["status"]
    assert marker not in everything_stored(results)
    assert not [p for p in results.rglob("*") if p.is_symlink()]

    by_seed = {r.seed: r for r in records}
    link = "result.json is not a regular file (a symbolic link)"
    assert {seed: (r.status, r.error) for seed, r in by_seed.items()} == {
        1: ("no_result", link), 2: ("no_result", link), 3: ("no_result", link),
        4: ("no_result", "result.json is not a regular file (a FIFO)"),
        5: ("no_result", "result.json is not a regular file (a directory)"),
        6: ("no_result", link),
        7: ("no_result", f"result.json is {(4 << 20) + 1} bytes (limit {4 << 20})"),
        8: ("no_result", link),
        9: ("failed", "hostile control"),         # a result file is read as before
    }
    for record in records:
        assert record.exit_code == 0
        job = results / store.JOBS / record.run_id
        kept = {p.name for p in job.iterdir()}
        assert kept == ({"job.json", "log.txt", "result.json"} if record.seed == 9 else {"job.json", "log.txt"})
        log = (job / "log.txt").read_text()
        assert "planted log.txt" in log and "planted fifo" in log
        assert ("planted result.json\n" in log) == (record.seed != 9)
        assert "could not write /job.json: Read-only file system" in log
        assert json.loads((job / "job.json").read_text())["seed"] == record.seed
    # the rows on disk say the same
    frame = store.load(results)
    assert sorted(zip(frame.seed, frame.status)) == sorted((r.seed, r.status) for r in records)


@pytest.mark.docker
def test_a_job_filling_out_is_stopped(arena, hostile_image, data_root, monkeypatch, tmp_path):
    results = tmp_path / "results"
    [record] = run_hostile(monkeypatch, hostile_image, results, data_root, seed=10)
    assert record.status == "failed" and record.exit_code == 137
    assert record.error == "the job wrote more than 64 MiB into /out (stopped)"
    assert {p.name for p in (results / store.JOBS / record.run_id).iterdir()} == {"job.json", "log.txt"}


@pytest.mark.docker
def test_a_job_nesting_directories_deep_in_out_is_a_failed_row_and_the_next_job_runs(
        arena, hostile_image, data_root, monkeypatch, tmp_path):
    results = tmp_path / "results"
    deep, after = run_hostile(monkeypatch, hostile_image, results, data_root, seed=12, repeats=2)
    assert deep.seed == 12 and after.seed == 13
    assert deep.status == "failed" and deep.error.startswith(
        f"the job nested directories more than {jobdir.OUT_LIMIT_DEPTH} deep in /out")
    assert "planted a tree 1100 deep" in (results / store.JOBS / deep.run_id / "log.txt").read_text()
    assert (after.status, after.error) == ("ok", None)
    for record in (deep, after):
        assert not (results / store.JOBS / record.run_id / jobdir.OUT).exists()
    assert sorted(zip(store.load(results).seed, store.load(results).status)) == [(12, "failed"), (13, "ok")]


@pytest.mark.docker
def test_a_job_container_runs_with_the_cis_defaults(arena, hostile_image, data_root, monkeypatch, tmp_path):
    import docker

    client = docker.from_env()
    results = tmp_path / "results"
    seen = {}

    def inspect_then_kill():
        deadline = time.monotonic() + 300
        while not seen and time.monotonic() < deadline:
            for container in client.containers.list(
                    filters={"label": f"org.dlbench.results={results.resolve()}"}):
                seen.update(container.attrs)
                container.kill()
            time.sleep(0.2)

    [record] = run_hostile(monkeypatch, hostile_image, results, data_root, seed=11,
                           during=inspect_then_kill)
    assert seen, "the job container was never seen running"
    host = seen["HostConfig"]
    assert host["Init"] is True
    assert host["PidsLimit"] == docker_runtime.PIDS_LIMIT
    total = client.info()["MemTotal"]
    assert host["Memory"] == int(total * docker_runtime.DEFAULT_MEMORY_SHARE) == record.memory_limit_bytes
    assert host["Tmpfs"]["/tmp"].split(",") == ["rw", "noexec", "nosuid", "nodev", "size=2g"]
    assert "/compile" not in host["Tmpfs"]                  # only for frameworks that compile code
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in host["Ulimits"]} == {
        "nofile": (docker_runtime.NOFILE, docker_runtime.NOFILE), "core": (0, 0)}
    assert host["ReadonlyRootfs"] is True and host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    binds = {b.split(":")[1]: (b.split(":")[0], b.split(":")[2]) for b in host["Binds"]}
    job = results.resolve() / store.JOBS / record.run_id
    assert binds == {"/data/mnist": (str((data_root / "mnist").resolve()), "ro"),
                     "/job.json": (str(job / "job.json"), "ro"),
                     "/out": (str(job / "out"), "rw")}
    assert seen["Config"]["User"] not in ("", "0", "root", "0:0")
    labels = seen["Config"]["Labels"]
    assert labels["org.dlbench.owner"] == owners.current().token
    assert labels["org.dlbench.run-id"] == record.run_id
    assert record.status == "failed" and record.exit_code == 137


@pytest.mark.docker
def test_the_sweep_removes_only_containers_of_dead_owners_here(hostile_image, tmp_path):
    import docker

    client = docker.from_env()
    tag, _ = hostile_image
    results = tmp_path / "results"
    dead = dead_owner(owners.owners_dir())
    alive = owners.current().token
    elsewhere = secrets.token_hex(16)              # a lock file on another machine: not here
    made = {}
    for name, token in (("dead", dead), ("alive", alive), ("elsewhere", elsewhere), ("old", "host:1")):
        run_id = secrets.token_hex(8)
        job = store.job_dir(results, run_id)
        (job / "job.json").write_text("{}")
        made[name] = (client.containers.create(
            tag, entrypoint=["sleep", "300"], network_mode="none",
            labels={"org.dlbench.role": "job", "org.dlbench.owner": token, "org.dlbench.run-id": run_id,
                    "org.dlbench.results": str(results), TEST_LABEL: "sweep"}), job)
    try:
        removed = docker_runtime.remove_stale(client)
        assert made["dead"][0].short_id in removed
        with pytest.raises(docker.errors.NotFound):
            made["dead"][0].reload()
        assert not made["dead"][1].exists()
        assert not (owners.owners_dir() / f"{dead}.lock").exists()
        for name in ("alive", "elsewhere", "old"):
            made[name][0].reload()                  # still there
            assert made[name][1].is_dir()
    finally:
        for container in client.containers.list(all=True, filters={"label": f"{TEST_LABEL}=sweep"}):
            container.remove(force=True)
