"""Status tells the truth: bad settings refused before any job, a diverging loss stored
as failed, every failure one line or one row (no finished row lost, on a real full or
read-only disk), data readers that stop where the file should end, and a remembered data
check that a restored mtime cannot fool."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest

from conftest import REPO, dlbench
from dlbench_runner import data as formats, runner as runner_module, spec as specs
from orchestrator import datasets, store
from orchestrator.errors import DatasetError
from test_store import good_result, record_for

docker = pytest.mark.docker
QUICK = ("--datasets", "mnist", "--profile", "quick")


def one_line_error(proc, *parts, code=None):
    """The CLI failed with one error line, the last on stderr (the live display may be
    above it), holding every part, and no traceback."""
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("dlbench: error: ")]
    assert errors == lines[-1:] and "Traceback" not in proc.stderr, proc.stderr
    for part in parts:
        assert part in errors[0], (part, errors[0])
    assert proc.returncode == (code if code is not None else proc.returncode) != 0
    return errors[0]


def row_files(results: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in store.row_files(results)}


def a_stored_row(results: Path, tmp_path: Path) -> dict:
    """One real row file in ``results`` (as a finished job leaves it); returns the files."""
    record = record_for(tmp_path, good_result())
    store.append(results, [record])
    return row_files(results)


@contextlib.contextmanager
def mounted(path: Path, options: str):
    """A tmpfs of its own at ``path`` (we are root in the test machine; else skipped)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last byte."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                pass
    return filler


# -- settings: refused before any job, on one line -------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--set", "learning_rate=nan"], "hyper-parameter 'learning_rate' must be a finite number, not nan"),
    (["--set", "learning_rate=NaN"], "must be a finite number, not nan"),
    (["--set", "learning_rate=inf"], "must be a finite number, not inf"),
    (["--set", "learning_rate=-inf"], "must be a finite number, not -inf"),
    (["--set", "learning_rate=1e400"], "must be a finite number, not inf"),
    (["--set", "learning_rate=-0.1"], "'learning_rate' must be more than 0, not -0.1"),
    (["--learning-rates", "0.1,nan"], "must be a finite number, not nan"),
    (["--set", "batch_size=0"], "'batch_size' must be at least 1, not 0"),
    (["--set", "batch_size=-5"], "'batch_size' must be at least 1, not -5"),
    (["--set", "batch_size=100000000"], "'batch_size' must be at most 65536"),
    (["--set", "epochs=0"], "'epochs' must be at least 1, not 0"),
    (["--set", "epochs=-3"], "'epochs' must be at least 1, not -3"),
    (["--set", "momentum=-0.5"], "'momentum' must be 0 or more"),
    (["--set", "epochs=99999999999"], "'epochs' must be at most 2147483647"),
    (["--timeout", "nan"], "--timeout nan: a time limit is more than 0 and at most 604800 seconds"),
    (["--timeout", "inf"], "--timeout inf: a time limit"),
    (["--timeout", "0"], "--timeout 0: a time limit"),
    (["--timeout", "-1"], "--timeout -1: a time limit"),
    (["--timeout", "1e9"], "--timeout 1e+09: a time limit"),
    (["--memory", "9999999t"], "--memory '9999999t': at most 1024t"),
    (["--seed", str(2**70)], f"--seed {2**70}: a seed is a whole number from 0 to 2147483647"),
    (["--seed", "-1"], "--seed -1: a seed is a whole number"),
    (["--seed", str(2**31 - 2), "--repeats", "3"], "the last seed is 2147483648"),
    (["--repeats", "1000000000"], "the plan has 1,000,000,000 jobs (1 x 1,000,000,000 repeats), "
                                  "more than 100,000; set DLBENCH_MAX_JOBS"),
    (["--cpus", "0"], "--cpus/--threads 0"),
    (["--cpus", "100000"], "--cpus/--threads 100000: this host has"),
    (["--gpu", "-1"], "--gpu -1: a GPU index is 0 or more"),
    (["--gpu", str(2**70)], "a GPU index is 0 or more, at most 1023"),
])
def test_a_bad_setting_is_one_line_before_any_job(args, message, tmp_path):
    results = tmp_path / "results"
    proc = dlbench("run", "--frameworks", "torch", *QUICK, *args, "--results", results)
    one_line_error(proc, message, code=2)
    assert not results.exists()          # nothing was started, not even the directory


