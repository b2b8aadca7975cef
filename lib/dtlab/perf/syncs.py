"""Host–device synchronisation: every place a step makes the host wait, found and timed.

A GPU runs kernels from a queue the host fills ahead of it; the host stays ahead until it needs
a *value* computed on the device. Then it must wait for the queue to drain (a ``cudaMemcpy``
device→host and a ``cudaStreamSynchronize``), and the device idles while the host catches up.
What forces it, in PyTorch:

* reading a number: ``.item()``, ``float(t)``, ``int(t)``, ``if t > 0:`` (``__bool__``),
  formatting or printing a tensor (``print(loss)``, ``f"{loss:.3f}"``), ``.tolist()`` (MoE
  split sizes), ``.numpy()``, ``.cpu()``;
* an op whose **output shape depends on the data**: ``nonzero``, ``masked_select``, boolean
  indexing ``x[mask]``, ``unique``, ``repeat_interleave`` without ``output_size`` — the host must
  know the size to allocate the result.

**How dtlab finds them, honestly.** On a CPU there is no device queue, so there is nothing to
wait for; timing cannot show a sync. :class:`SyncCounter` therefore finds them by *what the code
asks for*: a ``TorchFunctionMode`` intercepts the Python-level calls above on tensors of the
watched device (every CPU tensor when the device is the CPU: the reads that would be syncs if the
step ran on a GPU). Each becomes a span (kind ``other``, name ``sync:<call>``; not ``idle``, which the
timeline uses for the gaps between spans) on dtlab's timeline
— in the rank's trace when it runs under a Cluster, and in :attr:`SyncCounter.spans` always —
with the time the call took: on a GPU the wait for the queue; on a CPU only the read itself,
which is why the lab measures a sync's cost on a GPU and states so on a CPU. A CPU tensor read
during a GPU step (e.g. an optimizer's step counter on the host) is not a device sync and is not
counted there.

:func:`host_syncs_in_profile` is the other direction: given a profiler trace (kernel and runtime
events), find the ops that made the host wait.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from dtlab import trace
from dtlab.trace.recorder import Span

#: Python-level calls that read device memory on the host, and why.
HOST_READS = {
    "item": "reads one number",
    "__bool__": "branches on a tensor",
    "__float__": "converts a tensor to float",
    "__int__": "converts a tensor to int",
    "__index__": "uses a tensor as an index",
    "__format__": "formats a tensor (print / f-string)",
    "__repr__": "prints a tensor",
    "__str__": "prints a tensor",
    "tolist": "copies a tensor to a Python list",
    "numpy": "copies a tensor to NumPy",
    "cpu": "copies a tensor to the host",
    "nonzero": "output shape depends on the data",
    "argwhere": "output shape depends on the data",
    "masked_select": "output shape depends on the data",
    "unique": "output shape depends on the data",
    "unique_consecutive": "output shape depends on the data",
}


@dataclass(frozen=True)
class Sync:
    """One host read: the call, why it waits, where in the learner's code, and how long it took."""

    call: str
    reason: str
    where: str
    start_ns: int
    end_ns: int

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def _tensors(args, kwargs) -> list[torch.Tensor]:
    values = [*args, *(kwargs or {}).values()]
    return [v for v in values if isinstance(v, torch.Tensor)]


