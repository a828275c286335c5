"""The source registry: pinned archives verified by their trees, from a local mirror or
GitHub, and needed only to build.

Nothing here uses the network: GitHub is played by a local HTTP server.  The command-line
errors ask Docker which images must be built (a present image needs no archive), so they
need a daemon, but they build nothing: the archives are checked before any build starts.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.server
import io
import shutil
import socket
import tarfile
import threading
from pathlib import Path

import pytest

from conftest import NO_ROUTE, REPO, dlbench
from orchestrator import build, catalog
from orchestrator.build import sources

TORCH7 = sources.lookup("torch/torch7")
MOSES = sources.lookup("Yonaba/Moses")      # the first archive fetched, in sorted order


def snapshot(results: Path) -> dict:
    return {str(p.relative_to(results)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(results.rglob("*")) if p.is_file()}


@pytest.fixture
def mirror(sources_root, tmp_path):
    """A writable copy of the shared mirror."""
    copy = tmp_path / "sources"
    shutil.copytree(sources_root, copy)
    for path in copy.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy


@pytest.fixture
def stored(tmp_path):
    """A results directory holding a row already."""
    results = tmp_path / "results"
    shutil.copytree(REPO / "tests" / "fixtures" / "results-v2", results)
    return results


def must_build(command: str, tmp_path: Path, *run_args) -> list:
    """``command`` for the torch image, such that the image must be built whatever this host
    has: build-images --rebuild; a run with another CA bundle (so its base image, and every
    image on it, is out of date)."""
    if command == "build-images":
        return ["build-images", "--frameworks", "torch", "--rebuild"]
    bundle = tmp_path / "another-ca.crt"
    bundle.write_bytes(build.find_ca_bundle().read_bytes() + b"\n# another bundle\n")
    return ["run", "--frameworks", "torch", "--datasets", "mnist", "--ca-bundle", bundle, *run_args]


def one_error_line(proc, *fragments):
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_every_registered_archive_of_the_shared_mirror_verifies(sources_root):
    for source in sources.REGISTRY:
        sources.verify(source, sources_root / source.group / source.filename)


def test_the_torch_image_pins_registered_sources_and_the_build_order():
    pinned = catalog.models("torch")["sources"]
    assert [sources.lookup(repo).repo for repo in pinned] == pinned
    script = (REPO / "images" / "torch" / "build-torch7.sh").read_text()
    order = [line.split()[0] for line in script.split("<<ROCKS\n")[1].split("ROCKS\n")[0].splitlines()]
    assert order == [sources.lookup(repo).name for repo in pinned[1:-1]]   # luajit-rocks first, GTDLBench last


@pytest.mark.docker
def test_the_gpu_image_also_needs_cutorch_and_cunn(mirror):
    cpu, gpu = catalog.sources("torch"), catalog.sources("torch", "gpu")
    assert gpu == cpu + ["torch/cutorch", "torch/cunn"] and "torch/cunn" not in cpu
    cunn = sources.lookup("torch/cunn")
    (mirror / cunn.group / cunn.filename).unlink()
    proc = dlbench("build-images", "--frameworks", "torch", "--variant", "gpu", "--rebuild",
                   "--sources", mirror)
    one_error_line(proc, f"{mirror / cunn.group / cunn.filename}: missing from the sources mirror")


def test_the_same_tree_in_other_bytes_verifies_and_a_changed_file_does_not(sources_root, tmp_path):
    """GitHub's archive of a commit differs in bytes from `git archive`'s; the tree does not."""
    original = sources_root / TORCH7.group / TORCH7.filename
    repacked, altered = tmp_path / "repacked.tar.gz", tmp_path / "altered.tar.gz"
    with tarfile.open(original) as src, \
            tarfile.open(repacked, "w:gz", compresslevel=1, format=tarfile.GNU_FORMAT) as same, \
            tarfile.open(altered, "w:gz") as changed:
        for member in src:
            data = src.extractfile(member).read() if member.isfile() else None
            member.mtime = 0
            same.addfile(member, io.BytesIO(data) if data is not None else None)
            if member.name.endswith("/init.lua") and data is not None:
                data = data.replace(b"torch", b"torcH", 1)
            changed.addfile(member, io.BytesIO(data) if data is not None else None)
    assert repacked.read_bytes() != original.read_bytes()
    assert sources.verify(TORCH7, repacked) == repacked
    with pytest.raises(sources.SourceError, match=r"altered\.tar\.gz: tree checksum .* damaged or altered"):
        sources.verify(TORCH7, altered)


@pytest.mark.docker
@pytest.mark.parametrize("command", ["build-images", "run"])
def test_a_damaged_archive_is_one_line_naming_it(command, mirror, stored, data_root, tmp_path):
    archive = mirror / TORCH7.group / TORCH7.filename
    raw = gzip.decompress(archive.read_bytes())
    archive.write_bytes(gzip.compress(raw[: len(raw) // 2]))        # a truncated download
    before = snapshot(stored)
    proc = dlbench(*must_build(command, tmp_path, "--results", stored, "--data-dir", data_root),
                   "--sources", mirror)
    one_error_line(proc, str(archive), "damaged archive")
    assert snapshot(stored) == before


@pytest.mark.docker
def test_a_missing_mirror_directory_is_one_line(tmp_path, stored, data_root):
    """A mirror named is checked even where no image must be built."""
    before = snapshot(stored)
    proc = dlbench("run", "--frameworks", "torch", "--datasets", "mnist", "--results", stored,
                   "--data-dir", data_root, env={"DLBENCH_SOURCES_DIR": str(tmp_path / "nowhere")})
    one_error_line(proc, f"DLBENCH_SOURCES_DIR {tmp_path / 'nowhere'}: no such directory")
    proc = dlbench("build-images", "--frameworks", "torch", "--sources", tmp_path / "nowhere")
    one_error_line(proc, f"--sources {tmp_path / 'nowhere'}: no such directory")
    assert snapshot(stored) == before


@pytest.mark.docker
def test_an_archive_of_an_unknown_commit_is_one_line_naming_it(mirror, stored, data_root, tmp_path):
    folder = mirror / TORCH7.group
    stranger = folder / f"torch7-{'0' * 40}.tar.gz"
    (folder / TORCH7.filename).rename(stranger)
    before = snapshot(stored)
    proc = dlbench(*must_build("run", tmp_path, "--results", stored, "--data-dir", data_root),
                   "--sources", mirror)
    one_error_line(proc, f"{folder / TORCH7.filename}: missing", f"{stranger} is an unknown commit",
                   TORCH7.commit)
    assert snapshot(stored) == before


@pytest.mark.docker
def test_a_missing_archive_and_doctor(mirror, tmp_path):
    (mirror / TORCH7.group / TORCH7.filename).unlink()
    proc = dlbench(*must_build("build-images", tmp_path), "--sources", mirror)
    one_error_line(proc, f"{mirror / TORCH7.group / TORCH7.filename}: missing from the sources mirror")
    report = dlbench("doctor", "--sources", mirror, "--verbose").stdout
    assert f"source torch/torch7@{TORCH7.commit[:12]}: not in {mirror / 'torch7'}" in report
    assert "ok   source torch/nn@" in report and f"mirror {mirror}" in report


# -- fetching from GitHub ----------------------------------------------------------------
@contextlib.contextmanager
def github(answer):
    """A local stand-in for GitHub's archive downloads: ``answer(path)`` gives (status, body)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = answer(self.path)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty user cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "dlbench" / "sources"


