"""dlbench's web platform program: one trained model, migrated to ONNX, run where Guo et al.
ran theirs in a web browser, inside a real headless Chromium, by a WebAssembly inference
engine (tract's ONNX runtime compiled to wasm32, engine.wasm; lib.rs says its interface).
Stand-alone: it speaks JSON, imports nothing of dlbench, and runs in the web image.

    python3 web.py IN OUT

IN holds ``request.json`` and the arrays it names, as for the deploy program (deploy.py):
``model`` (the ONNX model), ``images`` (the test images, the data set's bytes, scaled to
float32 pixels in [0, 1] as the runner scales them), ``labels``, ``predictions`` (the
framework's classes), ``logits`` (the framework's outputs for the first images),
optional ``adversarial`` and ``adversarial_labels``, ``platforms``, ``batch``, ``timed`` and
``warmup``; ``calibration`` and ``threads`` are not used (a page's WebAssembly has one
thread), and ``timeout_s``, optional, bounds the browser (``LIMIT_S``).  OUT gets
``result.json``: no row where "web" is not asked for, else its one row.

The page (index.html, web.js), the engine, the model and the images are served by a server
on 127.0.0.1 in a thread of this program, under a random token of the run.  Chromium's
headless shell opens the page; the page loads the model (the row's conversion_s: parse,
optimize, make runnable), times single images after a warm-up (its own performance.now()),
classifies every image, measures throughput at the job's batch where the engine takes the
model at that batch (else at 1: ``throughput_batch``), and posts what it found, with the
token and its user agent.  The row is scored here from what it posted.  The engine runs as
a page's WebAssembly runs by default: one thread, compiled by V8 with its baseline compiler
first and its optimizing one in the background for the functions that run most (the
warm-up runs come before the timed ones; the spread of the times shows what is left).  A model the engine
cannot load is a failed row with tract's reason (``load: ...``): a finding, not an error of
the program; so is a page that posts nothing within the limit (the browser is killed), a
post with a wrong token or not from a Chrome, and a browser that ends before it posts.
"""

import http.server
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import numpy as np

PLATFORM = "web"
SCHEMA = 1                  # result.json's version
HERE = Path(__file__).resolve().parent / "web"      # the page, the engine and its Cargo.lock
# the browser itself: Debian's /usr/bin/chromium-headless-shell is a shell script that
# starts it as its child, and the browser's processes are counted from the browser down
BROWSER = "/usr/lib/chromium/chromium-headless-shell"
LIMIT_S = 600               # the browser's wall-clock limit: the host's on the container is longer
SAMPLE_S = 0.1              # how often the browser's memory is read
MAX_POST_BYTES = 64 << 20
CHROME = re.compile(r"(?<![A-Za-z])(?:Headless)?Chrome/\d+")     # Chrome/NNN or HeadlessChrome/NNN
# The row's fields, in the order of dlbench's PlatformRow, which reads them (and forbids others)
FIELDS = ("platform", "status", "reason", "conversion_s", "model_bytes", "converter_layout",
          "conversion_shared", "accuracy", "mismatches", "max_logit_error", "latency_ms",
          "latency_iqr_ms", "throughput", "throughput_batch", "peak_memory_bytes", "runtime",
          "adversarial_images", "adversarial_accuracy")
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".json": "application/json", ".wasm": "application/wasm"}


class Failed(Exception):
    """Why the platform has no figures: the row's reason."""


def pixels(array):
    """Bytes as the runner scales them (bytes / 255 in float32); pixels as they are."""
    array = np.asarray(array)
    if array.dtype == np.uint8:
        return array.astype(np.float32) / np.float32(255.0)
    return array.astype(np.float32)


def one_line(text):
    return " ".join(str(text).split())[:400] or "no reason given"


def row(**found):
    """The platform's row: every field, those not found None (converter_layout and
    conversion_shared always: the engine reads the ONNX model as it is)."""
    values = dict.fromkeys(FIELDS)
    values.update(platform=PLATFORM, **found)
    return values


class Request:
    """The request and its arrays, read from IN."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.fields = json.loads((self.folder / "request.json").read_text())

    def __getitem__(self, key):
        return self.fields[key]

    def get(self, key, default=None):
        return self.fields.get(key, default)

    def array(self, key):
        return np.load(self.folder / self.fields[key], allow_pickle=False)

    def path(self, key):
        return self.folder / self.fields[key]


def tract_version():
    """tract-onnx's version, as Cargo.lock pinned it for the engine."""
    text = (HERE / "Cargo.lock").read_text()
    found = re.search(r'name = "tract-onnx"\nversion = "([^"]+)"', text)
    return found.group(1) if found else "unknown"


