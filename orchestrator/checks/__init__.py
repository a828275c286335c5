"""The after-training stage: every check done around a job, each behind one protocol
(``base.Check``), listed once here (``CHECKS``, in the order their columns stand in the row).

    layers       a fair job's layer timings (the ``ops`` side table)
    robustness   the attacks with the framework's own gradients (``robustness`` side table)
    migration    the model exported to ONNX, run by the host (``models/`` beside the row)
    transfer     the FGSM images kept for transfer attacks (``transfer/`` beside the row)
    fair         a fair job's initial weights, its logits against the NumPy reference, its
                 step losses (the ``steps`` side table)
    platforms    the migrated model deployed on the mobile runtime, quantized and in a web
                 browser, in the tool images (``platforms`` side table)

The job loop (``run.py``) stages each job's files through ``stage``, lets the checks
``take`` what the job left once it has ended, and ``collect`` gathers their ``found``
into an ok row; the row's schema takes their columns (``row_fields``).  Adding a check:
a module of this package whose ``CHECK`` is a ``base.Check``, and its name in ``NAMES``.
"""

from __future__ import annotations

import importlib
import threading

from .base import After, Check, Found

NAMES = (
    "layers",
    "robustness",
    "migration",
    "transfer",
    "fair",
    "platforms",
)
CHECKS: list[Check] = [importlib.import_module(f"{__name__}.{name}").CHECK for name in NAMES]


def row_fields() -> dict[str, tuple]:
    """Every check's columns of the row, in ``CHECKS``'s order."""
    return {name: field for check in CHECKS for name, field in check.row_fields.items()}


def stage(job) -> dict[str, bytes]:
    """The files the job finds beside its spec, from every check: made once per job."""
    return {name: data for check in CHECKS for name, data in check.stage(job).items()}


def take(after: After, stop: threading.Event | None = None) -> list:
    """Each check's look at what the job left, once it has ended, in ``CHECKS``'s order,
    each handed what those before it took."""
    before: dict = {}
    for check in CHECKS:
        before[check.name] = check.take(after, stop, dict(before))
    return list(before.values())


def found(after: After, result, taken: list | None = None) -> Found:
    """An ok row's share of every check, merged: their columns, side-table rows and files
    (``taken``: what each check took, ``take``; None: nothing)."""
    merged = Found()
    for check, kept in zip(CHECKS, taken if taken is not None else [None] * len(CHECKS)):
        share = check.found(after, result, kept)
        merged.fields.update(share.fields)
        merged.sides.update(share.sides)
        merged.files.update(share.files)
    return merged


__all__ = ["After", "CHECKS", "Check", "Found", "found", "row_fields", "stage", "take"]
