"""The download cache's proxy, against Debian's mirror and the Python package index:
a package file is fetched once and then served from the cache, pip installs through the
index's pages with their hashes checked, and a file cut short is never kept."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from orchestrator.build import downloads

PACKAGE = "http://deb.debian.org/debian/pool/main/h/hello/hello_2.10-2_amd64.deb"


@pytest.fixture
def proxy(tmp_path):
    proxy = downloads.Proxy(tmp_path / "downloads")
    yield proxy
    proxy.close()


def counted(proxy, **expected):
    """The proxy's counts once they are as expected: a handler counts a file after its last
    byte went out, so the client may have it a moment before (ten seconds at most)."""
    deadline = time.monotonic() + 10
    while any(getattr(proxy.counts, k) != v for k, v in expected.items()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return {k: getattr(proxy.counts, k) for k in expected}


def through(proxy):
    return urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy.url}))


def test_a_debian_package_is_fetched_once_then_served_from_the_cache(proxy):
    first = through(proxy).open(PACKAGE, timeout=60).read()
    assert counted(proxy, kept=1, hits=0) == {"kept": 1, "hits": 0}
    kept = proxy.folder / "deb.debian.org" / "debian/pool/main/h/hello/hello_2.10-2_amd64.deb"
    assert kept.read_bytes() == first and first[:8] == b"!<arch>\n"      # a Debian archive
    assert through(proxy).open(PACKAGE, timeout=60).read() == first
    assert counted(proxy, kept=1, hits=1) == {"kept": 1, "hits": 1}
    assert "1 files from it" in proxy.counts.summary()


def test_apt_lists_pass_through_and_are_not_kept(proxy):
    release = through(proxy).open("http://deb.debian.org/debian/dists/bullseye/Release", timeout=60).read()
    assert b"Codename: bullseye" in release
    assert counted(proxy, passed=1) == {"passed": 1} and not any(p.is_file() for p in proxy.folder.rglob("*"))


def test_pip_downloads_through_the_index_pages_and_the_files_are_kept(proxy, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(proxy.environment(), PIP_INDEX_URL=downloads.INDEX,
               PIP_TRUSTED_HOST=downloads.PIP_ARGUMENTS["PIP_TRUSTED_HOST"], PIP_CONFIG_FILE=os.devnull)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                           "--dest", tmp_path / "got", "six==1.16.0"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    wheel, = (tmp_path / "got").iterdir()
    assert counted(proxy, kept=1) == {"kept": 1}
    kept, = (proxy.folder / "files.pythonhosted.org").rglob("*.whl")
    assert kept.name == wheel.name == "six-1.16.0-py2.py3-none-any.whl"
    assert kept.read_bytes() == wheel.read_bytes()      # pip checked it against the index's sha256


class _CutShort(http.server.BaseHTTPRequestHandler):
    """An upstream that promises more bytes than it sends (a dropped connection)."""

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b"x" * 100)

    def log_message(self, *args):
        pass


def test_a_file_cut_short_is_not_kept(proxy):
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CutShort)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{upstream.server_address[1]}/debian/pool/main/x/x_1_amd64.deb"
        with pytest.raises(Exception):
            through(proxy).open(url, timeout=60).read()
    finally:
        upstream.shutdown()
        upstream.server_close()
    assert proxy.counts.kept == 0 and not any(p.is_file() for p in proxy.folder.rglob("*"))


def test_only_files_that_never_change_under_their_name_are_kept():
    assert downloads.kept("deb.debian.org", "/debian/pool/main/h/hello/hello_2.10-2_amd64.deb")
    assert downloads.kept("files.pythonhosted.org", "/packages/aa/bb/six-1.16.0-py2.py3-none-any.whl")
    assert not downloads.kept("deb.debian.org", "/debian/dists/bullseye/main/binary-amd64/Packages.xz")
    assert not downloads.kept("pypi.org", "/simple/six/")
    assert not downloads.kept("deb.debian.org", "/debian/pool/../../../etc/passwd.deb")
