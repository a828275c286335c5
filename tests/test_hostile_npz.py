"""Every ``.npz`` dlbench did not make is read by one reader (``files.read_npz``), whose
headers may lie.

The files here are made by hand: an ``.npy`` header is a few bytes of text, so one can
declare 2^40 numbers over no data at all, or a 256 MB array that is not there.  numpy
would allocate what a header declares before finding the data short; the reader believes
a shape only where the zip member's size backs it, checks the names before it reads an
array, and turns whatever goes wrong (a zip error, ``MemoryError``) into one line.  The
files reach it by the host's own paths: a job's out/ read back by the job loop (a
framework added from outside, run natively, plants them), a stored transfer file read by
``dlbench report``, the user's ``--weights`` given to ``dlbench run``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import dlbench, native_framework
from dlbench_runner import fair as networks
from orchestrator import files, store
from orchestrator.checks import fair, migration, onnx_layers, transfer
from orchestrator.errors import UsageError

FIXTURE = Path(__file__).parent / "fixtures" / "numpy_softmax"
TERA = 1 << 40


def npy(shape: tuple, descr="<i8", data: bytes = b"") -> bytes:
    """An .npy file written by hand: its header declares ``shape`` of ``descr`` whatever
    ``data`` holds."""
    header = ("{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (descr, shape)).encode("latin1")
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data


def real_npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def npz(**members: bytes) -> bytes:
    """A zip of members ``name.npy`` (deflated), in the order given."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(f"{name}.npy", data)
    return buffer.getvalue()


LOGITS = real_npy(np.zeros((16, 10)))
# migration.npz: its predictions declare 2^40 int64 (8 TiB) over no data, in under 400 bytes
LYING_MIGRATION = npz(predictions=npy((TERA,)), logits=LOGITS)
# transfer.npz: 2^40 images of 28 x 28 declared, one real label and epsilon
LYING_TRANSFER = npz(images=npy((TERA, 28, 28), "<f4"), labels=real_npy(np.zeros(1, np.int64)),
                     epsilon=real_npy(np.float64(0.1)))
TRANSFER_REASON = (f"transfer.npz is invalid: images.npy declares {TERA}x28x28 float32 "
                   f"({TERA * 28 * 28 * 4} bytes), but holds 0 after its header")


# -- the reader ---------------------------------------------------------------------------
@pytest.mark.parametrize("data, reason", [
    (LYING_MIGRATION, f"x.npz is invalid: predictions.npy declares {TERA} int64 ({TERA * 8} bytes), "
                      "but holds 0 after its header"),
    # a header that declares less than the member holds is as false
    (npz(predictions=npy((2,), "<i8", bytes(24))), "x.npz is invalid: predictions.npy declares 2 int64 "
                                                   "(16 bytes), but holds 24 after its header"),
    (npz(predictions=npy((3,), "|O", bytes(24))), "x.npz is invalid: Object arrays cannot be loaded "
                                                  "(predictions.npy holds Python objects"),
    (npz(predictions=npy((2,), "<U4", bytes(32))), "x.npz is invalid: predictions.npy holds <U4, not plain numbers"),
    (npz(predictions=npy((2,), [("a", "<i8")], bytes(16))),
     "x.npz is invalid: predictions.npy holds [('a', '<i8')], not plain numbers"),
    (npz(predictions=b"\x93NUMPY\x01\x00\xff\x7f" + b" " * 32767),
     "x.npz is invalid: Header info length (32767) is large"),
    (npz(predictions=b"\x93NUMPY\x01\x00\xff\x7f{"), "x.npz is invalid: EOF: reading array header"),
    (npz(predictions=b"not numpy"), "x.npz is invalid: the magic string is not correct"),
    (npz(secret=real_npy(np.zeros(2))), "x.npz is invalid: it holds secret.npy, not predictions, logits"),
    (b"PK\x03\x04 not a zip", "x.npz is invalid: File is not a zip file"),
    (b"", "x.npz is invalid: File is not a zip file"),
])
def test_the_reader_refuses_what_a_header_or_zip_gets_wrong_in_one_line(data, reason):
    with pytest.raises(files.Refused) as refused:
        files.read_npz(data, "x.npz", 1 << 20, 2, ("predictions", "logits"))
    assert str(refused.value).startswith(reason), str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_member_that_is_no_array_is_refused_before_any_is_read():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("logits.npy", LOGITS)
        archive.writestr("predictions", b"raw bytes numpy would hand back as they are")
    with pytest.raises(files.Refused, match="'predictions' is not an .npy array"):
        files.read_npz(buffer.getvalue(), "x.npz", 1 << 20, 2)
    # the same length, and zipfile ends a name at its NUL: logits.npy twice
    twice = buffer.getvalue().replace(b"predictions", b"logits.npy\0")
    with pytest.raises(files.Refused, match="^x.npz is invalid: it names an array twice$"):
        files.read_npz(twice, "x.npz", 1 << 20, 2)


