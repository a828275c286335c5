"""The download cache: Debian packages and Python packages fetched once per machine,
whichever image needs them and however often it is built again.

The Docker SDK builds with the classic builder, which has no cache mounts, so every
image's ``apt-get install`` and ``pip install`` would fetch their files anew.  While
dlbench builds, it serves a caching HTTP proxy on the host's loopback (``Proxy``) and the
builds run in the host's network with ``http_proxy`` pointing at it: a build argument
Docker keeps out of the layer cache's key and out of the image's history, so an image is
the same with the cache or without.  debootstrap fetches through it too.

What the proxy keeps, under ``~/.cache/dlbench/downloads/<host>/<path>``, is only what never
changes under its name: Debian's package files (``…/pool/…/*.deb``) and the Python package
index's files (``files.pythonhosted.org/packages/…``).  Everything else (apt's package
lists, the index's pages) is fetched every time.  pip reaches the index through the proxy
by plain http (the ``PIP_INDEX_URL`` and ``PIP_TRUSTED_HOST`` build arguments, given with the
cache to the images whose Dockerfile declares them); the proxy fetches the index over TLS,
verified with the CA bundle the builds trust, and pip still checks every file it installs
against the sha256 the index gives.  apt checks its packages against the signed lists as
ever.  A file is kept only once it arrived whole, under a temporary name until then.
"""

from __future__ import annotations

import http.client
import http.server
import os
import shutil
import ssl
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

CHUNK = 1 << 20
TIMEOUT_S = 120
TLS_HOSTS = ("pypi.org", "files.pythonhosted.org")    # reached by http through the proxy, https beyond
INDEX = "http://pypi.org/simple/"
PIP_ARGUMENTS = {"PIP_INDEX_URL": INDEX, "PIP_TRUSTED_HOST": " ".join(TLS_HOSTS)}


def kept(host: str, path: str) -> bool:
    """Whether a file is one that never changes under its name, and so is kept."""
    if ".." in path.split("/"):
        return False
    if host == "files.pythonhosted.org":
        return path.startswith("/packages/")
    return "/pool/" in path and path.endswith(".deb")


class Counts:
    """What the proxy served: files from the cache, files fetched and kept, passed through."""

    def __init__(self):
        self._lock = threading.Lock()
        self.hits = self.kept = self.passed = 0
        self.hit_bytes = self.kept_bytes = 0

    def hit(self, size: int) -> None:
        with self._lock:
            self.hits += 1
            self.hit_bytes += size

    def keep(self, size: int) -> None:
        with self._lock:
            self.kept += 1
            self.kept_bytes += size

    def passed_through(self) -> None:
        with self._lock:
            self.passed += 1

    def summary(self) -> str:
        return (f"download cache: {self.hits} files from it ({self.hit_bytes / 1e6:.0f} MB), "
                f"{self.kept} fetched and kept ({self.kept_bytes / 1e6:.0f} MB)")


class Proxy:
    """The caching proxy, on 127.0.0.1 and a free port, serving from its own threads until
    ``close``.  ``folder``: where files are kept; ``ca_bundle``: the CA bundle that verifies
    the index's TLS (None: the system's)."""

    def __init__(self, folder: Path, ca_bundle: Path | None = None):
        self.folder = Path(folder)
        self.counts = Counts()
        self._tls = ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self._tls))
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="dlbench-downloads",
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def environment(self) -> dict:
        """The proxy variables a build or debootstrap is given."""
        return {"http_proxy": self.url, "HTTP_PROXY": self.url}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def path(self, host: str, path: str) -> Path:
        return self.folder / host / path.lstrip("/")

    def upstream(self, url: str, accept: str | None):
        """The upstream response for a proxied URL (https for the index's hosts)."""
        parts = urlsplit(url)
        if parts.hostname in TLS_HOSTS:
            parts = parts._replace(scheme="https")
        request = urllib.request.Request(parts.geturl(), headers={"User-Agent": "dlbench-downloads"})
        if accept:
            request.add_header("Accept", accept)
        return self._opener.open(request, timeout=TIMEOUT_S)


def _handler(proxy: Proxy):
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "dlbench-downloads"

        def log_message(self, format, *args):   # noqa: A002 - the base class's name
            pass                                  # the builds' own logs say what they fetch

        def do_GET(self):                         # noqa: N802 - the base class's name
            parts = urlsplit(self.path)
            if parts.scheme != "http" or not parts.hostname:
                self.send_error(400, "a proxy: absolute http URLs only")
                return
            host = parts.hostname
            keep = proxy.path(host, parts.path) if kept(host, parts.path) else None
            if keep is not None and keep.is_file():
                self._send_file(keep)
                return
            try:
                # The index's pages in HTML (pip 20's kind), their file links made http so
                # that the files come through here too.
                page = host == "pypi.org"
                response = proxy.upstream(self.path, "text/html" if page else None)
            except urllib.error.HTTPError as exc:
                self.send_error(exc.code, str(exc.reason))
                return
            except (urllib.error.URLError, OSError) as exc:
                self.send_error(502, f"{host}: {getattr(exc, 'reason', exc)}")
                return
            with response:
                if page:
                    body = response.read().replace(b"https://files.pythonhosted.org/",
                                                   b"http://files.pythonhosted.org/")
                    self._send_bytes(body, response.headers.get("Content-Type", "text/html"))
                    proxy.counts.passed_through()
                else:
                    self._relay(response, keep)
                    if keep is None:
                        proxy.counts.passed_through()

        def _send_bytes(self, body: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _send_file(self, path: Path) -> None:
            size = path.stat().st_size
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            with path.open("rb") as source:
                shutil.copyfileobj(source, self.wfile, CHUNK)
            proxy.counts.hit(size)

        def _relay(self, response, keep: Path | None) -> None:
            """The upstream body to the client as it comes, and into ``keep`` when given:
            kept under its name only once whole (as long as upstream said)."""
            self.send_response(200)
            for name in ("Content-Type", "Content-Length", "Last-Modified"):
                if response.headers.get(name):
                    self.send_header(name, response.headers[name])
            self.end_headers()
            expected = response.headers.get("Content-Length")
            tmp = None
            if keep is not None:
                keep.parent.mkdir(parents=True, exist_ok=True)
                tmp = tempfile.NamedTemporaryFile(dir=keep.parent, prefix=".part-", delete=False)
            size = 0
            try:
                while chunk := response.read(CHUNK):
                    size += len(chunk)
                    if tmp is not None:
                        tmp.write(chunk)
                    self.wfile.write(chunk)
                if tmp is not None:
                    tmp.close()
                    if expected is None or int(expected) == size:
                        os.replace(tmp.name, keep)
                        proxy.counts.keep(size)
            except (OSError, http.client.HTTPException):
                self.close_connection = True      # cut short: the client sees it, nothing is kept
            finally:
                if tmp is not None:
                    tmp.close()
                    Path(tmp.name).unlink(missing_ok=True)

    return Handler
