"""The job spec and the model catalogue a framework directory declares.

A framework directory holds ``adapter.py`` (the models, in code) and
``models.json`` (what the models are and their default hyper-parameters, as
data).  The host reads the same ``models.json`` to plan jobs, so the defaults
live in one place.
"""

import json
import math
import os

PROFILES = ("paper", "quick")

# Bounds every model's hyper-parameters keep, checked here so that the host (which
# plans with these functions) and the runner refuse the same values: every number
# is finite and 0 or more, an integer fits the 32-bit integers frameworks take,
# learning rates are more than 0, and the length of training and batch sizes are
# at least 1 (a batch at most MAX_BATCH_SIZE images, more than either data set holds).
MAX_INT = 2**31 - 1
MAX_BATCH_SIZE = 65536
POSITIVE = ("learning_rate", "learning_rate_lr1")
AT_LEAST_ONE = ("epochs", "max_iter", "max_steps", "batch_size", "test_batch_size")
BATCH_SIZES = ("batch_size", "test_batch_size")
# Seeds: what every framework's seeding takes (numpy's RandomState, torch, TensorFlow).
MAX_SEED = MAX_INT


class SpecError(Exception):
    """A job spec that cannot be run; the message says why."""


def load_catalog(framework_dir):
    with open(os.path.join(framework_dir, "models.json")) as f:
        return json.load(f)


def resolve_hyperparameters(catalog, dataset, profile, overrides=None):
    """The paper defaults, then the profile's changes, then the user's overrides."""
    models = catalog["models"]
    if dataset not in models:
        raise SpecError("%s has no model for data set %r (it has: %s)"
                        % (catalog["framework"], dataset, ", ".join(sorted(models))))
    entry = models[dataset]
    if profile not in PROFILES:
        raise SpecError("unknown profile %r (choose from %s)" % (profile, ", ".join(PROFILES)))
    params = dict(entry["hyperparameters"])
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


def check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise SpecError("seed %r: a seed is a whole number from 0 to %d" % (seed, MAX_SEED))
    return seed


def complete(spec, catalog):
    """Fill the spec's derived fields (model name, resolved hyper-parameters)."""
    spec = dict(spec)
    for key in ("framework", "dataset"):
        if not spec.get(key):
            raise SpecError("job spec lacks %r" % key)
    if spec["framework"] != catalog["framework"]:
        raise SpecError("job is for %s but this runner holds %s"
                        % (spec["framework"], catalog["framework"]))
    spec.setdefault("profile", "paper")
    spec.setdefault("overrides", {})
    spec.setdefault("threads", None)
    spec.setdefault("device", "cpu")
    spec.setdefault("seed", 1)
    check_seed(spec["seed"])
    spec["hyperparameters"] = resolve_hyperparameters(
        catalog, spec["dataset"], spec["profile"], spec["overrides"])
    spec["model"] = catalog["models"][spec["dataset"]]["model"]
    return spec
