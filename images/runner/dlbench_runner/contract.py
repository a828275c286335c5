"""What the host knows of the runner: the one module of this package the host imports.

Standard library only and Python 3.9, like the rest of the runner.  The host
plans jobs with the same profiles, hyper-parameter resolution and thread
variables the runner uses, reads the runner's tagged event lines and its
versioned result record, and verifies data sets with the runner's own file
format readers (``formats``).
"""

import json
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

__all__ = ["SCHEMA_VERSION", "EVENT_TAG", "THREAD_VARIABLES", "PROFILES", "SpecError",
           "load_catalog", "resolve_hyperparameters", "formats", "cpu_model"]


class SpecError(Exception):
    """A job spec that cannot be run; the message says why."""


def load_catalog(framework_dir):
    """A framework directory's ``models.json``: its models and their default hyper-parameters."""
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
    return params


def _coerce(key, value, default):
    """An override takes the type of the default it replaces (an int may stand for a float)."""
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is not type(default):
        raise SpecError("hyper-parameter %r must be %s, not %r" % (key, type(default).__name__, value))
    return value


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
