"""The peak of what one piece of work allocates, on CPU as on GPU.

On a GPU the caching allocator keeps a high-water mark (``torch.cuda.max_memory_allocated``).
PyTorch's CPU allocator keeps none, but with ``profile_memory=True`` the profiler records every
CPU allocation and free as a signed byte count at a point in time. Sorting those events by time
and taking the largest running sum gives the peak of the bytes the work itself allocated and had
not yet freed. Frees of tensors that existed *before* the work are not reported by the CPU
allocator, so the figure never counts them as savings: add the bytes already held at the start
(e.g. :func:`~dtlab.memory.measure.measure_model_state`) for the total peak.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WorkPeak:
    """Bytes the work allocated: at its high-water mark, and still held when it returned."""

    peak_bytes: int
    end_bytes: int
    source: str  # "cuda allocator" or "cpu profiler"


def peak_bytes_of(work: Callable[[], object], device: torch.device | str = "cpu") -> WorkPeak:
    """Run ``work()`` once and report the peak bytes it allocated on ``device``."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        work()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        return WorkPeak(peak, torch.cuda.memory_allocated(device) - before, "cuda allocator")
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings():
        # torch 2.11 warns on every profiler start that events do not accumulate across cycles;
        # one cycle is all this reads.
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            work()
    deltas = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]" and event.device_type() == torch.autograd.DeviceType.CPU
    )
    live = peak = 0
    for _, nbytes in deltas:
        live += nbytes
        peak = max(peak, live)
    return WorkPeak(peak, live, "cpu profiler")
