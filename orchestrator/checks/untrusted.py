"""A job's ONNX model run on the host as what it is: an untrusted program.

An ONNX file is a program: a ``Loop`` of 10^12 iterations is 492 bytes, a
``ConstantOfShape`` of a huge shape 350, and a tensor stored as ONNX external data names
a file that onnxruntime opens, relative to the process's working directory when the
model is loaded from bytes (a row's ``migration_max_logit_error`` was the first byte of
a file beside dlbench).  Every host-side use of a job's model (the migration check,
the transfer matrices of the report; a model built from a job's layer list as well, its
arrays being the job's) goes through ``classify``, which runs it in a child process
(``untrusted_child.py``, started by its path in Python's isolated mode: no ``PYTHON*``
variable read, neither its working directory nor its folder on ``sys.path``; it imports
nothing of dlbench):

- The child refuses, before onnxruntime sees the file, any tensor stored as external
  data, wherever it is: an initializer, a sparse tensor, a ``Constant``'s or any other
  node's attribute, in a ``Loop``/``If``/``Scan`` body or a function at any depth (the
  walk visits every message of the file, so a field added to ONNX later is visited too).
  It then runs in an empty directory of its own, so no name resolves to a file anyway.
- It limits itself before it reads the model (``resource``, unprivileged): address
  space ``MEMORY_BYTES``, CPU time ``CPU_SECONDS`` (SIGXCPU, then SIGKILL), no core
  files, files it writes ``OUTPUT_BYTES``; and an alarm at ``WALL_SECONDS`` plus a
  margin, so that a child whose dlbench was killed with SIGKILL does not outlive it by
  long.  (The limits are set by the child on itself rather than in ``preexec_fn``,
  which is unsafe in a process with threads, as dlbench's lanes are.)
- dlbench kills it (SIGKILL) after ``WALL_SECONDS``, when a stop signal came (the
  lane then raises ``Interrupted``: the job's directory is removed as for a container)
  or when the caller's ``stop`` event is set.  It runs in a session of its own, so a
  terminal's Ctrl-C reaches dlbench only, which then kills it.
- What it hands back is files of NumPy arrays (no pickles), read with their sizes
  bounded, never objects: a child taken over by a model cannot reach into dlbench.

Its failure, whatever it is (killed at a limit, onnxruntime's error, a crash), is a
``Refused`` whose message is the reason the caller stores: an ok row with
``migration_reason``, never a hang or a lost row.

How the limits were chosen (``bench/untrusted.py`` measures them, in the child): the
heaviest real check is the paper profile's CIFAR-10 model, MXNet's ResNet-110, on the 10,000
test images; a graph of its layout with random weights (no trained one is stored) took 191 s and 227 s of wall-clock time in two runs, 48 s of CPU time, on a 2-core VM
under a load average of 10 and 12 (other jobs running), a peak of 265 MiB resident; the
stored MNIST models of the paper profile (MXNet's, Caffe's) take 5 to 9 s, 1.6 to 1.9 s of
CPU and 200 MiB on their 10,000.  Each also passes within 1 GiB of address space (the
ResNet on 1,000 images).  So the wall-clock limit is 4 times the slowest measured, the CPU
limit 37 times its CPU time, the memory limit 4 times an address space that sufficed;
onnxruntime's threads are fixed (``THREADS``) so that neither the CPU time nor the address
space (a thread's stack and its allocator's arenas) grows with the host's cores.  A hostile
model then holds its job's row up by 15 minutes at most.  The child's start (Python, numpy,
onnxruntime, onnx's protobuf classes without onnx's package, whose ``ml_dtypes`` alone took
0.9 to 1.1 s) takes 0.15 to 0.25 s under a load average of 5, and its end, without the
interpreter's teardown, 0.03 s.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from .. import interrupts
from .untrusted_child import CLASSES, REASON_CHARS, Refused, stored_outside  # noqa: F401

CHILD = Path(__file__).with_name("untrusted_child.py")      # run by its path, importing nothing of dlbench
WALL_SECONDS = 900              # the child's wall-clock time, at most (see above)
THREADS = 2                     # onnxruntime's threads in the child
CPU_SECONDS = THREADS * WALL_SECONDS        # its CPU time (all threads), at most
MEMORY_BYTES = 4 << 30          # its address space, at most
OUTPUT_BYTES = 64 << 20         # any file it writes, at most
POLL_SECONDS = 0.05             # how often the wait looks at the clock and the stop signals


last_usage: list[resource.struct_rusage] = []     # the last child's, that ended of itself


Found = tuple[np.ndarray, np.ndarray]       # classes of every image, outputs of the first ones


def classify(model: bytes, image_sets: list[np.ndarray], first: int = 0,
             stop: threading.Event | None = None) -> list[Found | Refused]:
    """For each array of images (the data set's bytes, scaled to pixels in the child as the
    runner scales them, or float32 pixels in [0, 1]), the model's classes and its outputs
    for the ``first`` images, or the ``Refused`` that says why not; all of them the same
    ``Refused`` when the child itself failed (a limit, a crash).  ``stop``: an event that
    ends the check early (its sets then ``Refused``); a stop signal raises ``Interrupted``."""
    folder = Path(tempfile.mkdtemp(prefix="dlbench-model-"))
    try:
        (folder / "model.onnx").write_bytes(model)
        for index, images in enumerate(image_sets):
            np.save(folder / f"images-{index}.npy", np.ascontiguousarray(images), allow_pickle=False)
        (folder / "work").mkdir()
        failure = _run_child(folder, len(image_sets), first, stop)
        if failure is not None:
            return [failure] * len(image_sets)
        return [_result(folder, index, len(images), first) for index, images in enumerate(image_sets)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_child(folder: Path, sets: int, first: int, stop) -> Refused | None:
    """The child, started, waited for and killed at the deadline or a stop; None when it
    ended of itself with exit status 0."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if stop is not None and stop.is_set():
        return Refused("the check was stopped before it ran")
    limits = (WALL_SECONDS, CPU_SECONDS, MEMORY_BYTES, OUTPUT_BYTES, THREADS)    # the child's, as set here now
    child = None
    try:
        with interrupts.signals_deferred(), open(folder / "stderr.txt", "wb") as errors:     # never a child unknown
            child = subprocess.Popen([sys.executable, "-I", str(CHILD), str(folder), str(sets), str(first),
                                      *map(str, limits)],
                                     cwd=folder / "work", env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True)
        deadline = time.monotonic() + WALL_SECONDS
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                child.returncode = os.waitstatus_to_exitcode(status)
                last_usage[:] = [usage]
                break
            if interrupts.received:     # a stop signal: the main thread cleans up, a lane too
                raise interrupts.Interrupted(interrupts.received[0])
            if stop is not None and stop.is_set():
                return Refused("the check was stopped")
            if time.monotonic() > deadline:
                return Refused(f"the ONNX model ran past the host's limit of {WALL_SECONDS} s "
                               "and was stopped")
            time.sleep(POLL_SECONDS)
    finally:
        if child is not None and child.returncode is None:
            _kill(child)
    code = child.returncode
    cpu = usage.ru_utime + usage.ru_stime
    if code == 0:
        return None
    if code < 0 and (-code == signal.SIGXCPU or cpu >= CPU_SECONDS):
        return Refused(f"the ONNX model used more than the host's limit of {CPU_SECONDS} s of CPU time "
                       "and was stopped")
    if code == 3:           # the child's own verdict: the check's reason
        return Refused(_text(folder / "reason.txt") or "the check gave no reason")
    why = (f"signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals()
           else f"exit status {code}")
    last = _text(folder / "stderr.txt", tail=True).strip().splitlines()
    return Refused(f"the check of the ONNX model ended with {why} (its memory limit: "
                   f"{MEMORY_BYTES >> 30} GiB){': ' + last[-1] if last else ''}")


