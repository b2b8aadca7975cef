"""Memory on the accelerator: an allocation trace, the caching allocator's view of it, a chart.

**What is recorded.** :class:`AllocationRecorder` (a dispatch mode) writes down every new
storage an op creates — ``("alloc", id, nbytes)`` — and, through a ``weakref.finalize`` on the
storage, the moment it is freed — ``("free", id)``. On a CPU these are the real allocations of
the run (served by the system ``malloc``, which does not cache).

**What is shown.** PyTorch's CUDA caching allocator keeps freed blocks for reuse, so on a GPU
``memory_reserved`` exceeds ``memory_allocated`` and shapes that vary step to step (MoE token
counts, variable sequence lengths) strand free pieces in segments that cannot merge. On a CPU
there is no such allocator, so the lab feeds the *recorded trace* to
:mod:`dtlab.cost.caching_allocator` — a simulated caching allocator — and says so on every chart.
On a GPU, :func:`cuda_snapshot` records the real thing with
``torch.cuda.memory._record_memory_history`` / ``_snapshot`` (private APIs PyTorch documents in
"Understanding CUDA Memory Usage"; where they are missing it falls back to ``memory_stats``), and
:func:`dtlab.perf.charts.segments_chart` draws either source the same way: one row per segment, its blocks in
address order, in use or cached.
"""

from __future__ import annotations

import itertools
import weakref

import torch
from torch.utils._pytree import tree_flatten

from dtlab.perf.dispatch import DispatchMode


class AllocationRecorder(DispatchMode):
    """``with AllocationRecorder() as rec: step()`` → ``rec.events``, an allocation trace."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple] = []
        self._ids = itertools.count()
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._note(t.untyped_storage())
        return out

    def _note(self, storage) -> None:
        key = id(storage)
        if key in self._seen or storage.nbytes() == 0:
            return
        self._seen.add(key)
        handle = next(self._ids)
        self.events.append(("alloc", handle, storage.nbytes()))
        weakref.finalize(storage, self._freed, key, handle)

    def _freed(self, key: int, handle: int) -> None:
        self._seen.discard(key)
        self.events.append(("free", handle))


def varying_shapes_step(
    tokens: int, width: int, layers: int, device: torch.device | str = "cpu", backward: bool = True
) -> list[torch.Tensor]:
    """A forward and backward's allocation pattern at ``tokens`` rows: each layer makes a
    workspace (freed at once) and an activation kept for the backward, freed in reverse. With
    ``backward=False`` the activations are returned alive: the moment of peak memory."""
    saved = []
    x = torch.ones(tokens, width, device=device)
    for _ in range(layers):
        workspace = x * 2.0
        x = torch.nn.functional.gelu(workspace)
        del workspace
        saved.append(x)
    if not backward:
        return saved
    while saved:
        grad = saved.pop() * 0.5
        del grad
    return []


def record_varying_shapes(token_counts: list[int], width: int, layers: int) -> list[tuple]:
    """The allocation trace of one :func:`varying_shapes_step` per token count, in order."""
    with AllocationRecorder() as recorder:
        for tokens in token_counts:
            varying_shapes_step(tokens, width, layers)
    return recorder.events


def cuda_snapshot(step, device: torch.device) -> dict:
    """Run ``step`` on a GPU under the allocator's history recorder and snapshot the allocator
    while what ``step`` returns is still alive; then let it go.

    ``{"segments": [[(bytes, in_use), …], …], "reserved": …, "allocated": …, "source": …}``."""
    memory = torch.cuda.memory
    recorded = hasattr(memory, "_record_memory_history") and hasattr(memory, "_snapshot")
    if recorded:
        memory._record_memory_history(max_entries=100_000)
    try:
        kept = step()
        torch.cuda.synchronize(device)
        raw = memory._snapshot() if recorded else {"segments": []}
        reserved = torch.cuda.memory_reserved(device)
        allocated = torch.cuda.memory_allocated(device)
        del kept
    finally:
        if recorded:
            memory._record_memory_history(enabled=None)
    segments = [
        [(b["size"], b["state"] == "active_allocated") for b in seg["blocks"]]
        for seg in raw.get("segments", [])
        if seg.get("device", device.index or 0) == (device.index or 0)
    ]
    source = "CUDA memory snapshot" if recorded else "memory_stats only (no snapshot API)"
    return {"segments": segments, "reserved": reserved, "allocated": allocated, "source": source}


def _steps_then_peak(token_counts: list[int], width: int, layers: int, device) -> list:
    for tokens in token_counts[:-1]:
        varying_shapes_step(tokens, width, layers, device)
    return varying_shapes_step(token_counts[-1], width, layers, device, backward=False)


def allocator_view(
    token_counts: list[int], width: int, layers: int, device: torch.device | str
) -> dict:
    """The caching allocator at the peak of :func:`varying_shapes_step` over the token counts
    (every step forward and backward, the last one's activations still alive).

    Always: the recorded allocation trace fed to the simulated allocator, with and without
    expandable segments (``simulated["segments"]``: the layout when the trace ends, the last
    step's activations alive). On a GPU also ``real``: the real allocator's snapshot at the same
    moment (``source`` says so).
    Sizes in bytes."""
    from dtlab.cost.caching_allocator import replay, segment_layout

    device = torch.device(device)
    with AllocationRecorder() as recorder:
        kept = _steps_then_peak(token_counts, width, layers, "cpu")
    events = list(recorder.events)  # ends with the last step's activations alive
    del kept
    simulated, peaks = replay(events, 1 << 40)
    _, grown = replay(events, 1 << 40, expandable_segments=True)
    segments = segment_layout(simulated)
    peaks.pop("layout_at_peak")
    grown.pop("layout_at_peak")
    view = {
        "events": len(events),
        "simulated": {"segments": segments, **peaks},
        "expandable": grown,
        "real": None,
    }
    if device.type == "cuda":
        torch.cuda.empty_cache()
        view["real"] = cuda_snapshot(
            lambda: _steps_then_peak(token_counts, width, layers, device), device
        )
    return view
