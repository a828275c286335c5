"""Transfer attacks: each run's FGSM images kept, stored beside its row, and tried by the
report on every other run's exported ONNX model.

The runner's test adapter (a numpy softmax regression, tests/fixtures/numpy_softmax) trains
on the real MNIST; copies of it under other names are the "frameworks" of a matrix, run
natively through `dlbench run`; the matrix is computed by `dlbench report` from the stored
files, with the real onnxruntime.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from conftest import dlbench
from dlbench_runner import robustness
from dlbench_runner.contract import formats
from orchestrator import store
from orchestrator.checks import transfer
from orchestrator.checks.migration import Refused

FIXTURE = Path(__file__).parent / "fixtures" / "numpy_softmax"
# the frameworks of the matrix: the test adapter under four names, each with its own settings
FRAMEWORKS = {"softmax": {"learning_rate": 0.5},
              "softmaxb": {"learning_rate": 0.05, "onnx_export": "float32"},
              "softmaxc": {"onnx_export": "none"},      # no ONNX model: an empty column
              "softmaxd": {"robust_images": 0}}         # no attack, no images: an empty row


@pytest.fixture(scope="module")
def results(data_root, tmp_path_factory) -> Path:
    """A results directory holding one quick MNIST run of each of FRAMEWORKS."""
    top = tmp_path_factory.mktemp("transfer")
    frameworks = top / "frameworks"
    for name, settings in FRAMEWORKS.items():
        folder = frameworks / name
        folder.mkdir(parents=True)
        shutil.copy(FIXTURE / "adapter.py", folder / "adapter.py")
        catalog = json.loads((FIXTURE / "models.json").read_text())
        catalog.update(framework=name, native={"module": "numpy"})
        model = catalog["models"]["mnist"]
        model["hyperparameters"].update(settings)
        model["settings"] = {"length": ["epochs"], "learning_rate": ["learning_rate"], "train_images": 60000}
        (folder / "models.json").write_text(json.dumps(catalog))
        (folder / "Dockerfile").write_text("# run natively only\n")
    out = top / "results"
    dlbench("run", "--runtime", "native", "--python", sys.executable, "--frameworks", ",".join(FRAMEWORKS),
            "--datasets", "mnist", "--profile", "quick", "--cpus", "1", "--results", out,
            "--data-dir", data_root, check=True,
            env={"DLBENCH_FRAMEWORKS_PATH": str(frameworks), "DOCKER_HOST": f"unix://{top}/no-docker.sock"})
    return out


def report_json(results: Path) -> dict:
    return json.loads(dlbench("report", "--results", results, "--format", "json", check=True).stdout)


def cells(document: dict) -> dict:
    return {(c["images_of"], c["model_of"]): c for c in document["transfer"]}


def test_each_run_keeps_its_fgsm_images_at_the_middle_epsilon(results, data_root):
    rows = store.load(results).set_index("framework")
    assert (rows["status"] == "ok").all(), rows["error"]
    images, labels = formats.test_split("mnist", str(data_root))
    for name in ("softmax", "softmaxb", "softmaxc"):
        path = store.transfer_path(results, rows.loc[name, "run_id"])
        assert path == results / "transfer" / f"{rows.loc[name, 'run_id']}.npz"
        found = transfer.load(path, "mnist")
        assert found.epsilon == 0.1 and found.images.shape == (100, 28, 28)
        assert (found.labels == labels[:100]).all()
        # FGSM moves each pixel by epsilon (or to an edge of [0, 1]), never by more
        moved = np.abs(found.images - images[:100] / np.float32(255.0))
        assert moved.max() <= 0.1 + 1e-6 and np.isclose(moved, 0.1, atol=1e-6).mean() > 0.5
        assert path.stat().st_size < 100_000           # quick: 100 images, ~40 KB
    assert not store.transfer_path(results, rows.loc["softmaxd", "run_id"]).exists()
    assert sorted(p.name for p in (results / "transfer").iterdir()) == sorted(
        f"{rows.loc[n, 'run_id']}.npz" for n in ("softmax", "softmaxb", "softmaxc"))   # no temporary file


def test_the_report_tries_every_runs_images_on_every_model(results):
    rows = store.load(results).set_index("framework")
    robust = store.load_robustness(results)
    found = cells(report_json(results))
    assert len(found) == 16
    for name in ("softmax", "softmaxb"):
        own = robust[(robust["run_id"] == rows.loc[name, "run_id"]) & (robust["attack"] == "fgsm")
                     & (robust["epsilon"] == 0.1)]["accuracy"].item()
        cell = found[name, name]
        # the diagonal: a model on its own white-box images is its own FGSM accuracy
        assert cell["own_fgsm_accuracy"] == own and cell["accuracy"] == pytest.approx(own, abs=0.011)
        assert cell["images_run_id"] == cell["model_run_id"] == rows.loc[name, "run_id"]
    # one cell recomputed by hand from the stored files with onnxruntime
    with np.load(store.transfer_path(results, rows.loc["softmax", "run_id"])) as arrays:
        pixels, labels = arrays["images"], arrays["labels"]
    session = onnxruntime.InferenceSession(str(store.model_path(results, rows.loc["softmaxb", "run_id"])),
                                           providers=["CPUExecutionProvider"])
    expected = float(np.mean(session.run(None, {"pixels": pixels})[0].argmax(1) == labels))
    assert found["softmax", "softmaxb"]["accuracy"] == expected
    # the other model is hurt less by images it was not attacked with
    assert found["softmax", "softmaxb"]["accuracy"] > found["softmaxb", "softmaxb"]["accuracy"]
    assert found["softmaxc", "softmax"]["accuracy"] is not None        # its images, others' models


def test_a_run_without_a_model_or_without_images_leaves_empty_cells_with_the_reason(results):
    found = cells(report_json(results))
    for name in FRAMEWORKS:
        model = found[name, "softmaxc"]
        assert model["accuracy"] is None
        assert model["reason"] == ("no FGSM images: no attack (robust_images=0, or a run before the "
                                   "robustness check)" if name == "softmaxd" else
                                   "no ONNX model: numpy has no ONNX exporter")
        images = found["softmaxd", name]
        assert images["accuracy"] is None and images["reason"].startswith("no FGSM images: no attack")
    assert found["softmax", "softmaxd"]["accuracy"] is not None


def test_the_matrix_in_every_format(results, tmp_path):
    text = dlbench("report", "--results", results, "--format", "md", check=True).stdout
    assert "### Transfer attacks on mnist, quick profile" in text
    table = dlbench("report", "--results", results, check=True, env={"COLUMNS": "200"}).stdout
    assert "Transfer attacks on mnist" in table
    dlbench("report", "--results", results, "--html", tmp_path / "page", check=True)
    page = (tmp_path / "page" / "index.html").read_text()
    assert "Transfer attacks: mnist, quick profile" in page and '"type":"heatmap"' in page.replace(" ", "")


def test_a_hostile_stored_file_is_a_reason_in_its_row(results, tmp_path):
    """The results directory is untrusted too: a stored file that is not FGSM images gives
    its row the reason, never a failed report."""
    copy = tmp_path / "results"
    shutil.copytree(results, copy)
    run_id = store.load(copy).set_index("framework").loc["softmax", "run_id"]
    store.transfer_path(copy, run_id).write_bytes(b"PK\x03\x04 not a zip")
    found = cells(report_json(copy))
    assert found["softmax", "softmaxb"]["reason"] == "transfer.npz is invalid: File is not a zip file"
    assert found["softmaxb", "softmax"]["accuracy"] is not None        # its model still works


def npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


GOOD = dict(images=np.full((5, 28, 28), 0.5, np.float32), labels=np.arange(5, dtype=np.uint8),
            epsilon=np.float64(0.1))


@pytest.mark.parametrize("data, reason", [
    (b"garbage", "transfer.npz is invalid: File is not a zip file"),
    (npz(**GOOD, extra=np.zeros(1)), "transfer.npz is invalid: it holds epsilon.npy, extra.npy, images.npy, labels.npy"),
    (npz(**dict(GOOD, labels=np.array([object()] * 5))), "transfer.npz is invalid: Object arrays cannot be loaded"),
    (npz(**dict(GOOD, labels=np.full(5, 10))), "transfer.npz is invalid: labels must be one class of 0 to 9"),
    (npz(**dict(GOOD, labels=np.arange(4))), "transfer.npz is invalid: labels must be one class of 0 to 9"),
    (npz(**dict(GOOD, images=np.full((5, 28, 28), 1.5, np.float32))), "transfer.npz is invalid: pixels must be in [0, 1]"),
    (npz(**dict(GOOD, images=np.full((5, 28, 28), np.nan, np.float32))), "transfer.npz is invalid: pixels must be in [0, 1]"),
    (npz(**dict(GOOD, images=np.zeros((5, 3, 32, 32), np.float32))), "transfer.npz is invalid: images must be 1 to 10000 float32 images of 28x28, not float32 5x3x32x32"),
    (npz(**dict(GOOD, images=np.zeros((5, 28, 28)))), "transfer.npz is invalid: images must be 1 to 10000 float32 images of 28x28, not float64"),
    (npz(**dict(GOOD, epsilon=np.float64(2.0))), "transfer.npz is invalid: epsilon must be one number in [0, 1]"),
    # zeros compress ~1000 to 1: 20,000 images inflate to 63 MB from a file of 60 KB
    (npz(**dict(GOOD, images=np.zeros((20000, 28, 28), np.float32), labels=np.zeros(20000, np.uint8))),
     "transfer.npz unpacks to 62740392 bytes, more than 31443080"),
])
def test_hostile_transfer_files_are_refused_with_a_reason(data, reason):
    assert transfer.read(npz(**GOOD), "mnist").images.shape == (5, 28, 28)
    with pytest.raises(Refused) as caught:
        transfer.read(data, "mnist")
    assert str(caught.value).startswith(reason), str(caught.value)


def test_the_host_takes_no_link_and_no_file_past_the_cap(tmp_path, monkeypatch):
    out = tmp_path / "job" / "out"
    out.mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.write_bytes(npz(**GOOD))
    assert transfer.taken(tmp_path / "job", "mnist") == (None, None)      # none left
    (out / "transfer.npz").symlink_to(secret)
    assert transfer.taken(tmp_path / "job", "mnist")[0] is None
    assert transfer.taken(tmp_path / "job", "mnist") == (None, "transfer.npz is not a regular file "
                                                              "(a symbolic link)")
    (out / "transfer.npz").unlink()
    (out / "transfer.npz").write_bytes(npz(**GOOD))
    assert transfer.taken(tmp_path / "job", "mnist")[0] == npz(**GOOD)
    assert transfer.taken(tmp_path / "job", "mnist") == (npz(**GOOD), None)
    monkeypatch.setattr(transfer, "MAX_TRANSFER_BYTES", len(npz(**GOOD)) - 1)
    assert transfer.taken(tmp_path / "job", "mnist")[0] is None
    _, why = transfer.taken(tmp_path / "job", "mnist")
    assert why == f"transfer.npz is {len(npz(**GOOD))} bytes (limit {len(npz(**GOOD)) - 1})"


class Linear:
    """A linear model of 4 pixels with three logits, 0, the pixels' dot product with
    ``direction`` and 0: the soft margin of labels 0 and 2 grows along ``direction``,
    that of label 1 against it."""

    direction = np.array([[1.0, -1.0], [0.5, -2.0]])

    def logits(self, pixels):
        score = (np.asarray(pixels, np.float64) * self.direction).reshape(len(pixels), -1).sum(1)
        return np.stack([np.zeros_like(score), score, np.zeros_like(score)], axis=1)

    def input_vjp(self, pixels, output_gradient):
        g = output_gradient(self.logits(pixels))
        return (g[:, 1, None, None] * self.direction).astype(pixels.dtype), np.zeros(len(pixels), int)

    def predict(self, pixels):
        return (pixels.reshape(len(pixels), -1).sum(1) > 1.2).astype(int)


def test_the_runner_keeps_fgsm_images_from_a_checked_gradient_only(tmp_path):
    images, labels = np.full((3, 2, 2), 128, np.uint8), np.array([0, 1, 2])
    hp = {"robust_images": 3, "epsilons": "0.05,0.1", "pgd_epsilon": "0.1"}
    path = str(tmp_path / "transfer.npz")
    check = robustness.gradient_check(Linear(), images, labels)
    assert check["relative_error"] < 1e-6
    robustness.attack(Linear(), images, labels, hp, 1, lambda: 0.0, check, path)
    with np.load(path, allow_pickle=False) as arrays:
        x = images / np.float32(255.0)
        assert arrays["images"].dtype == np.float32 and float(arrays["epsilon"]) == 0.1
        along = np.array([1, -1, 1], np.float32)[:, None, None] * np.sign(Linear.direction).astype(np.float32)
        assert np.array_equal(arrays["images"], np.clip(x + np.float32(0.1) * along, 0, 1))
        assert list(arrays["labels"]) == [0, 1, 2]
    failed = dict(check, relative_error=1.0)
    (tmp_path / "transfer.npz").unlink()
    rows = robustness.attack(Linear(), images, labels, hp, 1, lambda: 0.0, failed, path)
    assert all(r["reason"] for r in rows) and not (tmp_path / "transfer.npz").exists()
    robustness.attack(Linear(), images, labels, hp, 1, lambda: 0.0, None, path)     # no check made
    assert not (tmp_path / "transfer.npz").exists()
