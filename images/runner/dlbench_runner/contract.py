"""What the host knows of the runner: the one module of this package the host imports.

Standard library only and Python 3.9, like the rest of the runner.  The host
plans jobs with the same profiles, hyper-parameter resolution and thread
variables the runner uses, reads the runner's tagged event lines and its
versioned result record, and verifies data sets with the runner's own file
format readers (``formats``).
"""

import json
import math
import os
import platform

from . import data as formats

# Version of the result record this runner writes.  History:
#   1  first version: timings, accuracy, per-epoch curves, provenance.
SCHEMA_VERSION = 1

# One machine-readable line on stdout per event, at the start of a fresh line.
EVENT_TAG = ":::DLBENCH "

# Thread variables every BLAS and OpenMP runtime honours; a job's thread count sets them.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

PROFILES = ("paper", "quick")

# Bounds every model's hyper-parameters keep, checked here so that the host (which
# plans with these functions) and the runner refuse the same values: every number
# is finite and 0 or more, an integer fits the 32-bit integers frameworks take,
# learning rates are more than 0, and the length of training, batch sizes and the
# batches of a test pass (``test_iter``) are at least 1 (a batch at most
# MAX_BATCH_SIZE images, more than either data set holds); a named choice is one of
# its values (``dtype``: the floating-point type a model computes in).
MAX_INT = 2**31 - 1
MAX_BATCH_SIZE = 65536
POSITIVE = ("learning_rate", "learning_rate_lr1")
AT_LEAST_ONE = ("epochs", "max_iter", "max_steps", "batch_size", "test_batch_size", "test_iter")
BATCH_SIZES = ("batch_size", "test_batch_size")
CHOICES = {"dtype": ("float64", "float32")}
# Seeds: what every framework's seeding takes (numpy's RandomState, torch, TensorFlow).
MAX_SEED = MAX_INT

__all__ = ["SCHEMA_VERSION", "EVENT_TAG", "THREAD_VARIABLES", "PROFILES", "SpecError",
           "load_catalog", "resolve_hyperparameters", "check_value", "check_seed", "default_seed", "MAX_SEED",
           "formats", "cpu_model", "gpu_index"]


class SpecError(Exception):
    """A job spec that cannot be run; the message says why."""


def load_catalog(framework_dir):
    """A framework directory's ``models.json``: its models and their default hyper-parameters."""
    with open(os.path.join(framework_dir, "models.json")) as f:
        return json.load(f)


def resolve_hyperparameters(catalog, dataset, profile, overrides=None, device="cpu"):
    """The paper defaults (with the model's ``gpu_hyperparameters`` on top for a job on a
    GPU: what the original ran there, e.g. Theano's float32), then the profile's changes,
    then the user's overrides."""
    models = catalog["models"]
    if dataset not in models:
        raise SpecError("%s has no model for data set %r (it has: %s)"
                        % (catalog["framework"], dataset, ", ".join(sorted(models))))
    entry = models[dataset]
    if profile not in PROFILES:
        raise SpecError("unknown profile %r (choose from %s)" % (profile, ", ".join(PROFILES)))
    params = dict(entry["hyperparameters"])
    if gpu_index(device) is not None:
        params.update(entry.get("gpu_hyperparameters", {}))
    params.update(entry.get("profiles", {}).get(profile, {}))
    for key, value in (overrides or {}).items():
        if key not in params:
            raise SpecError("%s/%s has no hyper-parameter %r (it has: %s)"
                            % (catalog["framework"], dataset, key, ", ".join(sorted(params))))
        params[key] = _coerce(key, value, params[key])
    for key, value in params.items():
        check_value(key, value)
    return params


def _coerce(key, value, default):
    """An override takes the type of the default it replaces (an int may stand for a float)."""
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise SpecError("hyper-parameter %r must be a finite number, not %d digits"
                            % (key, len(str(value))))
    if type(value) is not type(default):
        raise SpecError("hyper-parameter %r must be %s, not %r" % (key, type(default).__name__, value))
    return value


def check_value(key, value):
    """Refuse a hyper-parameter outside the bounds above; the message names it."""
    if key in CHOICES and value not in CHOICES[key]:
        raise SpecError("hyper-parameter %r must be one of %s, not %r"
                        % (key, ", ".join(CHOICES[key]), value))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError("hyper-parameter %r must be a finite number, not %r" % (key, value))
    if key in POSITIVE and not value > 0:
        raise SpecError("hyper-parameter %r must be more than 0, not %r" % (key, value))
    if key in AT_LEAST_ONE and value < 1:
        raise SpecError("hyper-parameter %r must be at least 1, not %r" % (key, value))
    if value < 0:
        raise SpecError("hyper-parameter %r must be 0 or more, not %r" % (key, value))
    if key in BATCH_SIZES and value > MAX_BATCH_SIZE:
        raise SpecError("hyper-parameter %r must be at most %d, not %r" % (key, MAX_BATCH_SIZE, value))
    if isinstance(value, int) and value > MAX_INT:
        raise SpecError("hyper-parameter %r must be at most %d, not %r" % (key, MAX_INT, value))


def gpu_index(device):
    """The GPU a job's device names: None for ``cpu``, N for ``cuda:N``, 0 for ``cuda``.
    Every adapter selects its GPU by this number, so the forms are parsed here alone."""
    if device == "cpu":
        return None
    kind, colon, index = str(device).partition(":")
    if kind != "cuda" or (colon and not (index.isascii() and index.isdigit())):
        raise SpecError("device %r: use cpu, cuda or cuda:N" % (device,))
    return int(index or 0)


def default_seed(catalog, dataset):
    """The seed a model's first run takes when none is given: the original's where
    models.json names it (``seed``), else 1."""
    return catalog["models"].get(dataset, {}).get("seed", 1)


def check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise SpecError("seed %r: a seed is a whole number from 0 to %d" % (seed, MAX_SEED))
    return seed


def cpu_model():
    """The CPU's model name, read alike for the runner's ``cpu_model`` and the host's row."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