# -- the server ----------------------------------------------------------------------------
class Server:
    """The page's files under ``/<token>/`` on 127.0.0.1 and a free port, and the first post
    it receives (whatever its path): ``posted`` once ``done`` is set."""

    def __init__(self, token, files):
        self.token, self.files = token, files
        self.posted, self.done = None, threading.Event()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{self.token}/index.html"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(server):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):      # the browser's requests are not the run's output
            pass

        def _headers(self, status, kind=None, length=0):
            self.send_response(status)
            # cross-origin isolated: performance.now() at its finest resolution (Chromium
            # coarsens it to 100 us elsewhere, 5 us in an isolated page)
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
            self.send_header("Cache-Control", "no-store")
            if kind:
                self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(length))
            self.end_headers()

        def do_GET(self):
            prefix = f"/{server.token}/"
            path = self.path.split("?", 1)[0]
            body = server.files.get(path[len(prefix):]) if path.startswith(prefix) else None
            if body is None:
                self._headers(404)
                return
            self._headers(200, TYPES.get(os.path.splitext(path)[1], "application/octet-stream"), len(body))
            self.wfile.write(body)

        def do_POST(self):
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                length = -1
            body, problem = None, None
            if not 0 <= length <= MAX_POST_BYTES:
                problem = f"refused the page's result: {length} bytes (at most {MAX_POST_BYTES})"
            else:
                try:
                    body = json.loads(self.rfile.read(length))
                except ValueError as exc:
                    problem = f"refused the page's result: not JSON ({one_line(exc)})"
            self._headers(204)
            if not server.done.is_set():
                server.posted = {"path": self.path, "agent": self.headers.get("User-Agent", ""),
                                 "body": body, "problem": problem}
                server.done.set()
    return Handler


# -- the browser ---------------------------------------------------------------------------
def browser_command(url, profile):
    """Chromium's headless shell at ``url``.  --no-sandbox: Chromium's own sandbox needs user
    namespaces or a setuid helper, which the container (no capabilities, no new privileges,
    nobody's user) does not give; the container itself is the sandbox (no network but
    loopback, a read-only root).  Its profile and shared memory under /tmp (the container's
    /dev/shm is small); nothing that reaches out (updates, sync, crash reports)."""
    return [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
            "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
            "--disable-extensions", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-breakpad", "--disable-crash-reporter", "--mute-audio",
            "--no-pings", url]


def descendants(root):
    """``root`` and every process below it, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:         # ended meanwhile
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def memory(root):
    """The browser's memory now: the sum, over its processes, of each one's peak resident set
    (VmHWM).  The largest of these sums over a run is the row's peak memory: processes' peaks
    need not coincide and shared pages count in each process, so it bounds the browser's
    simultaneous peak from above; a process that ended between two samples is counted in
    the samples it lived through."""
    total = 0
    for pid in descendants(root):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
        total += int(found.group(1)) * 1024 if found else 0
    return total


def stop(process):
    """The browser and all its processes ended (its own session's process group)."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def last_line(path):
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return one_line(lines[-1]) if lines else "it wrote nothing"


def browse(server, limit, work):
    """The page opened in the browser until it posts, the browser ends or ``limit`` seconds
    pass: the post, and the browser's peak memory (``memory``)."""
    log = work / "browser.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(browser_command(server.url, work / "profile"), stdin=subprocess.DEVNULL,
                                   stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "HOME": str(work)})
    peak, deadline = 0, time.monotonic() + limit
    try:
        while not server.done.is_set():
            peak = max(peak, memory(process.pid))
            if server.done.wait(SAMPLE_S):
                break
            if process.poll() is not None:
                raise Failed(f"the browser ended with exit status {process.returncode} before the "
                             f"page posted a result: {last_line(log)}")
            if time.monotonic() > deadline:
                raise Failed(f"timed out after {limit:g} s")
        peak = max(peak, memory(process.pid))
    finally:
        stop(process)
        if not server.done.is_set():
            sys.stderr.write(log.read_text(errors="replace")[-4000:])
    return server.posted, peak


# -- the row -------------------------------------------------------------------------------
def judged(posted, token):
    """The page's result, if it came from the page: the run's token, and a Chrome's user
    agent, the same in the request's header and in what the page read of itself."""
    body = posted["body"]
    if posted.get("problem"):       # the server could not read it
        raise Failed(posted["problem"])
    if not isinstance(body, dict):
        raise Failed("refused the page's result: not a JSON object")
    path, agent = posted["path"], body.get("userAgent")
    if not (isinstance(body.get("token"), str) and path == f"/{token}/result"
            and secrets.compare_digest(body["token"].encode(), token.encode())):
        raise Failed("refused the page's result: it came with a wrong token")
    if not (isinstance(agent, str) and CHROME.search(agent) and agent == posted["agent"]):
        raise Failed(f"refused the page's result: its user agent is not a Chrome's ({one_line(agent)})")
    return body


def floats(values, shape, what):
    """A posted array of numbers (JSON's null, a NaN or infinity the page could not write,
    as NaN), of ``shape``."""
    try:
        array = np.array(values, dtype=object)
        array = np.where(array == None, np.nan, array).astype(np.float64)  # noqa: E711
    except (ValueError, TypeError):
        raise Failed(f"the page's result is malformed: {what} are not numbers") from None
    if array.shape != tuple(shape):
        raise Failed(f"the page's result is malformed: {what} have shape {array.shape}, "
                     f"expected {tuple(shape)}")
    return array