def _caller() -> str:
    """``file:line`` of the first frame outside torch and this module."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if "/torch/" not in path and not path.endswith("perf/syncs.py"):
            return f"{path.rsplit('/', 1)[-1]}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _why(name: str, args, kwargs) -> str | None:
    """The reason ``name(*args)`` reads device memory on the host, or None if it does not."""
    if name in HOST_READS:
        if name == "cpu" and args and args[0].device.type == "cpu":
            return None
        return HOST_READS[name]
    if name == "__getitem__" and len(args) > 1:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
            return "boolean mask: output shape depends on the data"
    if name == "repeat_interleave" and (kwargs or {}).get("output_size") is None:
        repeats = args[1] if len(args) > 1 else (kwargs or {}).get("repeats")
        if isinstance(repeats, torch.Tensor) or (args and len(args) == 1):
            return "output shape depends on the data (pass output_size)"
    if name == "to" and args and args[0].device.type != "cpu":
        target = [a for a in [*args[1:], *(kwargs or {}).values()] if a is not None]
        if any(str(t) == "cpu" or getattr(t, "type", None) == "cpu" for t in target):
            return "copies a tensor to the host"
    return None


class SyncCounter(TorchFunctionMode):
    """``with SyncCounter() as syncs: step()`` — every host read of a ``device`` tensor.

    ``syncs.found`` lists :class:`Sync` records in order; ``syncs.spans`` the same as timeline
    spans (also recorded into the rank's trace when dtlab is recording).
    """

    def __init__(self, device: torch.device | str = "cpu", rank: int = 0) -> None:
        super().__init__()
        self.device = torch.device(device).type
        self.rank = rank
        self.found: list[Sync] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        on_device = any(t.device.type == self.device for t in _tensors(args, kwargs))
        reason = _why(name, args, kwargs) if on_device or name == "to" else None
        if reason is None:
            return func(*args, **(kwargs or {}))
        start = trace.now_ns()
        try:
            return func(*args, **(kwargs or {}))
        finally:
            end = trace.now_ns()
            where = _caller()
            self.found.append(Sync(name.strip("_"), reason, where, start, end))
            trace.record(f"sync:{name.strip('_')}", "other", start, end, where=where, reason=reason)

    @property
    def spans(self) -> list[Span]:
        return [
            Span(self.rank, f"sync:{s.call}", "other", s.start_ns, s.end_ns, 0,
                 {"where": s.where, "reason": s.reason})
            for s in self.found
        ]  # fmt: skip

    def counts(self) -> dict[str, int]:
        """How many syncs of each call."""
        out: dict[str, int] = {}
        for s in self.found:
            out[s.call] = out.get(s.call, 0) + 1
        return out


def seconds_per_step(step, steps: int, device: torch.device | str = "cpu") -> float:
    """Median wall time of ``steps`` calls of ``step`` (device drained after each)."""
    import statistics

    cuda = torch.device(device).type == "cuda"
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# -- reading a profiler trace ---------------------------------------------------------------------

#: Runtime calls that block the host until the stream (or device, or event) has finished.
BLOCKING_RUNTIME = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def sync_idle_seconds(syncs_per_step: int, refill_s: float) -> float:
    """Device idle per step that host syncs add: after each sync the queue is empty and the
    device waits ``refill_s`` while the host issues the next kernel — a lower bound, since the
    lead the host had built up before the sync is lost too."""
    return syncs_per_step * refill_s


def host_syncs_in_profile(events: list[dict]) -> list[int]:
    """Indices of the ``cpu_op`` events inside which the host waited for the device.

    A host waits inside an op when a runtime call within it blocks: ``cudaStreamSynchronize`` /
    ``cudaDeviceSynchronize`` / ``cudaEventSynchronize``, or a ``cudaMemcpy`` (not ``Async``),
    or a device→host ``cudaMemcpyAsync`` into pageable memory (the driver stages it and returns
    only when done). Not waits: kernel launches, ``cudaStreamWaitEvent`` (the *device* waits),
    ``cudaEventRecord``, and a non-blocking copy into pinned memory.
    """
    ops = [(i, e) for i, e in enumerate(events) if e["cat"] == "cpu_op"]
    calls = [e for e in events if e["cat"] == "cuda_runtime"]
    found = []
    for i, op in ops:
        end = op["ts"] + op["dur"]
        inside = [c for c in calls if op["ts"] <= c["ts"] and c["ts"] + c["dur"] <= end]
        if any(_blocks(c) for c in inside):
            found.append(i)
    return found


def _blocks(call: dict) -> bool:
    name, kind = call["name"], call.get("args", {}).get("kind", "")
    if name in BLOCKING_RUNTIME or name == "cudaMemcpy":
        return True
    return name == "cudaMemcpyAsync" and kind == "DtoH (Device -> Pageable)"
