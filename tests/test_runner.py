"""The stand-alone runner on the host, with a small real numpy adapter and the real MNIST."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlbench_runner import robustness, spec as specs
from dlbench_runner.contract import EVENT_TAG, SCHEMA_VERSION, gpu_index
from orchestrator.records import RunnerResult

FIXTURE = Path(__file__).parent / "fixtures" / "numpy_softmax"


def run_runner(data_root, out, *args, env=None):
    return subprocess.run([sys.executable, "-m", "dlbench_runner", "--framework-dir", str(FIXTURE),
                           "--data", str(data_root), "--out", str(out), "--dataset", "mnist", *args],
                          capture_output=True, text=True, timeout=600,
                          env=None if env is None else {**os.environ, **env})


def events(stdout):
    return [json.loads(line[len(EVENT_TAG):]) for line in stdout.splitlines() if line.startswith(EVENT_TAG)]


def test_runner_trains_and_writes_a_valid_result(data_root, tmp_path):
    proc = run_runner(data_root, tmp_path, "--profile", "quick", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    RunnerResult.model_validate(result)
    assert result["schema_version"] == SCHEMA_VERSION
    assert result["status"] == "ok"
    assert result["accuracy"] > 0.85           # softmax regression, one epoch
    assert result["train_samples"] == 60000 and result["test_samples"] == 10000
    assert result["param_count"] == 784 * 10
    assert result["param_bytes"] == 784 * 10 * 8                 # float64
    assert result["param_bytes"] < result["model_size_bytes"] < result["param_bytes"] + 1024  # .npy header
    assert len(result["epochs"]) == 1
    for key in ("setup_time_s", "train_time_s", "test_time_s"):
        assert 0 < result[key] < result["total_time_s"]
    assert result["train_images_per_s"] == pytest.approx(60000 / result["train_time_s"])
    assert result["threads"]["env"]["OMP_NUM_THREADS"] == "1"
    kinds = [e["event"] for e in events(proc.stdout)]
    assert kinds[0] == "phase" and kinds[-1] == "done" and "epoch" in kinds


def test_omp_threads_sets_openmp_s_threads_apart_from_the_blas_libraries(data_root, tmp_path):
    """``--set omp_threads=1`` on a job of two threads: OpenMP gets one, every BLAS library's
    variable keeps the job's two, and the setting is recorded with the others."""
    proc = run_runner(data_root, tmp_path, "--profile", "quick", "--threads", "2",
                      "--set", "omp_threads=1")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["threads"]["env"] == {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "2",
                                        "MKL_NUM_THREADS": "2", "BLIS_NUM_THREADS": "2"}
    assert result["hyperparameters"]["omp_threads"] == 1


def test_every_span_waits_for_the_work_queued_on_an_asynchronous_device(data_root, tmp_path):
    """The runner reads its clock through ctx.now(), which first calls the adapter's
    synchronize(): work a framework queued on its device and has not finished is
    inside the span it was queued in (the fixture's device takes 1.5 s a launch)."""
    proc = run_runner(data_root, tmp_path, "--profile", "quick", "--threads", "1",
                      "--set", "device_lag_s=1.5")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["epochs"][0]["time_s"] >= 1.5
    assert result["train_time_s"] >= 1.5 and result["test_time_s"] >= 1.5


def test_runner_failure_is_a_result_not_a_crash(data_root, tmp_path):
    proc = run_runner(data_root, tmp_path, "--profile", "quick", "--set", "fail_in=train")
    assert proc.returncode == 1
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "failed"
    assert "during train" in result["error"] and "asked to fail" in result["error"]
    assert result["setup_time_s"] > 0 and "train_time_s" not in result


