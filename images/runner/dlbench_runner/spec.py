"""The job spec and the model catalogue a framework directory declares.

A framework directory holds ``adapter.py`` (the models, in code) and
``models.json`` (what the models are and their default hyper-parameters, as
data).  The host reads the same ``models.json`` to plan jobs, so the defaults
live in one place.
"""

from . import blas
from .contract import (PAPER_PROFILE, PROFILES, SpecError, check_seed, check_value,  # noqa: F401
                       default_seed, gpu_index, load_catalog, model_name, resolve_hyperparameters)


def complete(spec, catalog):
    """Fill the spec's derived fields (model name, resolved hyper-parameters)."""
    spec = dict(spec)
    for key in ("framework", "dataset"):
        if not spec.get(key):
            raise SpecError("job spec lacks %r" % key)
    if spec["framework"] != catalog["framework"]:
        raise SpecError("job is for %s but this runner holds %s"
                        % (spec["framework"], catalog["framework"]))
    spec.setdefault("profile", PAPER_PROFILE)
    spec.setdefault("overrides", {})
    spec.setdefault("threads", None)
    spec.setdefault("device", "cpu")
    spec.setdefault("seed", default_seed(catalog, spec["dataset"], spec["profile"]))
    check_seed(spec["seed"])
    spec["hyperparameters"] = resolve_hyperparameters(
        catalog, spec["dataset"], spec["profile"], spec["overrides"], spec["device"])
    spec["model"] = model_name(catalog, spec["dataset"], spec["profile"])
    spec["blas"] = _blas(spec.get("blas"), catalog)
    spec["onednn"] = spec.get("onednn")
    spec["workers"] = _workers(spec.get("workers"), catalog)
    spec["environment"] = _onednn_environment(spec["onednn"], catalog)
    return spec


def _blas(name, catalog):
    """The BLAS library the job asked for, by its full name; None: the image's default."""
    if name is None:
        return None
    try:
        name = blas.canonical(name)
    except blas.BlasError as exc:
        raise SpecError(str(exc))
    offered = catalog.get("blas") or []
    if name not in offered:
        raise SpecError("%s cannot switch to BLAS %r (it offers: %s)"
                        % (catalog["framework"], name, ", ".join(offered) or "none"))
    return name


def _workers(count, catalog):
    """How many workers train the model (2 or more, with the framework's engine); None: one."""
    if count is None or count == 1:
        return None
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise SpecError("workers is a whole number, 1 or more, not %r" % (count,))
    if not catalog.get("distributed"):
        raise SpecError("%s trains on one worker only (its models.json declares no distributed "
                        "engine)" % catalog["framework"])
    return count


def _onednn_environment(value, catalog):
    """The variable that turns the framework's oneDNN kernels on or off, as the job asks."""
    if value is None:
        return {}
    if value not in ("on", "off"):
        raise SpecError("onednn is on or off, not %r" % (value,))
    variable = (catalog.get("onednn") or {}).get("variable")
    if not variable:
        raise SpecError("%s has no oneDNN switch" % catalog["framework"])
    return {variable: "1" if value == "on" else "0"}
