"""The fair profile in PyTorch 1.7: the network every PyTorch framework builds alike
(``dlbench_runner/torch_fair.py``)."""

from dlbench_runner.torch_fair import Fair  # noqa: F401