@pytest.mark.parametrize("fail", [False, True])
def test_the_model_is_saved_after_the_timed_spans_into_a_folder_then_removed(data_root, tmp_path, fail):
    """The save comes after the test pass, into a scratch folder of the temporary
    directory that is gone afterwards; a save that fails fails the job, its spans kept.
    So does the ONNX export's scratch folder: only the model is copied to /out."""
    scratch, out = tmp_path / "tmp", tmp_path / "out"
    scratch.mkdir(), out.mkdir()
    proc = run_runner(data_root, out, "--profile", "quick", "--set", f"fail_in={'save' if fail else ''}",
                      env={"TMPDIR": str(scratch)})
    result = json.loads((out / "result.json").read_text())
    phases = [e["phase"] for e in events(proc.stdout) if e["event"] == "phase"]
    assert phases == ["setup", "train", "test", "save"] + ([] if fail else ["robustness", "migration"])
    assert list(scratch.iterdir()) == []
    assert sorted(p.name for p in out.iterdir()) == (["result.json"] if fail else
                                                     ["migration.npz", "model.onnx", "result.json", "transfer.npz"])
    assert result["test_time_s"] > 0
    if fail:
        assert proc.returncode == 1 and result["status"] == "failed"
        assert "during save" in result["error"] and "model_size_bytes" not in result
    else:
        assert proc.returncode == 0 and result["model_size_bytes"] > result["param_bytes"]


def test_runner_rejects_an_unknown_hyperparameter(data_root, tmp_path):
    proc = run_runner(data_root, tmp_path, "--set", "momentum=0.9")
    assert proc.returncode == 2
    assert "no hyper-parameter 'momentum'" in proc.stderr
    assert not (tmp_path / "result.json").exists()


def test_the_device_is_read_once_by_the_contract_and_a_bad_one_refused(data_root, tmp_path):
    assert [gpu_index(d) for d in ("cpu", "cuda", "cuda:0", "cuda:3")] == [None, 0, 0, 3]
    for device in ("tpu", "cuda:", "cuda:x", "cuda0", "cuda:-1", "cuda:\u0661", "", None):
        with pytest.raises(specs.SpecError, match="use cpu, cuda or cuda:N"):
            gpu_index(device)
    proc = run_runner(data_root, tmp_path, "--device", "cuda:x")
    assert proc.returncode == 2
    assert "device 'cuda:x': use cpu, cuda or cuda:N" in proc.stderr
    assert not (tmp_path / "result.json").exists()


def test_profiles_and_overrides_resolve_in_order():
    catalog = specs.load_catalog(str(FIXTURE))
    assert specs.resolve_hyperparameters(catalog, "mnist", "paper")["epochs"] == 2
    assert specs.resolve_hyperparameters(catalog, "mnist", "quick")["epochs"] == 1
    params = specs.resolve_hyperparameters(catalog, "mnist", "quick", {"epochs": 3, "learning_rate": 1})
    assert params["epochs"] == 3 and params["learning_rate"] == 1.0
    assert isinstance(params["learning_rate"], float)


@pytest.mark.parametrize("overrides, message", [
    ({"epochs": 1.5}, "must be int"),
    ({"learning_rate": "fast"}, "must be float"),
    ({"nope": 1}, "no hyper-parameter"),
])
def test_bad_overrides_are_refused(overrides, message):
    catalog = specs.load_catalog(str(FIXTURE))
    with pytest.raises(specs.SpecError, match=message):
        specs.resolve_hyperparameters(catalog, "mnist", "paper", overrides)


def test_unknown_dataset_and_profile_are_refused():
    catalog = specs.load_catalog(str(FIXTURE))
    with pytest.raises(specs.SpecError, match="no model for data set 'cifar10'"):
        specs.resolve_hyperparameters(catalog, "cifar10", "paper")
    with pytest.raises(specs.SpecError, match="unknown profile"):
        specs.resolve_hyperparameters(catalog, "mnist", "fast")


