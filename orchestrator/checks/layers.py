"""The layer timings in the after-training stage: where a fair job's time goes.

A fair job times each layer of its network alone, the whole network and its step (the
runner's ``ops.py`` defines the rows); an ok row's are the ``ops`` side table.
"""

from __future__ import annotations

from .base import After, Check, Found


class LayersCheck(Check):
    name = "layers"

    def found(self, after: After, result, taken) -> Found:
        return Found(sides={"ops": [r.model_dump(by_alias=True) for r in result.ops]})


CHECK = LayersCheck()
