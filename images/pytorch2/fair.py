"""The fair profile in current PyTorch: the network every PyTorch framework builds alike
(``dlbench_runner/torch_fair.py``)."""

from dlbench_runner.torch_fair import Fair  # noqa: F401