def test_an_epochs_time_leaves_out_the_work_its_adapter_excluded(monkeypatch):
    """Work an adapter keeps out of training (``train_excluded_s``) in the middle of an
    epoch, as Caffe's solver tests mid-epoch, is kept out of that epoch's time_s too."""
    from types import SimpleNamespace

    from dlbench_runner import runner
    now = [100.0]
    monkeypatch.setattr(runner, "time", SimpleNamespace(perf_counter=lambda: now[0],
                                                        monotonic=lambda: now[0]))
    ctx = runner.Context({"hyperparameters": {}, "dataset": "mnist", "device": "cpu", "seed": 1,
                          "threads": None}, None)
    ctx.epoch_start()
    now[0] += 5.0
    ctx.train_excluded_s += 2.0         # a test pass of 2 s inside epoch 1
    now[0] += 4.0
    ctx.epoch_done(1, 0.5, 0.9)
    ctx.epoch_start()
    now[0] += 3.0
    ctx.epoch_done(2, 0.4, 0.95)
    assert [e["time_s"] for e in ctx.epochs] == [7.0, 3.0]


def test_the_runner_attacks_the_trained_model_with_the_adapters_gradient(data_root, tmp_path):
    """The fixture's softmax regression gives its gradient by hand: FGSM's accuracy falls as
    epsilon grows, PGD's is at most FGSM's at its epsilon, neither above the clean accuracy,
    and the gradient matches finite differences of the loss."""
    proc = run_runner(data_root, tmp_path, "--profile", "quick", "--set", "robust_images=300",
                      "--set", "epsilons=0.02,0.05,0.1", "--set", "pgd_epsilon=0.05")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    RunnerResult.model_validate(result)
    rows = {(r["attack"], r["epsilon"]): r for r in result["robustness"]}
    assert list(rows) == [("none", 0.0), ("fgsm", 0.02), ("fgsm", 0.05), ("fgsm", 0.1), ("pgd", 0.05)]
    assert all(r["images"] == 300 and r["time_s"] > 0 and r["reason"] is None for r in rows.values())
    assert all(r["attack_loss"] == robustness.ATTACK_LOSS and r["vanished_gradients"] == 0
               for key, r in rows.items() if key[0] != "none")
    clean = rows["none", 0.0]["accuracy"]
    fgsm = [rows["fgsm", e]["accuracy"] for e in (0.02, 0.05, 0.1)]
    assert clean > 0.8 and fgsm == sorted(fgsm, reverse=True) and fgsm[-1] < clean - 0.3
    assert rows["pgd", 0.05]["accuracy"] <= rows["fgsm", 0.05]["accuracy"] and rows["pgd", 0.05]["steps"] == 10
    check = result["gradient_check"]
    assert len(check["pixels"]) == robustness.CHECK_PIXELS and max(check["errors"]) < 1e-4
    assert "robustness" in [e["phase"] for e in events(proc.stdout) if e["event"] == "phase"]
    (tmp_path / "off").mkdir()
    again = run_runner(data_root, tmp_path / "off", "--profile", "quick", "--set", "robust_images=0")
    off = json.loads((tmp_path / "off" / "result.json").read_text())
    assert again.returncode == 0 and "robustness" not in off and "gradient_check" not in off


class OneScore:
    """A two-class model whose second logit is a function ``f`` of each image's pixels and
    whose first is 0: at label 0 its soft margin is ``f``, so that a test states the
    function the gradient check differentiates.  ``df`` gives the gradient its
    ``input_vjp`` back-propagates (right or wrong, as the test wants)."""

    def f(self, pixels):
        raise NotImplementedError

    def df(self, pixels):
        raise NotImplementedError

    def logits(self, pixels):
        import numpy as np
        value = np.array([self.f(image) for image in np.asarray(pixels, dtype=np.float64)])
        return np.stack([np.zeros(len(value)), value], axis=1)

    def input_vjp(self, pixels, output_gradient):
        import numpy as np
        g = output_gradient(self.logits(pixels))
        gradient = np.stack([g[i, 1] * self.df(image) for i, image in enumerate(pixels)])
        return gradient, np.zeros(len(pixels), int)

    def predict(self, pixels):
        import numpy as np
        return np.zeros(len(pixels), int)