def _kill(child: subprocess.Popen) -> None:
    """SIGKILL to the child's session, then reaped."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()


def _text(path: Path, tail: bool = False) -> str:
    """The start (or the end) of a file the child wrote, as text (empty when it wrote none)."""
    try:
        with open(path, "rb") as stream:
            if tail:
                stream.seek(max(0, os.fstat(stream.fileno()).st_size - REASON_CHARS))
            return stream.read(REASON_CHARS).decode("utf-8", "replace")
    except OSError:
        return ""


def _result(folder: Path, index: int, images: int, first: int) -> Found | Refused:
    """A set's arrays as the child wrote them, checked; or its reason."""
    reason = folder / f"reason-{index}.txt"
    if reason.exists():
        return Refused(_text(reason))
    try:
        classes = _array(folder / f"classes-{index}.npy", images * 8 + 1024)
        outputs = _array(folder / f"outputs-{index}.npy", min(first, images) * CLASSES * 8 + 1024)
    except (OSError, ValueError) as exc:
        return Refused(f"the check's results cannot be read: {exc}")
    if (classes.shape != (images,) or classes.dtype != np.int64
            or outputs.shape != (min(first, images), CLASSES) or outputs.dtype.kind != "f"):
        return Refused("the check's results are not what it was asked for")
    return classes, outputs


def _array(path: Path, limit: int) -> np.ndarray:
    if path.stat().st_size > limit:
        raise ValueError(f"{path.name} is larger than {limit} bytes")
    return np.load(path, allow_pickle=False)
