"""The peak of what one piece of work allocates, on CPU as on GPU.

On a GPU the caching allocator keeps a high-water mark (``torch.cuda.max_memory_allocated``).
PyTorch's CPU allocator keeps none, but with ``profile_memory=True`` the profiler records every
CPU allocation and free as a signed byte count at a point in time. Sorting those events by time
and taking the largest running sum gives the peak of the bytes the work itself allocated and had
not yet freed. Frees of tensors that existed *before* the work are not reported by the CPU
allocator, so the figure never counts them as savings: add the bytes already held at the start
(e.g. :func:`~dtlab.memory.measure.measure_model_state`) for the total peak.

The profiler's C++ side writes log lines straight to file descriptor 2, which a notebook shows
as red stderr blocks from every rank, reading like errors:

* Kineto, each time the profiler starts and stops (``USDT:... profiler_start`` /
  ``profiler_stop``). ``KINETO_LOG_LEVEL`` would hide them, but Kineto reads it once per
  process, at its first start, and hides its real errors with them.
* c10's CPU allocator, when the work frees a tensor allocated before the profiler started:
  "Memory block of unknown size was allocated before the profiling started" — the very case
  above, expected here. ``CPUAllocator.cpp`` prints it for the 1st, 1001st, 2001st ... such free
  in a process (a counter, modulo 1000).

So :func:`_without_profiler_log_lines` catches fd 2 only while the profiler starts and stops
(never while the work runs, so a rank that crashes in the work still leaves its last words in
:mod:`dtlab.runtime.last_words`), passes on every other line, and, right after the start, frees
one tensor made before it: that spends the allocator's message where it is caught, and the work
prints it only after a thousand more such frees in the same process.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

# Kineto's log prefix: severity, then "YYYY-MM-DD HH:MM:SS pid:tid File.cpp:line]"; and c10's
# allocator warning (after an optional "[rank0]:" and c10's "[W... CPUAllocator.cpp:245] ").
PROFILER_LOG_LINE = re.compile(
    rb"^(USDT|STAGE|INFO|VERBOSE):\d{4}-\d\d-\d\d [\d:]+ \d+:\d+ \S+:\d+\]"
    rb"|.*CPUAllocator\.cpp:\d+\] Memory block of unknown size was allocated before the profiling"
)


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

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    made_before = torch.empty(16)
    with warnings.catch_warnings():
        # torch 2.11 warns on every profiler start that events do not accumulate across cycles;
        # one cycle is all this reads.
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
        with _without_profiler_log_lines():
            prof.start()
            del made_before  # an unknown-size free, while fd 2 is caught (module docstring)
        try:
            work()
        finally:
            with _without_profiler_log_lines():
                prof.stop()
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


def without_profiler_log_lines(text: bytes) -> bytes:
    """``text`` less the profiler's expected log lines (errors and everything else kept)."""
    return b"".join(
        line for line in text.splitlines(keepends=True) if not PROFILER_LOG_LINE.match(line)
    )


@contextlib.contextmanager
def _without_profiler_log_lines() -> Iterator[None]:
    """Point fd 2 at a scratch file for the block, then write back all but Kineto's log lines.

    fd 2, not ``sys.stderr``: Kineto is C++ and writes to the descriptor. The descriptor is put
    back as it was, so a rank's stderr capture (:mod:`dtlab.runtime.last_words`) is untouched.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = without_profiler_log_lines(caught.read())
            if kept:
                os.write(2, kept)