def test_an_adapter_without_a_gradient_for_its_model_gets_reasons_and_no_check():
    """NoInputGradient from the adapter (Lua Torch7's harness, where it cannot rebuild the
    script's preprocessing): every row holds the reason and no accuracy, and the gradient
    check is skipped instead of failing the job."""
    import numpy as np

    from dlbench_runner import robustness

    class Unavailable:
        def unavailable(self, *args):
            raise robustness.NoInputGradient("no preprocessing")

        input_vjp = logits = predict = unavailable

    images, labels = np.zeros((3, 2, 2), np.uint8), np.zeros(3, int)
    hp = {"robust_images": 3, "epsilons": "0.1", "pgd_epsilon": "0.1"}
    rows = robustness.attack(Unavailable(), images, labels, hp, 1, lambda: 0.0)
    assert [r["attack"] for r in rows] == ["none", "fgsm", "pgd"]
    assert all(r["accuracy"] is None and r["reason"] == "no preprocessing"
               and r["attack_loss"] is None and r["vanished_gradients"] is None for r in rows)
    assert robustness.gradient_check(Unavailable(), images, labels) is None


def test_a_gradient_that_fails_its_check_attacks_nothing():
    """A wrong input gradient (off from its finite differences by more than the tolerance)
    gives rows with the reason and no accuracy: never a number from a wrong gradient."""
    import numpy as np

    from dlbench_runner import robustness

    class Wrong(OneScore):
        """The soft margin is the pixels' sum; the gradient says minus one everywhere."""
        def f(self, pixels):
            return float(np.sum(pixels))

        def df(self, pixels):
            return -np.ones_like(pixels)

    images, labels = np.full((3, 2, 2), 128, np.uint8), np.zeros(3, int)
    check = robustness.gradient_check(Wrong(), images, labels)
    assert check["relative_error"] == pytest.approx(2.0) and check["errors"] == pytest.approx([2.0] * 4)
    assert check["confident"]["errors"] == pytest.approx([2.0] * 4)
    hp = {"robust_images": 3, "epsilons": "0.1", "pgd_epsilon": "0.1"}
    rows = robustness.attack(Wrong(), images, labels, hp, 1, lambda: 0.0, check)
    assert all(r["accuracy"] is None and r["reason"].startswith(
        "the input gradient failed its finite-difference check (relative error 2") for r in rows)
    unchecked = robustness.attack(Wrong(), images, labels, hp, 1, lambda: 0.0)
    assert unchecked[0]["accuracy"] == 1.0 and unchecked[0]["attack_loss"] is None
    assert [r["attack_loss"] for r in unchecked[1:]] == [robustness.ATTACK_LOSS] * 2
    assert [r["vanished_gradients"] for r in unchecked] == [None, 0, 0]


def test_the_gradient_check_of_an_image_of_black_and_white_only_checks_near_it():
    """No byte lies inside (0, 255): the check moves the image inside [0, 1] by less than
    ``CHECK_JITTER`` and checks there (a right gradient agrees, a wrong one does not), never
    a job that fails on the check."""
    import numpy as np

    from dlbench_runner import robustness

    class Square(OneScore):
        """The soft margin is the sum of the squared pixels; ``sign`` -1 gives a wrong gradient."""
        def __init__(self, sign):
            self.sign = sign
            self.seen = []

        def f(self, pixels):
            return float(np.sum(pixels ** 2))

        def df(self, pixels):
            self.seen.append(pixels)
            return self.sign * 2 * pixels

    images = np.tile(np.array([[0, 255], [255, 0]], np.uint8), (3, 1, 1))
    labels = np.zeros(3, int)
    right = Square(1)
    check = robustness.gradient_check(right, images, labels)
    assert len(check["pixels"]) == 2 and max(check["errors"]) < 1e-4, check     # the two near 1
    checked = right.seen[-1].reshape(-1)
    moved = np.abs(checked - images[check["confident"]["image"]].reshape(-1) / 255.0)
    assert (moved < robustness.CHECK_JITTER).all() and (moved > 0).all()
    assert ((checked > 0) & (checked < 1)).all()
    assert robustness.gradient_check(Square(-1), images, labels)["relative_error"] > 1