def test_the_plan_size_cap_can_be_raised(tmp_path):
    args = ("run", "--frameworks", "torch", *QUICK, "--dry-run", "--format", "json")
    one_line_error(dlbench(*args, "--repeats", "6", env={"DLBENCH_MAX_JOBS": "5"}),
                   "the plan has 6 jobs (1 x 6 repeats), more than 5", code=2)
    proc = dlbench(*args, "--repeats", "5", env={"DLBENCH_MAX_JOBS": "5"})
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 5
    one_line_error(dlbench(*args, env={"DLBENCH_MAX_JOBS": "lots"}), "DLBENCH_MAX_JOBS='lots'", code=2)


@pytest.mark.parametrize("line, key, message", [
    ("learning_rate = nan", "hyperparameters.learning_rate", "must be a finite number, not nan"),
    ("learning_rate = -inf", "hyperparameters.learning_rate", "must be a finite number, not -inf"),
    ("batch_size = [32, 0]", "hyperparameters.batch_size", "must be at least 1, not 0"),
])
def test_a_campaign_file_gets_the_same_errors_with_its_line(line, key, message, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(f'name = "bad"\nframeworks = ["torch"]\ndatasets = ["mnist"]\n\n'
                    f"[hyperparameters]\n{line}\n")
    proc = dlbench("run", "--campaign", path, "--dry-run")
    one_line_error(proc, f"{path}:6: {key}: torch/mnist: hyper-parameter", message, code=2)


@pytest.mark.parametrize("text, line, message", [
    ("seed = -1\n", 4, "seed: --seed -1: a seed is a whole number from 0 to 2147483647"),
    ("repeats = 1000000000\n", 4, "repeats: the plan has 1,000,000,000 jobs"),
    ("[limits]\ntimeout = inf\n", 5, "limits.timeout: Input should be a finite number"),
    ("[limits]\ntimeout = 1e9\n", 5, "limits.timeout: Input should be less than or equal to 604800"),
    ("[limits]\nmemory = \"9999999t\"\n", 5, "limits.memory: memory '9999999t': at most 1024t"),
])
def test_a_campaign_files_limits_are_bounded(text, line, message, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(f'name = "bad"\nframeworks = ["torch"]\ndatasets = ["mnist"]\n{text}')
    one_line_error(dlbench("run", "--campaign", path, "--dry-run"), f"{path}:{line}: {message}", code=2)


def test_the_runner_refuses_the_same_settings(data_root, tmp_path):
    fixture = REPO / "tests" / "fixtures" / "numpy_softmax"
    for setting, message in (("learning_rate=NaN", "must be a finite number, not nan"),
                             ("batch_size=0", "must be at least 1")):
        proc = subprocess.run([sys.executable, "-m", "dlbench_runner", "--framework-dir", str(fixture),
                               "--data", str(data_root), "--out", str(tmp_path), "--dataset", "mnist",
                               "--set", setting], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr
        assert not (tmp_path / "result.json").exists()


# -- a loss that is not finite stops the job ---------------------------------------------------
def test_the_context_stops_at_a_loss_that_is_not_finite(data_root):
    spec = specs.complete({"framework": "numpy-softmax", "dataset": "mnist", "profile": "quick"},
                          specs.load_catalog(REPO / "tests" / "fixtures" / "numpy_softmax"))
    ctx = runner_module.Context(spec, str(data_root))
    ctx.progress(1, 0.1, 2.3, step=1)
    ctx.epoch_done(1, 2.0, 0.5)
    with pytest.raises(runner_module.TrainingDiverged, match=r"^loss became nan at epoch 2 \(step 17\)$"):
        ctx.progress(2, 0.2, float("nan"), step=17)
    with pytest.raises(runner_module.TrainingDiverged, match=r"^loss became inf at epoch 2 \(step 17\)$"):
        ctx.epoch_done(2, float("inf"), 0.1)


DIVERGING = """
class Adapter:
    def __init__(self, ctx):
        self.ctx = ctx
    def setup(self):
        pass
    def train(self):
        loss = 2.3
        for step in range(1, 10):
            loss = loss * 1e200 if step >= 3 else loss
            self.ctx.progress(1, step / 10, loss, step=step)
        self.ctx.epoch_done(1, loss, 0.1)
    def test(self):
        return {"accuracy": 0.1, "loss": 2.3}
    def describe(self):
        return {}
"""


def run_adapter(tmp_path, data_root, name: str, code: str):
    """The runner as a process, with a framework directory holding ``code`` as its adapter;
    returns the process and its out/ directory."""
    framework = tmp_path / name
    framework.mkdir()
    (framework / "adapter.py").write_text(code)
    (framework / "models.json").write_text(json.dumps({"framework": name, "models": {
        "mnist": {"model": "none", "hyperparameters": {"epochs": 1}}}}))
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-m", "dlbench_runner", "--framework-dir", str(framework),
                           "--data", str(data_root), "--out", str(out), "--dataset", "mnist"],
                          capture_output=True, text=True, timeout=120)
    return proc, out


def test_a_diverging_adapter_leaves_a_failed_result_naming_the_step(data_root, tmp_path):
    proc, out = run_adapter(tmp_path, data_root, "diverging", DIVERGING)
    assert proc.returncode == 1
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "failed"
    assert result["error"] == "TrainingDiverged during train: loss became inf at epoch 1 (step 4)"


@docker
@pytest.mark.parametrize("framework, rate", [("caffe", "1e30")])
def test_a_job_whose_loss_diverges_is_stored_failed_with_the_step(framework, rate, data_root, tmp_path):
    # Caffe's LeNet at 1e30 gives a NaN loss at its second step.  Not every framework
    # does: TensorFlow's Adam and MXNet's tanh LeNet (whose loss is clipped) saturate at
    # finite losses and train to chance accuracy, an ok row that says so.
    results = tmp_path / "results"
    proc = dlbench("run", "--frameworks", framework, *QUICK, "--set", f"learning_rate={rate}",
                   "--results", results, "--data-dir", data_root)
    assert proc.returncode == 3, proc.stderr
    row, = store.load(results).itertuples()
    assert row.status == "failed", (row.status, row.error, row.accuracy)
    assert "TrainingDiverged during train: loss became" in row.error
    assert row.error.endswith(" at epoch 1 (step 2)")
    assert row.learning_rate == float(rate)


# -- the results directory, checked before anything runs ----------------------------------------
def run_args(results, data_root):
    return ("run", "--frameworks", "caffe", *QUICK, "--results", results, "--data-dir", data_root)


def test_a_results_path_that_is_a_file_is_one_line(data_root, tmp_path):
    path = tmp_path / "results"
    path.write_text("not a directory")
    one_line_error(dlbench(*run_args(path, data_root)), f"{path}: not a directory", code=1)
    one_line_error(dlbench(*run_args(path / "sub", data_root)),
                   f"{path / 'sub'}: cannot make the results directory: Not a directory", code=1)
    assert path.read_text() == "not a directory"


def test_a_read_only_results_directory_is_one_line(data_root, tmp_path):
    with mounted(tmp_path / "ro", "ro,size=64m") as results:
        one_line_error(dlbench(*run_args(results, data_root)),
                       f"{results}: cannot write in the results directory: Read-only file system", code=1)
        one_line_error(dlbench(*run_args(results / "new", data_root)),
                       "cannot make the results directory: Read-only file system", code=1)


def test_a_results_disk_without_room_is_one_line(data_root, tmp_path):
    with mounted(tmp_path / "small", "size=50m") as results:
        before = a_stored_row(results, tmp_path)
        one_line_error(dlbench(*run_args(results, data_root)),
                       f"{results}: 50 MB free, a run needs at least 100 MB (DLBENCH_MIN_FREE_MB sets it)",
                       code=1)
        assert row_files(results) == before and not (results / store.JOBS).exists()


@docker
def test_a_full_disk_before_a_job_is_one_line_and_leaves_nothing(data_root, tmp_path):
    with mounted(tmp_path / "full", "size=4m") as results:
        before = a_stored_row(results, tmp_path)
        fill(results)
        proc = dlbench(*run_args(results, data_root), env={"DLBENCH_MIN_FREE_MB": "0"})
        one_line_error(proc, f"{results}: cannot set up job 1: No space left on device; "
                             "the rows stored so far are kept", code=1)
        assert row_files(results) == before
        assert not list((results / store.JOBS).rglob("*")) and not list(results.rglob("job.json"))
        assert not list((results / store.RESCUED).glob("*"))


@docker
def test_a_full_disk_after_a_job_keeps_its_row_until_recovered(data_root, tmp_path):
    results = tmp_path / "results"
    with mounted(results, "size=4m"), mounted(results / store.JOBS, "size=256m"):
        before = a_stored_row(results, tmp_path)
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *run_args(results, data_root),
                                 "--set", "max_iter=100"], env=dict(os.environ, DLBENCH_MIN_FREE_MB="1"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 600
            while not list((results / store.RESCUED).glob("*.json")) and proc.poll() is None:
                assert time.monotonic() < deadline, "the job never started"
                time.sleep(0.05)
            filler = fill(results)      # while the job runs: its own files are on another disk
            _, stderr = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
        rescued, = (results / store.RESCUED).glob("*.json")
        line = one_line_error(subprocess.CompletedProcess([], proc.returncode, "", stderr),
                              "cannot store job", "its row: No space left on device",
                              "its trace: No space left on device", f"it is kept in {rescued}",
                              f"run `dlbench recover --results {results}`", code=1)
        assert "(caffe/mnist, ok)" in line
        assert row_files(results) == before

        filler.unlink()
        proc = dlbench("recover", "--results", results)
        assert proc.returncode == 0 and "recovered 1 row(s)" in proc.stdout, proc.stderr
        frame = store.load(results)
        row, = frame[frame["framework"] == "caffe"].itertuples()
        assert row.status == "ok" and row.accuracy > 0.5 and row.trace_samples > 0
        assert row.run_id == rescued.stem and store.trace_path(results, row.run_id).is_file()
        assert (results / store.JOBS / row.run_id / "result.json").is_file()
        assert not list((results / store.RESCUED).glob("*")) and len(frame) == 2


def test_recover_leaves_the_room_of_a_living_run_and_removes_an_abandoned_one(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    living = store.Rescue(results, "living")
    abandoned = store.Rescue(results, "abandoned")
    os.close(abandoned.fd)              # its run was killed: the lock went with it
    abandoned.fd = None
    assert store.recover(results) == (0, [])
    assert living.path.is_file() and not abandoned.path.exists()
    living.release()
    assert not living.path.exists()



def test_a_model_too_big_for_the_room_goes_aside_and_the_row_stays_whole(tmp_path, monkeypatch):
    """The room is sized for the row; a 3 MB model filled it and the rest of the file was
    zeros (a short write on a full disk was taken for a whole one): the row could not be
    read back.  Now the model goes to the temporary directory and the kept row names it."""
    results, aside = tmp_path / "results", tmp_path / "aside"
    aside.mkdir()
    monkeypatch.setattr(store.rescue.tempfile, "tempdir", str(aside))
    with mounted(results, "size=4m"):
        before = a_stored_row(results, tmp_path)
        record = record_for(tmp_path / "second", good_result()).model_copy(update={"run_id": "run2"})
        rescue = store.Rescue(results, record.run_id)
        filler = fill(results)
        model, images = os.urandom(3 << 20), os.urandom(1000)
        with pytest.raises(store.StoreError) as error:
            store.store_row(results, record, [{"t": 1.0}], rescue, blobs={"model": model, "transfer": images})
        line = str(error.value)
        assert "its row: No space left on device" in line and f"it is kept in {rescue.path}" in line
        onnx, = aside.glob("dlbench-rescued-run2-*.onnx")
        npz, = aside.glob("dlbench-rescued-run2-*.npz")
        assert f"its ONNX model in {onnx}" in line and f"its FGSM images in {npz}" in line
        assert json.loads(rescue.path.read_bytes())["files"] == {"model": str(onnx), "transfer": str(npz)}
        assert row_files(results) == before

        filler.unlink()
        assert store.recover(results) == (1, [])
        assert store.model_path(results, "run2").read_bytes() == model
        assert store.transfer_path(results, "run2").read_bytes() == images
        assert not onnx.exists() and not npz.exists() and len(store.load(results)) == 2


def test_a_rescued_row_whose_model_file_is_gone_is_stored_without_it(tmp_path, monkeypatch):
    results = tmp_path / "results"
    monkeypatch.setattr(store.rescue.tempfile, "tempdir", str(tmp_path))
    with mounted(results, "size=4m"):
        record = record_for(tmp_path / "job", good_result())
        rescue = store.Rescue(results, record.run_id)
        filler = fill(results)
        with pytest.raises(store.StoreError):
            store.store_row(results, record, [], rescue, blobs={"model": os.urandom(2 << 20)})
        onnx, = tmp_path.glob("dlbench-rescued-*.onnx")
        onnx.unlink()                   # the temporary directory was emptied meanwhile
        filler.unlink()
        count, problems = store.recover(results)
        assert count == 1 and problems == [f"{rescue.path}: its ONNX model ({onnx}) is gone: "
                                           "the row is stored without it"]
        assert len(store.load(results)) == 1 and not store.model_path(results, record.run_id).exists()


def test_recover_reads_and_removes_no_file_but_those_it_kept(tmp_path):
    """A rescue file names where its model went, and recover reads that file and then
    removes it: a results directory naming another file is refused, the file left alone."""
    results = tmp_path / "results"
    (results / store.RESCUED).mkdir(parents=True)
    precious = tmp_path / "precious.onnx"
    precious.write_bytes(b"not dlbench's")
    record = record_for(tmp_path / "job", good_result())
    kept = results / store.RESCUED / f"{record.run_id}.json"
    kept.write_text(json.dumps({"row": record.model_dump(mode="json"), "trace": [], "robustness": [],
                                "row_stored": False, "files": {"model": str(precious)}}))
    count, (problem,) = store.recover(results)
    assert count == 0 and problem.startswith(f"{kept}: not recovered: its ONNX model file ")
    assert problem.endswith("is not one dlbench kept")
    assert precious.read_bytes() == b"not dlbench's" and kept.is_file()
    assert not store.row_files(results) and not store.model_path(results, record.run_id).exists()


def test_recover_says_each_file_it_cannot_recover_on_one_line(tmp_path):
    """The warning was wrapped over two lines at the terminal's width, without `dlbench:`."""
    results = tmp_path / ("a-results-directory-with-a-long-name-" * 3)
    (results / store.RESCUED).mkdir(parents=True)
    bad = results / store.RESCUED / "0123456789abcdef.json"
    bad.write_text('{"row": {"status": "ok"}}')
    proc = dlbench("recover", "--results", results)
    assert proc.returncode == 1 and proc.stdout == f"{results}: recovered 0 row(s)\n"
    line, = proc.stderr.splitlines()
    assert line.startswith(f"dlbench: warning: {bad}: not recovered: ") and len(line) > 120
    assert bad.is_file()

# -- report --html -------------------------------------------------------------------------------
def test_report_html_into_a_file_or_a_read_only_directory_is_one_line(tmp_path):
    results = tmp_path / "results"
    a_stored_row(results, tmp_path)
    page = tmp_path / "page"
    page.write_text("a file")
    one_line_error(dlbench("report", "--results", results, "--html", page),
                   f"--html {page}: not a directory", code=1)
    assert page.read_text() == "a file"
    with mounted(tmp_path / "ro", "ro,size=1m") as read_only:
        one_line_error(dlbench("report", "--results", results, "--html", read_only),
                       f"--html {read_only}: cannot write the page there: Read-only file system", code=1)


# -- data readers --------------------------------------------------------------------------------
def copy_mnist(data_root: Path, tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(data_root / "mnist", root / "mnist")
    return root


def test_a_gzip_bomb_is_read_no_further_than_its_header_promises(tmp_path):
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)            # a gzip stream
    with open(path, "wb") as f:
        f.write(packer.compress((2049).to_bytes(4, "big") + (60000).to_bytes(4, "big")))
        block = bytes(1 << 20)
        for _ in range(512):                                     # 512 MB of labels more
            f.write(packer.compress(block))
        f.write(packer.flush())
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(formats.DataError, match="longer than the 60008 bytes its header promises"):
            formats.read_idx(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def test_a_header_promising_too_much_is_refused_before_reading(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(b"".join(n.to_bytes(4, "big") for n in (2051, 2**31 - 1, 28, 28)))
    with pytest.raises(formats.DataError, match="its header promises"):
        formats.read_idx(str(path))


@pytest.fixture
def flipped(data_root, tmp_path) -> tuple[Path, Path]:
    """A copy of MNIST with one byte flipped inside a gzip stream."""
    root = copy_mnist(data_root, tmp_path)
    path = root / "mnist" / "train-labels-idx1-ubyte.gz"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises((zlib.error, EOFError, OSError)):
        gzip.decompress(bytes(raw))
    return root, path


def test_a_flipped_gzip_byte_is_one_line_for_verify_and_import(flipped, tmp_path):
    root, path = flipped
    one_line_error(dlbench("datasets", "verify", "--data-dir", root), f"{path}: ", code=1)
    proc = dlbench("datasets", "import", root, env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    one_line_error(proc, f"{path}: ", code=1)


@docker
def test_a_flipped_gzip_byte_is_one_line_for_run(flipped, tmp_path):
    root, path = flipped
    results = tmp_path / "results"
    proc = dlbench(*run_args(results, root), env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    one_line_error(proc, f"{path}: ", code=1)
    assert not row_files(results)


# -- the remembered data check -------------------------------------------------------------------
def test_a_file_corrupted_in_place_with_its_mtime_restored_is_found(data_root, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = copy_mnist(data_root, tmp_path)
    labels = root / "mnist" / "t10k-labels-idx1-ubyte"
    labels.write_bytes(gzip.decompress(Path(f"{labels}.gz").read_bytes()))
    Path(f"{labels}.gz").unlink()
    first = datasets.prepare(["mnist"], root)["mnist"]
    assert datasets.prepare(["mnist"], root)["mnist"] == first       # remembered
    before = labels.stat()
    with open(labels, "r+b") as f:                                    # in place: same inode
        f.seek(8)
        f.write(bytes([200]))
    os.utime(labels, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = labels.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size,
                                                                before.st_mtime_ns)
    with pytest.raises(DatasetError, match=f"{labels}: label 200 out of range 0-9"):
        datasets.prepare(["mnist"], root)
    one_line_error(dlbench("datasets", "verify", "--data-dir", root), "label 200 out of range", code=1)


SWALLOWING = """
import ctypes


class Adapter:
    '''Sorts with libc's qsort through a Python callback that raises: the C library
    cannot pass the exception on, so Python prints it and goes on, as MXNet's engine
    does with its optimizer's errors.'''

    def __init__(self, ctx):
        self.ctx = ctx

    def setup(self):
        pass

    def train(self):
        compare = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                   ctypes.POINTER(ctypes.c_int))

        def broken(a, b):
            raise ValueError("an update that failed")

        values = (ctypes.c_int * 4)(4, 3, 2, 1)
        libc = ctypes.CDLL(None)
        for step in range(1, 5):
            libc.qsort(values, 4, ctypes.sizeof(ctypes.c_int), compare(broken))
            self.ctx.progress(1, step / 4, 2.3, step=step)
        self.ctx.epoch_done(1, 2.3, 0.1)

    def test(self):
        return {"accuracy": 0.1, "loss": 2.3}

    def describe(self):
        return {}
"""


def test_an_exception_the_framework_swallows_fails_the_job(data_root, tmp_path):
    proc, out = run_adapter(tmp_path, data_root, "swallowing", SWALLOWING)
    assert proc.returncode == 1
    assert "Exception ignored on calling ctypes callback function" in proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "failed"
    assert result["error"].startswith("SwallowedError during train: the framework ignored ")
    assert "ValueError: an update that failed (Exception ignored on calling ctypes callback function" \
        in result["error"]


MXNET_NAN = """
import json
from dlbench_runner import runner, spec as specs
catalog = specs.load_catalog("/opt/dlbench/framework")
job = specs.complete({"framework": "mxnet", "dataset": "mnist", "profile": "quick"}, catalog)
job["hyperparameters"]["learning_rate"] = float("nan")     # past the spec's check, into the engine
result = runner.run(job, "/opt/dlbench/framework", "/data", "/tmp")
print(json.dumps({"status": result["status"], "error": result["error"]}))
"""


@docker
def test_mxnets_swallowed_optimizer_errors_fail_the_job(data_root):
    """MXNet runs its optimizer in a ctypes callback of its engine: with a NaN learning
    rate every update raised and was only printed, and the job was stored as ok."""
    import docker as sdk
    dlbench("build-images", "--frameworks", "mxnet", check=True)
    raw = sdk.from_env().containers.run(
        "dlbench/mxnet:cpu", entrypoint=["python3", "-c", MXNET_NAN], remove=True,
        network_mode="none", read_only=True, tmpfs={"/tmp": ""}, environment={"HOME": "/tmp"},
        user="nobody", labels={"org.dlbench.test": "truth"},
        volumes={str(data_root): {"bind": "/data", "mode": "ro"}}).decode()
    result = json.loads(raw.strip().splitlines()[-1])
    assert result["status"] == "failed"
    assert result["error"].startswith("SwallowedError during train: the framework ignored ")
    assert "Invalid Parameter format for lrs" in result["error"]
