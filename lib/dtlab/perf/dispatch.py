"""The dispatcher hook dtlab's counters share: a ``TorchDispatchMode`` and op naming.

``TorchDispatchMode`` (``torch.utils._python_dispatch``) is how PyTorch's own
``FlopCounterMode`` and debug modes see every ATen op below autograd. Its module is underscored
but it is the documented extension point (PyTorch's "Python dispatcher" notes); importing it
from one place keeps dtlab's reliance on it in one line.
"""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode as DispatchMode

__all__ = ["DispatchMode", "op_name"]


def op_name(func) -> str:
    """``aten.addmm.default`` → ``"addmm"``: the name the profiler prints as ``aten::addmm``."""
    packet = getattr(func, "overloadpacket", None) or getattr(func, "_overloadpacket", None)
    return getattr(packet, "__name__", str(func).split(".")[1])
