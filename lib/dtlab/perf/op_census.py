"""Every op of a step with its counted FLOPs and bytes and its measured time.

Two passes over the same step, so that counting never slows the timed run:

1. **Counting** (:func:`count_ops`): a ``TorchDispatchMode`` sees every ATen op that reaches the
   dispatcher — below autograd, so the backward's ops too — and adds per op name:

   * **FLOPs**, read from ``torch.utils.flop_counter.FlopCounterMode`` (entered outside this mode,
     its running total is read before and after each op: PyTorch's own formulas, e.g. ``2mkn``
     for ``mm``; it counts matmul-family ops only, so pointwise ops get 0 FLOPs);
   * **bytes**: every tensor argument read once (``numel × element_size``) plus every tensor
     result written once (an ``out=`` tensor counts as written, not read). View ops (``view``, ``t``, ``expand``, ``detach`` …) move nothing and
     count 0. This is the traffic an unfused kernel would do if nothing stayed in cache: the
     roofline's model, not a hardware counter.

2. **Timing** (:func:`time_ops`): ``torch.profiler`` over ``steps`` runs; each op's *self* time
   (device time on a GPU, CPU time otherwise) divided by the steps.

:func:`place_on_roofline` joins the two by op name and places each on a measured
:class:`~dtlab.perf.roofline.Roofline`: intensity ``FLOPs / bytes``, the bound it predicts, and
the FLOP/s and bytes/s it achieved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from dtlab.perf.dispatch import DispatchMode, op_name
from dtlab.perf.roofline import Roofline

# ATen ops that only relabel memory although the schema does not mark them as views.
_NO_TRAFFIC = {"_unsafe_view", "lift_fresh", "alias", "_reshape_alias", "set_", "resize_"}


@dataclass
class OpCount:
    """One op name's totals over a step: calls, FLOPs, bytes read and written."""

    name: str
    calls: int = 0
    flops: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0

    @property
    def nbytes(self) -> float:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """FLOP per byte moved (0 for ops without counted FLOPs)."""
        return self.flops / self.nbytes if self.nbytes else 0.0


def _tensor_bytes(values) -> float:
    leaves, _ = tree_flatten(values)
    return float(sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor)))


def moves_no_bytes(func) -> bool:
    """True for ops that only make a new view of existing memory."""
    return bool(getattr(func, "is_view", False)) or op_name(func) in _NO_TRAFFIC


class _Census(DispatchMode):
    def __init__(self, flops: FlopCounterMode) -> None:
        super().__init__()
        self.flops = flops
        self.ops: dict[str, OpCount] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = self.flops.get_total_flops()
        out = func(*args, **kwargs)
        name = op_name(func)
        count = self.ops.setdefault(name, OpCount(name))
        count.calls += 1
        count.flops += self.flops.get_total_flops() - before
        if not moves_no_bytes(func):
            reads = {k: v for k, v in kwargs.items() if k != "out"}  # out= is written, not read
            inputs = args[1:] if name == "copy_" else (args, reads)  # copy_ overwrites self
            count.bytes_read += _tensor_bytes(inputs)
            count.bytes_written += _tensor_bytes(out)
        return out


def count_ops(step: Callable[[], object]) -> dict[str, OpCount]:
    """Run ``step`` once and return its ops by name, with counted FLOPs and bytes."""
    with FlopCounterMode(display=False) as flops, _Census(flops) as census:
        step()
    return census.ops


def time_ops(
    step: Callable[[], object], steps: int = 3, device: torch.device | str = "cpu"
) -> dict[str, float]:
    """Measured self seconds per step of each op (``aten::mm`` → ``"mm"``), from the profiler:
    device (kernel) time on a GPU, CPU time otherwise."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    step()  # warm-up: first-call allocations and lazy initialisation stay out of the profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    seconds = {}
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue
        if cuda:
            self_us = getattr(event, "self_device_time_total", None)
            if self_us is None:  # torch < 2.4 named it after CUDA
                self_us = event.self_cuda_time_total
        else:
            self_us = event.self_cpu_time_total
        seconds[event.key.removeprefix("aten::")] = self_us / 1e6 / steps
    return seconds


@dataclass(frozen=True)
class PlacedOp:
    """One op on the roofline: counted work, measured time, and what they imply."""

    name: str
    calls: int
    flops: float
    nbytes: float
    seconds: float
    bound: str

    @property
    def intensity(self) -> float:
        return self.flops / self.nbytes if self.nbytes else 0.0

    @property
    def achieved_flops(self) -> float:
        return self.flops / self.seconds if self.seconds else 0.0

    @property
    def achieved_bandwidth(self) -> float:
        return self.nbytes / self.seconds if self.seconds else 0.0


def place_on_roofline(
    step: Callable[[], object],
    roofline: Roofline,
    steps: int = 3,
    device: torch.device | str = "cpu",
) -> list[PlacedOp]:
    """Every op of ``step`` (running on ``device``) that moves bytes, by measured time, largest
    first."""
    counts = count_ops(step)
    seconds = time_ops(step, steps, device)
    placed = [
        PlacedOp(c.name, c.calls, c.flops, c.nbytes, seconds.get(c.name, 0.0),
                 roofline.bound(c.intensity))
        for c in counts.values()
        if c.nbytes
    ]  # fmt: skip
    return sorted(placed, key=lambda p: -p.seconds)
