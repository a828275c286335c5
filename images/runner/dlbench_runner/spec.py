"""The job spec and the model catalogue a framework directory declares.

A framework directory holds ``adapter.py`` (the models, in code) and
``models.json`` (what the models are and their default hyper-parameters, as
data).  The host reads the same ``models.json`` to plan jobs, so the defaults
live in one place.
"""

import json
import os

PROFILES = ("paper", "quick")


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
    return params


def _coerce(key, value, default):
    """An override takes the type of the default it replaces (an int may stand for a float)."""
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is not type(default):
        raise SpecError("hyper-parameter %r must be %s, not %r" % (key, type(default).__name__, value))
    return value


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
    spec["hyperparameters"] = resolve_hyperparameters(
        catalog, spec["dataset"], spec["profile"], spec["overrides"])
    spec["model"] = catalog["models"][spec["dataset"]]["model"]
    return spec
