"""The runner's after-training checks, in the order it runs them: the host's stage
(``orchestrator/checks``) takes what each leaves in the result and in /out.

Each is (phase, wanted, run): ``wanted(spec, hp)`` says whether the job asks for it;
``run(adapter, ctx, result, out_dir)`` does it after the last timed span and puts what it
found into ``result``.  The runner times each as ``<phase>_time_s`` (the whole check, its
cost: no span holds it) and reports its phase as it starts.  A check that a job does not
ask for may leave a reason instead (``skipped``).
"""

import os

from .contract import FAIR_PROFILE, TRANSFER_FILE


def _ops(adapter, ctx, result, out_dir):
    from . import ops
    result["ops"] = ops.measure(adapter, ctx, result["train_time_s"] / ctx.hp["steps"])


def _robustness(adapter, ctx, result, out_dir):
    from . import robustness    # numpy, as the data readers: imported where used
    images, labels = ctx.test_arrays()
    check = robustness.gradient_check(adapter, images, labels, ctx.seed)
    result["gradient_check"] = check
    result["robustness"] = robustness.attack(adapter, images, labels, ctx.hp, ctx.seed, ctx.now, check,
                                             os.path.join(out_dir, TRANSFER_FILE))


def _migration(adapter, ctx, result, out_dir):
    from . import migration
    images = ctx.test_arrays()[0][:ctx.test_samples or None]
    result.update(migration.export(adapter, images, out_dir, ctx.test_predictions))


def _skip_migration(result):
    result["migration_reason"] = "not asked for (export_onnx=0)"


# (phase, wanted(spec, hp), run, skipped(result) or None)
CHECKS = (
    ("ops", lambda spec, hp: spec["profile"] == FAIR_PROFILE and bool(hp.get("op_repeats")), _ops, None),
    ("robustness", lambda spec, hp: bool(hp.get("robust_images")), _robustness, None),
    ("migration", lambda spec, hp: bool(hp.get("export_onnx", 1)), _migration, _skip_migration),
)
