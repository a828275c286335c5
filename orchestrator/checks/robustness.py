"""The robustness check in the after-training stage: what the runner's attacks found.

The runner attacks the trained model with the framework's own input gradients and checks
that gradient against finite differences (the runner's ``robustness.py`` says how); an ok
row holds the check's cost and the gradient check's figure, and the ``robustness`` side
table one row per attack and epsilon.  The FGSM images it keeps are the transfer check's
(``transfer.py``).
"""

from __future__ import annotations

from .base import After, Check, Found


class RobustnessCheck(Check):
    name = "robustness"
    row_fields = {
        "robustness_time_s": (float | None, None),   # the robustness check after training, seconds
        "gradient_error": (float | None, None),      # its finite-difference check of the input gradient
    }

    def found(self, after: After, result, taken) -> Found:
        check = result.gradient_check
        return Found({"robustness_time_s": result.robustness_time_s,
                      "gradient_error": check.relative_error if check else None},
                     sides={"robustness": [r.model_dump() for r in result.robustness]})


CHECK = RobustnessCheck()