def classes_of(values, count, what):
    array = floats(values, (count,), what)
    if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
        raise Failed(f"the page's result is malformed: {what} are not whole numbers")
    return array.astype(np.int64)


def scored(body, request, peak):
    """The row's figures from what the page posted."""
    labels, own = request.array("labels"), request.array("predictions")
    own_logits = request.array("logits").astype(np.float64)
    classes = classes_of(body.get("classes"), len(labels), "the classes")
    error = None
    if len(own_logits):
        own_logits = own_logits.reshape(len(own_logits), -1)
        logits = floats(body.get("logits"), own_logits.shape, "the logits")
        scale = np.abs(own_logits).max(axis=1)
        error = float((np.abs(logits - own_logits).max(axis=1) / np.where(scale > 0, scale, 1.0)).max())
    times = floats(body.get("latency_ms"), (len(body.get("latency_ms") or []),), "the latencies").tolist()
    if not times:
        raise Failed("the page's result is malformed: no latencies")
    quartiles = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    seconds, counted = (floats([body.get(k)], (1,), k)[0] for k in ("throughput_s", "throughput_images"))
    found = dict(
        conversion_s=float(floats([body.get("conversion_s")], (1,), "conversion_s")[0]),
        accuracy=float(np.mean(classes == labels)),
        mismatches=int(np.count_nonzero(classes != own)),
        max_logit_error=error,
        latency_ms=float(statistics.median(times)), latency_iqr_ms=float(quartiles[2] - quartiles[0]),
        throughput=float(counted / seconds) if seconds > 0 else None,
        throughput_batch=int(classes_of([body.get("throughput_batch")], 1, "throughput_batch")[0]),
        peak_memory_bytes=int(peak))
    if request.get("adversarial"):
        adversarial_labels = request.array("adversarial_labels")
        found_classes = classes_of(body.get("adversarial_classes"), len(adversarial_labels),
                                   "the adversarial classes")
        found.update(adversarial_images=int(len(adversarial_labels)),
                     adversarial_accuracy=float(np.mean(found_classes == adversarial_labels)))
    return found


def web(request, limit):
    """The platform's row: the page run in the browser, its post scored."""
    images = pixels(request.array("images"))
    adversarial = pixels(request.array("adversarial")) if request.get("adversarial") else None
    if adversarial is not None and adversarial.shape[1:] != images.shape[1:]:
        raise Failed(f"the adversarial images' shape {adversarial.shape[1:]} is not the test "
                     f"images' {images.shape[1:]}")
    job = {"shape": list(images.shape[1:]), "batch": int(request.get("batch", 100)),
           "warmup": int(request.get("warmup", 20)), "timed": int(request.get("timed", 200)),
           "logits": int(len(request.array("logits"))), "adversarial": adversarial is not None}
    files = {name: (HERE / name).read_bytes() for name in ("index.html", "web.js", "engine.wasm")}
    files.update({"job.json": json.dumps(job).encode(), "model.onnx": request.path("model").read_bytes(),
                  "images.f32": images.astype("<f4").tobytes()})
    if adversarial is not None:
        files["adversarial.f32"] = adversarial.astype("<f4").tobytes()
    token = secrets.token_urlsafe(24)
    server = Server(token, files)
    try:
        with tempfile.TemporaryDirectory(prefix="dlbench-web-") as work:
            posted, peak = browse(server, limit, Path(work))
    finally:
        server.close()
    body = judged(posted, token)
    runtime = f"{one_line(body['userAgent'])}; tract-onnx {tract_version()} wasm32"
    if body.get("error") is not None:       # the page's own failure: which stage, and why
        return row(status="failed", reason=one_line(body["error"]), model_bytes=len(files["model.onnx"]),
                   runtime=runtime)
    return row(status="ok", reason=None, model_bytes=len(files["model.onnx"]), runtime=runtime,
               **scored(body, request, peak))


def main(argv):
    if len(argv) != 3:
        print("usage: web.py IN OUT", file=sys.stderr)
        return 2
    folder, out = Path(argv[1]), Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    request = Request(folder)
    rows = []
    if PLATFORM in request["platforms"]:
        try:
            rows.append(web(request, float(request.get("timeout_s", LIMIT_S))))
        except Exception as exc:    # Failed: the reason; anything else, this program's error, kept too
            if not isinstance(exc, Failed):
                traceback.print_exc()
            reason = str(exc) if isinstance(exc, Failed) else one_line(f"{type(exc).__name__}: {exc}")
            rows.append(row(status="failed", reason=reason,
                            model_bytes=request.path("model").stat().st_size))
    (out / "result.json").write_text(json.dumps({"schema": SCHEMA, "platforms": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
