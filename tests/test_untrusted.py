"""The check's child as it is started (orchestrator/checks/untrusted_child.py, by its path,
``python -I``): what it imports, what of the host's environment it ignores, the process
it leaves behind (none); and the migration check's test images, read once a run.

The hostile models themselves are test_hostile_models.py's."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
from onnx import TensorProto, helper

from orchestrator.checks import migration, untrusted
from test_hostile_models import IMAGES, _model, endless_loop, is_check

CLASS_3 = _model([helper.make_node("Cast", ["v"], ["vector"], to=TensorProto.FLOAT)],
                 [helper.make_tensor("v", TensorProto.FLOAT, [10], [0.0] * 3 + [1.0] + [0.0] * 6)])


def test_the_child_imports_nothing_of_dlbench_nor_onnxs_package(tmp_path):
    """Its start is Python, numpy, onnxruntime and onnx's protobuf classes: not onnx's
    package (ml_dtypes and its helpers, a second), nor dlbench's (every check's module)."""
    folder = tmp_path / "check"
    (folder / "work").mkdir(parents=True)
    (folder / "model.onnx").write_bytes(CLASS_3)
    np.save(folder / "images-0.npy", IMAGES, allow_pickle=False)
    probe = (f"import runpy, sys; from pathlib import Path; child = runpy.run_path({str(untrusted.CHILD)!r}); "
             "child['_onnx_package_unrun'](); "
             f"status = child['child'](Path({str(folder)!r}), 1, 0, 60, 60, 4 << 30, 64 << 20, 1); "
             "print(status, sorted({n.split('.')[0] for n in sys.modules} & {'orchestrator', 'dlbench_runner', "
             "'ml_dtypes'}), sorted(n for n in sys.modules if n.startswith('onnx.')))")
    done = subprocess.run([sys.executable, "-I", "-c", probe], cwd=folder / "work", capture_output=True,
                          text=True, check=True)
    assert done.stdout.split("\n")[0] == "0 [] ['onnx.onnx_ml_pb2']"
    assert np.load(folder / "classes-0.npy").tolist() == [3] * len(IMAGES)


def test_the_child_reads_no_python_path_of_the_host(tmp_path, monkeypatch):
    """``-I``: a ``PYTHONPATH`` (or a working directory) holding a module named like one
    the child imports is not read."""
    poisoned = tmp_path / "poisoned"
    poisoned.mkdir()
    for name in ("numpy", "onnxruntime", "sitecustomize"):
        (poisoned / f"{name}.py").write_text("raise SystemExit(9)\n")
    monkeypatch.setenv("PYTHONPATH", str(poisoned))
    monkeypatch.chdir(poisoned)
    classes, _ = untrusted.classify(CLASS_3, [IMAGES])[0]
    assert classes.tolist() == [3] * len(IMAGES)


def test_a_child_at_the_wall_clock_limit_is_killed_and_leaves_nothing(monkeypatch):
    """The child seen while it runs (its own session, the -I child by its path), then
    killed at the limit: no process, no folder left."""
    import tempfile

    monkeypatch.setattr(untrusted, "WALL_SECONDS", 2)
    seen = []

    def look():
        time.sleep(1.0)
        seen.extend((p, p.cmdline()[1:3], os.getsid(p.pid)) for p in psutil.Process().children(recursive=True)
                    if is_check(p))

    before = set(Path(tempfile.gettempdir()).glob("dlbench-model-*"))
    looker = threading.Thread(target=look)
    looker.start()
    started = time.monotonic()
    found, = untrusted.classify(endless_loop(), [IMAGES])
    looker.join()
    assert str(found) == "the ONNX model ran past the host's limit of 2 s and was stopped"
    assert 2 <= time.monotonic() - started < 6
    (child, command, session), = seen
    assert command == ["-I", str(untrusted.CHILD)] and session == child.pid      # a session of its own
    assert not child.is_running()
    assert not [p for p in psutil.Process().children(recursive=True) if is_check(p)]
    assert set(Path(tempfile.gettempdir()).glob("dlbench-model-*")) == before


def test_a_stopped_check_kills_its_child_at_once():
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    started = time.monotonic()
    found = untrusted.classify(endless_loop(), [IMAGES, IMAGES], stop=stop)
    assert [str(f) for f in found] == ["the check was stopped"] * 2 and time.monotonic() - started < 3
    assert not [p for p in psutil.Process().children(recursive=True) if is_check(p)]


def test_the_test_images_are_read_once_for_each_state_of_the_files(tmp_path, monkeypatch):
    """Once a run, not once a job; read-only, since every job shares them; read again where
    a file of the data set changed."""
    root = tmp_path / "data"
    (root / "mnist").mkdir(parents=True)
    images, labels = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28), np.array([1, 2], np.int64)
    (root / "mnist" / "t10k-images-idx3-ubyte").write_bytes(
        np.array([2051, 2, 28, 28], ">i4").tobytes() + images.tobytes())
    (root / "mnist" / "t10k-labels-idx1-ubyte").write_bytes(np.array([2049, 2], ">i4").tobytes()
                                                             + labels.astype(np.uint8).tobytes())
    reads = []
    real = migration.formats.test_split
    monkeypatch.setattr(migration.formats, "test_split", lambda *a: reads.append(a) or real(*a))
    first = migration.test_split("mnist", root)
    assert migration.test_split("mnist", root) is first and len(reads) == 1
    assert np.array_equal(first[0], images) and first[1].tolist() == [1, 2]
    assert not first[0].flags.writeable and not first[1].flags.writeable
    os.utime(root / "mnist" / "t10k-labels-idx1-ubyte", ns=(1, 1))
    assert migration.test_split("mnist", root) is not first and len(reads) == 2
