"""The jax image end to end: JAX with Flax and Optax training Flax's own MNIST example (and
its CNN on CIFAR-10: Flax's CIFAR-10 example is a Wide ResNet of 200 epochs) through the
CLI on the real data sets, its step compiled ahead by XLA, with every check after training.
Its fair networks are held to the NumPy reference with the other frameworks'
(``test_fair.py``)."""

from __future__ import annotations

import pandas as pd
import pytest

from conftest import assert_migration, assert_model_size, assert_robustness

FRAMEWORK = "jax"
# Flax's examples/mnist CNN: conv 1->32 3x3 (288+32), conv 32->64 3x3 (18432+64),
# dense 3136->256 (802816+256), dense 256->10 (2560+10)
MNIST_PARAMS = 320 + 18496 + 803072 + 2570
# the same CNN on 3 channels: conv 3->32 (864+32), dense 4096->256 (1048576+256)
CIFAR_PARAMS = 896 + 18496 + 1048832 + 2570


@pytest.mark.docker
@pytest.mark.training
def test_jax_trains_flax_s_own_example_on_both_data_sets(quick_run):
    results = quick_run(FRAMEWORK)
    rows = pd.read_parquet(results / "runs").set_index("dataset")
    for dataset, model, params, at_least in (("mnist", "flax-examples-mnist", MNIST_PARAMS, 0.90),
                                            ("cifar10", "flax-examples-mnist-cnn", CIFAR_PARAMS, 0.35)):
        row = rows.loc[dataset]
        assert row.status == "ok", row.error
        assert row.model == model and row.param_count == params
        assert row.framework_version == "0.10.2" and row.image.startswith("dlbench/jax:cpu")
        assert row.accuracy >= at_least, (dataset, row.accuracy)
        # XLA compiles the step in setup, in a fraction of a second or a few seconds
        assert 0 < row.compile_time_s < row.setup_time_s, (row.compile_time_s, row.setup_time_s)
        assert_model_size(row)
        assert_robustness(results, row)
        assert_migration(results, row)
    # the quick profile: one epoch over the first 12,000 MNIST images, all 50,000 CIFAR-10's
    # (each less the incomplete last batch, which the example skips)
    assert rows.loc["mnist"].train_samples == 12000 and rows.loc["cifar10"].train_samples == 50000