def test_an_archive_is_fetched_into_the_cache_and_verified(sources_root, cache, monkeypatch):
    archive = (sources_root / MOSES.group / MOSES.filename).read_bytes()
    wanted = f"/{MOSES.repo}/archive/{MOSES.commit}.tar.gz"
    with github(lambda path: (200, archive) if path == wanted else (404, b"")) as url:
        monkeypatch.setattr(sources, "GITHUB", url)
        found = sources.prepare([MOSES.repo], None)
    assert found == {MOSES: cache / MOSES.group / MOSES.filename}
    assert sorted(p.name for p in (cache / MOSES.group).iterdir()) == [MOSES.filename]


@pytest.mark.parametrize("case", ["no network", "404", "checksum"])
def test_a_failed_fetch_is_one_line_naming_the_archive_and_the_way_around(
        case, sources_root, cache, monkeypatch):
    other = (sources_root / TORCH7.group / TORCH7.filename).read_bytes()    # another tree
    answers = {"404": lambda path: (404, b"Not Found"), "checksum": lambda path: (200, other)}
    with contextlib.ExitStack() as stack:
        url = closed_port() if case == "no network" else stack.enter_context(github(answers[case]))
        monkeypatch.setattr(sources, "GITHUB", url)
        with pytest.raises(sources.SourceError) as caught:
            sources.prepare([MOSES.repo], None)
    message = str(caught.value)
    assert "\n" not in message and url not in message
    assert message.startswith(f"cannot fetch the source archive torch7/{MOSES.filename} "
                              f"(Yonaba/Moses@{MOSES.commit[:12]}): ")
    assert {"no network": "no network (127.0.0.1:", "404": "GitHub answered HTTP 404 Not Found",
            "checksum": "the download fails its tree checksum (damaged or altered)"}[case] in message
    assert message.endswith("; give a local mirror of the pinned archives with --sources DIR "
                            "or DLBENCH_SOURCES_DIR")
    assert caught.value.detail.startswith(f"GET {url}/{MOSES.repo}/archive/{MOSES.commit}.tar.gz: ")
    assert list(cache.rglob("*.tar.gz*")) == []        # nothing half-fetched is left


@pytest.mark.docker
def test_a_build_without_a_mirror_or_a_network_says_so_in_one_line(tmp_path):
    """As on a machine without GitHub: the fix, in one line; the URL and the exception
    with --verbose."""
    env = {**NO_ROUTE, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = dlbench(*must_build("build-images", tmp_path), env=env)
    one_error_line(proc, f"cannot fetch the source archive torch7/{MOSES.filename} (Yonaba/Moses@"
                         f"{MOSES.commit[:12]}): no network (the proxy: connection refused); give a "
                         "local mirror of the pinned archives with --sources DIR or DLBENCH_SOURCES_DIR")
    verbose = dlbench(*must_build("build-images", tmp_path), "--verbose", env=env)
    error, detail = verbose.stderr.strip().splitlines()
    assert error == proc.stderr.strip()
    assert detail.startswith(f"dlbench: detail: GET {MOSES.url}: ProxyError: ")
