"""The job spec and the model catalogue a framework directory declares.

A framework directory holds ``adapter.py`` (the models, in code) and
``models.json`` (what the models are and their default hyper-parameters, as
data).  The host reads the same ``models.json`` to plan jobs, so the defaults
live in one place.
"""

from .contract import (PROFILES, SpecError, check_seed, check_value,  # noqa: F401
                       default_seed, gpu_index, load_catalog, resolve_hyperparameters)


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
    spec.setdefault("seed", default_seed(catalog, spec["dataset"]))
    check_seed(spec["seed"])
    spec["hyperparameters"] = resolve_hyperparameters(
        catalog, spec["dataset"], spec["profile"], spec["overrides"], spec["device"])
    spec["model"] = catalog["models"][spec["dataset"]]["model"]
    return spec