def test_the_gradient_check_steps_off_the_kinks_of_equal_bytes(monkeypatch):
    """Runs of equal bytes tie the maxima of pooling windows: at the tie a framework's
    gradient is one subgradient, which can lie outside both one-sided derivatives (here
    dM/dx1 = -1 where both are 0).  Checked at the bytes the right gradient would fail;
    the check moves off them and it agrees."""
    import numpy as np

    from dlbench_runner import robustness

    class Pooled(OneScore):
        """Per row of three pixels, max(x0, x1) - max(x1, x2), each window's gradient going
        to its first maximum."""
        def df(self, pixels):
            rows = pixels.reshape(-1, 3)
            gradient = np.zeros_like(rows)
            index = np.arange(len(rows))
            gradient[index, np.argmax(rows[:, [0, 1]], axis=1)] += 1
            gradient[index, 1 + np.argmax(rows[:, [1, 2]], axis=1)] -= 1
            return gradient.reshape(pixels.shape)

        def f(self, pixels):
            rows = np.asarray(pixels, dtype=np.float64).reshape(-1, 3)
            return float(np.sum(np.maximum(rows[:, 0], rows[:, 1]) - np.maximum(rows[:, 1], rows[:, 2])))

    images, labels = np.full((3, 2, 3), 128, np.uint8), np.zeros(3, int)
    assert robustness.gradient_check(Pooled(), images, labels)["relative_error"] < 1e-6
    monkeypatch.setattr(robustness, "CHECK_JITTER", 0.0)
    assert robustness.gradient_check(Pooled(), images, labels)["relative_error"] >= 1


def test_the_gradient_check_asks_for_the_logits_of_its_moved_images_in_batches():
    """An adapter whose every call crosses a process boundary (Lua Torch7's) is asked for
    the logits of the centre and every moved image of a checked image in one call: one
    call to choose the two images, then one per image checked (besides its input_vjp's)."""
    import numpy as np

    from dlbench_runner import robustness

    class Cubic(OneScore):
        """The soft margin is the sum of the pixels cubed; ``logits`` counts its calls."""
        calls = 0

        def f(self, pixels):
            return float(np.sum(pixels ** 3))

        def df(self, pixels):
            return 3 * pixels ** 2

        def logits(self, pixels):
            self.calls += 1
            return super().logits(pixels)

    images, labels = np.random.RandomState(3).randint(0, 256, (4, 6, 6)).astype(np.uint8), np.zeros(4, int)
    counted = Cubic()
    found = robustness.gradient_check(counted, images, labels)
    assert counted.calls == 1 + 2 * 2 and found["relative_error"] < 1e-6
    assert found["image"] != found["confident"]["image"]


def test_pgd_stays_in_its_epsilon_ball_and_in_valid_pixels():
    import numpy as np

    from dlbench_runner import robustness

    class Pushy:
        """A gradient that always points up: every step pushes each pixel up to its bound."""
        def input_vjp(self, pixels, output_gradient):
            return np.ones_like(pixels), np.zeros(len(pixels), int)

    x = np.array([[[0.0, 0.5, 0.99]]], np.float32)
    out, vanished = robustness.pgd(Pushy(), x, np.zeros(1, int), 0.1, 10, np.random.RandomState(1))
    assert np.allclose(out, [[[0.1, 0.6, 1.0]]]) and not vanished.any()
