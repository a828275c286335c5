"""The pytorch2 image end to end: current PyTorch (Debian trixie's CPU build) training
PyTorch's own example models, the MNIST example's network and the CIFAR-10 tutorial's, through
the CLI on the real data sets, eager and compiled (``--set compile=true``); with every check
after training.  Its fair networks are held to the NumPy reference with the study's
frameworks' (``test_fair.py``)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from conftest import assert_migration, assert_model_size, assert_robustness, dlbench

FRAMEWORK = "pytorch2"
# pytorch/examples mnist/main.py's Net: conv 1->32 3x3 (288+32), conv 32->64 3x3
# (18432+64), fc 9216->128 (1179648+128), fc 128->10 (1280+10)
MNIST_PARAMS = 320 + 18496 + 1179776 + 1290
# the CIFAR-10 tutorial's Net: conv 3->6 5x5 (450+6), conv 6->16 5x5 (2400+16),
# fc 400->120 (48000+120), fc 120->84 (10080+84), fc 84->10 (840+10)
CIFAR_PARAMS = 456 + 2416 + 48120 + 10164 + 850


@pytest.mark.docker
@pytest.mark.training
def test_current_pytorch_trains_its_own_examples_on_both_data_sets(quick_run):
    results = quick_run(FRAMEWORK)
    rows = pd.read_parquet(results / "runs").set_index("dataset")
    for dataset, model, params, at_least in (("mnist", "pytorch-examples-mnist", MNIST_PARAMS, 0.93),
                                            ("cifar10", "pytorch-cifar10-tutorial", CIFAR_PARAMS, 0.35)):
        row = rows.loc[dataset]
        assert row.status == "ok", row.error
        assert row.model == model and row.param_count == params
        assert row.framework_version.startswith("2.") and row.image.startswith("dlbench/pytorch2:cpu")
        assert row.accuracy >= at_least, (dataset, row.accuracy)
        assert pd.isna(row.compile_time_s)          # eager: nothing compiled ahead
        assert_model_size(row)
        assert_robustness(results, row)
        assert_migration(results, row)
    # the quick profile: one epoch over the first 12,000 MNIST images, all 50,000 CIFAR-10's
    assert rows.loc["mnist"].train_samples == 12000 and rows.loc["cifar10"].train_samples == 50000


@pytest.mark.docker
@pytest.mark.training
def test_a_compiled_training_step_is_compiled_in_setup_and_its_time_stored_apart(build_image, data_root,
                                                                                tmp_path):
    """torch.compile compiles at the step's first call: setup makes that call (on the full
    batch and on the epoch's last, smaller one), so ``compile_time_s`` holds the compilation,
    as part of ``setup_time_s``, and training starts with the step compiled."""
    build_image(FRAMEWORK)
    dlbench("run", "--frameworks", FRAMEWORK, "--datasets", "mnist", "--profile", "quick",
            "--set", "compile=true", "--set", "train_subset=1000", "--set", "robust_images=20",
            "--results", tmp_path, "--data-dir", data_root, check=True)
    row = pd.read_parquet(tmp_path / "runs").iloc[0]
    assert row.status == "ok", row.error
    assert '"compile":true' in row.hyperparameters
    # Inductor generating and building C++ kernels takes seconds; an eager pass of one batch
    # takes milliseconds
    assert 1.0 < row.compile_time_s < row.setup_time_s, (row.compile_time_s, row.setup_time_s)
    assert math.isfinite(row.train_time_s) and row.accuracy > 0.5
    assert_migration(tmp_path, row)             # the eager model, exported as always