def test_the_reader_reads_what_numpy_writes():
    buffer = io.BytesIO()
    np.savez_compressed(buffer, predictions=np.arange(5), logits=np.ones((2, 10), np.float32).T)
    found = files.read_npz(buffer.getvalue(), "x.npz", 1 << 20, 2, ("predictions", "logits"))
    assert (found["predictions"] == np.arange(5)).all() and found["logits"].shape == (10, 2)
    assert found["logits"].flags.f_contiguous          # Fortran order, as written


def test_an_array_past_the_hosts_memory_is_one_line():
    """An honest header whose array the host cannot hold (a process limited to 384 MB of
    address space past what it holds, given 512 MB of zeros, 500 KB deflated): numpy's
    MemoryError is the file's refusal, not a traceback."""
    script = textwrap.dedent("""
        import io, resource, zipfile
        import numpy as np
        from numpy.lib import format as npy
        from orchestrator import files
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            with archive.open("images.npy", "w", force_zip64=True) as member:
                npy.write_array_header_1_0(member, {"descr": "<f8", "fortran_order": False,
                                                    "shape": (1 << 26,)})
                for _ in range(64):
                    member.write(bytes(8 << 20))
        data = buffer.getvalue()
        with open("/proc/self/statm") as statm:
            held = int(statm.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (held + (384 << 20), resource.RLIM_INFINITY))
        try:
            files.read_npz(data, "big.npz", 1 << 30, 1)
        except files.Refused as exc:
            print(exc)
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout == "big.npz is invalid: its arrays do not fit in memory\n"


# -- a job's files, read back by the host --------------------------------------------------
def test_a_lying_migration_file_is_the_checks_reason(tmp_path, data_root):
    job = tmp_path / "job"
    (job / "out").mkdir(parents=True)
    (job / "out" / "migration.npz").write_bytes(LYING_MIGRATION)
    found = migration.evaluate(job, "mnist", data_root)
    assert found.migration_reason.startswith(f"migration.npz is invalid: predictions.npy declares {TERA} int64")
    assert found.migrated_accuracy is None


def test_a_lying_layer_file_is_refused():
    listing = json.dumps({"format": "dlbench-layers", "version": 1, "input": [4], "dtype": "float32",
                          "layers": [{"op": "dense", "weight": "d"}]}).encode()
    with pytest.raises(onnx_layers.Refused) as refused:
        onnx_layers.read(listing, npz(d=npy((TERA, TERA), "<f4")))
    assert str(refused.value).startswith(f"layers.npz is invalid: d.npy declares {TERA}x{TERA} float32")


def test_a_lying_transfer_file_is_not_taken(tmp_path):
    out = tmp_path / "job" / "out"
    out.mkdir(parents=True)
    (out / "transfer.npz").write_bytes(LYING_TRANSFER)
    assert transfer.taken(tmp_path / "job", "mnist")[0] is None
    with pytest.raises(migration.Refused) as refused:
        transfer.read(LYING_TRANSFER, "mnist")
    assert str(refused.value) == TRANSFER_REASON


@pytest.fixture(scope="module")
def planted_run(data_root, tmp_path_factory) -> Path:
    """`dlbench run --repeats 2` of a framework added from outside, run natively, whose
    job replaces its migration.npz and transfer.npz with lying ones once the runner has
    written its own: the results directory."""
    top = tmp_path_factory.mktemp("planted")
    folder = top / "frameworks" / "liar"
    (folder / "planted").mkdir(parents=True)
    (folder / "planted" / "migration.npz").write_bytes(LYING_MIGRATION)
    (folder / "planted" / "transfer.npz").write_bytes(LYING_TRANSFER)
    native_framework(folder, "liar", textwrap.dedent('''

        import shutil

        PLANTED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "planted")


        class Adapter(Adapter):
            def describe(self):
                """Last of all (the runner has written its files): the crafted ones in their
                place, in out/ (the runner's working directory)."""
                for name in os.listdir(PLANTED):
                    shutil.copyfile(os.path.join(PLANTED, name), name)
                return super().describe()
        '''))
    results = top / "results"
    proc = dlbench("run", "--runtime", "native", "--python", sys.executable, "--frameworks", "liar",
                   "--datasets", "mnist", "--profile", "quick", "--cpus", "1", "--repeats", "2",
                   "--results", results, "--data-dir", data_root,
                   env={"DLBENCH_FRAMEWORKS_PATH": str(folder.parent),
                        "DOCKER_HOST": f"unix://{top}/no-docker.sock"})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return results


def test_lying_files_from_a_job_lose_no_row_and_are_not_stored(planted_run):
    rows = store.load(planted_run)
    assert len(rows) == 2 and (rows["status"] == "ok").all(), rows["error"].tolist()
    for row in rows.itertuples():
        assert row.migration_reason.startswith(
            f"migration.npz is invalid: predictions.npy declares {TERA} int64"), row.migration_reason
        assert pd.isna(row.migrated_accuracy)
        assert not store.transfer_path(planted_run, row.run_id).exists()
        assert row.transfer_reason == TRANSFER_REASON           # the row says why
        assert (planted_run / store.JOBS / row.run_id / "result.json").is_file()    # its job's kept


def test_the_report_gives_the_rows_reason_for_images_the_host_did_not_take(planted_run, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(planted_run, results)
    first, run_id = store.load(results)["run_id"]     # the latest is the group's entry
    path = store.transfer_path(results, first)        # some images kept: the matrices are drawn
    path.parent.mkdir(exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, images=np.zeros((2, 28, 28), np.float32), labels=np.zeros(2, np.uint8),
             epsilon=np.float64(0.1))
    path.write_bytes(buffer.getvalue())
    proc = dlbench("report", "--results", results, "--format", "json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    cells = json.loads(proc.stdout)["transfer"]
    assert {c["reason"] for c in cells if c["images_run_id"] == run_id} == {"no FGSM images: " + TRANSFER_REASON}


def test_a_report_leaves_out_a_lying_stored_transfer_file_with_a_warning(planted_run, tmp_path):
    """A transfer file an older dlbench stored as it was: the report says so and goes on."""
    results = tmp_path / "results"
    shutil.copytree(planted_run, results)
    run_id = store.load(results)["run_id"].iloc[-1]        # the latest: the group's entry
    path = store.transfer_path(results, run_id)
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(LYING_TRANSFER)
    proc = dlbench("report", "--results", results, "--format", "json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines.count(f"dlbench: warning: {path}: left out of the transfer matrices: {TRANSFER_REASON}") == 1
    assert all(line.startswith("dlbench: warning: ") for line in lines), proc.stderr
    cells = json.loads(proc.stdout)["transfer"]
    assert {c["reason"] for c in cells if c["images_run_id"] == run_id} == {TRANSFER_REASON}


# -- the user's weights (--weights) ---------------------------------------------------------
def weights_error(path: Path) -> str:
    """The one line `dlbench run --profile fair --weights PATH --dry-run` ends with."""
    proc = dlbench("run", "--dry-run", "--profile", "fair", "--frameworks", "pytorch", "--datasets", "mnist",
                   "--weights", path, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    line, = proc.stderr.strip().splitlines()
    return line


def good_weights() -> dict[str, bytes]:
    return {name: real_npy(array) for name, array in networks.initial_weights("mnist", 1).items()}


def test_a_garbage_weights_file_is_one_line(tmp_path):
    path = tmp_path / "w.npz"
    path.write_bytes(b"PK\x03\x04" + os.urandom(2000))
    assert weights_error(path).startswith(f"dlbench: error: --weights {path}: w.npz is invalid: ")


def test_a_weights_file_whose_header_lies_is_one_line(tmp_path):
    path = tmp_path / "w.npz"
    path.write_bytes(npz(**dict(good_weights(), **{"conv1.weight": npy((TERA, 1, 5, 5), "<f4")})))
    assert weights_error(path) == (f"dlbench: error: --weights {path}: w.npz is invalid: conv1.weight.npy "
                                   f"declares {TERA}x1x5x5 float32 ({TERA * 100} bytes), but holds 0 "
                                   "after its header")


def test_the_names_of_a_weights_file_are_checked_before_any_array_is_read(tmp_path):
    """An extra array of 64 MB (zeros, 60 KB deflated), first in the file, its deflated data
    zeroed from its 10th KB: had anything been read, the cut or the size would be the reason."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("extra.npy", "w", force_zip64=True) as member:
            member.write(npy((1 << 24,), "<f4"))
            for _ in range(8):
                member.write(bytes(8 << 20))
        for name, data in good_weights().items():
            archive.writestr(f"{name}.npy", data)
    data = buffer.getvalue()
    start = data.index(b"extra.npy") + len("extra.npy") + 20    # past its local header (and zip64 field)
    data = data[:start + 10_000] + bytes(30_000) + data[start + 40_000:]
    path = tmp_path / "w.npz"
    path.write_bytes(data)
    line = weights_error(path)
    assert line.startswith(f"dlbench: error: --weights {path}: w.npz is invalid: it holds conv1.bias.npy, "
                           "conv1.weight.npy, conv2.bias.npy, conv2.weight.npy, extra.npy, "), line
    assert line.endswith("not conv1.weight, conv1.bias, conv2.weight, conv2.bias, ip1.weight, ip1.bias, "
                         "ip2.weight, ip2.bias")


def test_a_fifo_given_as_weights_is_refused_at_once(tmp_path):
    """A FIFO nobody writes to would hold a plain open for ever."""
    path = tmp_path / "w.npz"
    os.mkfifo(path)
    assert weights_error(path) == f"dlbench: error: --weights {path}: not a regular file (a FIFO)"


def test_a_weights_file_past_the_networks_size_is_refused_unread(tmp_path):
    path = tmp_path / "w.npz"
    with open(path, "wb") as file:
        file.truncate(64 << 20)         # sparse: 64 MB of nothing
    assert weights_error(path).startswith(f"dlbench: error: --weights {path}: {64 << 20} bytes (limit ")


def test_weights_replaced_after_the_plan_fail_their_job_in_one_line(tmp_path):
    """The user's file is read again as each job starts: replaced by a FIFO (which would hold
    a plain open for ever) or by other weights, the job fails with one line (``UsageError``:
    the run loop's failed row), never a hang, a traceback or weights other than its row names."""
    from conftest import make_plan

    weights = networks.initial_weights("mnist", 1)
    planned, = make_plan(["pytorch"], ["mnist"], "fair", host_cpus=2).jobs

    def job(path: Path):
        return planned.model_copy(update={"weights": str(path), "weights_sha256": networks.weights_digest(weights)})

    np.savez(tmp_path / "same.npz", **weights)
    given = io.BytesIO(fair.job_inputs(job(tmp_path / "same.npz"))[networks.WEIGHTS_FILE])
    with np.load(given) as arrays:
        assert networks.weights_digest(dict(arrays)) == networks.weights_digest(weights)
    os.mkfifo(tmp_path / "fifo.npz")
    with pytest.raises(UsageError, match=f"^--weights {tmp_path}/fifo.npz: not a regular file \\(a FIFO\\)$"):
        fair.job_inputs(job(tmp_path / "fifo.npz"))
    np.savez(tmp_path / "other.npz", **networks.initial_weights("mnist", 2))
    with pytest.raises(UsageError, match="other.npz: the file changed after the run was planned"):
        fair.job_inputs(job(tmp_path / "other.npz"))
