"""Measured memory per rank, by category: exact tensor accounting, and the CUDA allocator's view.

**Exact accounting** (:func:`measure_model_state`, any device) walks the tensors a training step
keeps alive — parameters, their ``.grad``, every tensor in ``optimizer.state``, model buffers and
any extra buffers you name — and adds up the bytes of their **unique storages**: a storage reached
twice (a tied embedding/LM-head weight, a gradient that is a view into a DDP bucket) is counted
once, in the first category that reached it, in the order listed. A sharded parameter (DTensor,
as FSDP2 and DTensor tensor parallelism make) counts only its local shard (``to_local()``).

Zero-dimensional tensors in the optimizer state — Adam's ``step`` counter, one per parameter
tensor — are bookkeeping, not per-parameter state, and go to ``other``; that keeps
``optimizer_state`` equal to the ``K·Ψ`` of the formulas (8 bytes/param for fp32 Adam).

**The CUDA allocator** (:func:`cuda_memory_report`) knows how much is allocated and its peak but
not what it is; given the model and optimizer, the report splits out their exact state and
leaves the rest (activations, workspaces, fragmentation) as ``other``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "communication_buffers",
    "other",
)


@dataclass
class MemoryReport:
    """Bytes one rank holds, by category (every category present, 0 when empty).

    ``peak`` and ``reserved`` are the CUDA allocator's peak allocated and reserved bytes when the
    report came from :func:`cuda_memory_report`, else ``None``.
    """

    rank: int
    by_category: dict[str, int] = field(default_factory=dict)
    peak: int | None = None
    reserved: int | None = None

    def __post_init__(self) -> None:
        unknown = set(self.by_category) - set(CATEGORIES)
        if unknown:
            raise ValueError(f"unknown memory categories {sorted(unknown)}; use {CATEGORIES}")
        self.by_category = {c: int(self.by_category.get(c, 0)) for c in CATEGORIES}

    @property
    def total(self) -> int:
        """Sum over all categories."""
        return sum(self.by_category.values())

    def summary(self) -> str:
        """A small table in MiB, one category per line."""
        lines = [f"rank {self.rank}"]
        lines += [f"  {c:<22}{n / 2**20:12.3f} MiB" for c, n in self.by_category.items()]
        lines.append(f"  {'total':<22}{self.total / 2**20:12.3f} MiB")
        if self.peak is not None:
            lines.append(f"  {'peak allocated':<22}{self.peak / 2**20:12.3f} MiB")
        return "\n".join(lines)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` this rank stores: a DTensor's local shard, otherwise ``t`` itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _tensors_in(value) -> Iterator[torch.Tensor]:
    """Every tensor inside an optimizer-state value (tensors, or dicts/lists of them)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _tensors_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors_in(v)


class _StorageLedger:
    """Adds each storage's bytes once, to the first category that reaches it."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self.seen: set[tuple[str, int | None, int]] = set()
        self.by_category = dict.fromkeys(CATEGORIES, 0)

    def add(self, category: str, tensor: torch.Tensor | None) -> None:
        if tensor is None:
            return
        storage = _local(tensor).untyped_storage()
        if self.device is not None and not _same_device(storage.device, self.device):
            return
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        key = (storage.device.type, storage.device.index, storage.data_ptr())
        if key not in self.seen:
            self.seen.add(key)
            self.by_category[category] += nbytes


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Same device, reading a missing index as "any" (``cpu``) or the current GPU (``cuda``)."""
    if a.type != b.type:
        return False
    if a.type == "cuda":
        return _cuda_index(a) == _cuda_index(b)
    return a.index is None or b.index is None or a.index == b.index


def _cuda_index(d: torch.device) -> int:
    return torch.cuda.current_device() if d.index is None else d.index


def _current_rank() -> int:
    """This process's rank (0 outside a process group). Memory accounting sits below the
    runtime and reads ``torch.distributed`` itself rather than importing it."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def measure_model_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    extra_buffers: Mapping[str, Iterable[torch.Tensor]] | Iterable[torch.Tensor] | None = None,
    device: torch.device | str | None = None,
) -> MemoryReport:
    """Exact bytes of ``model``'s parameters and gradients and ``optimizer``'s state on this rank.

    ``extra_buffers`` is either tensors to count as ``communication_buffers`` (e.g. DDP buckets,
    ZeRO flat shards) or a mapping ``{category: tensors}`` for any category. Model buffers
    (``register_buffer``) go to ``other``. With ``device``, only storages on that device count
    (e.g. to leave out optimizer state offloaded to the CPU).
    """
    ledger = _StorageLedger(torch.device(device) if device is not None else None)
    params = list(model.parameters())
    for p in params:
        ledger.add("parameters", p)
    for p in params:
        ledger.add("gradients", p.grad)
    if optimizer is not None:
        for state in optimizer.state.values():
            for t in _tensors_in(state):
                ledger.add("other" if t.dim() == 0 else "optimizer_state", t)
    for b in model.buffers():
        ledger.add("other", b)
    if extra_buffers is not None:
        if isinstance(extra_buffers, Mapping):
            for category, tensors in extra_buffers.items():
                if category not in CATEGORIES:
                    raise ValueError(f"unknown memory category {category!r}; use {CATEGORIES}")
                for t in tensors:
                    ledger.add(category, t)
        else:
            for t in extra_buffers:
                ledger.add("communication_buffers", t)
    return MemoryReport(rank=_current_rank(), by_category=ledger.by_category)


def cuda_memory_report(
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    device: torch.device | int | None = None,
) -> MemoryReport:
    """The CUDA caching allocator's view of this rank, split by category where it can be.

    ``total`` equals ``torch.cuda.memory_allocated``; ``peak`` is ``max_memory_allocated`` (reset
    it with ``torch.cuda.reset_peak_memory_stats()`` before the step you want to see) and
    ``reserved`` is ``memory_reserved``. With ``model`` (and ``optimizer``) the exact state is
    split out as in :func:`measure_model_state` (counting only storages on this GPU, so
    CPU-offloaded state is left out); everything else allocated is ``other``.
    """
    if not torch.cuda.is_available():
        raise RuntimeError(
            "cuda_memory_report needs a CUDA GPU; on CPU use measure_model_state for exact "
            "tensor accounting and ActivationMeter for activations"
        )
    if isinstance(device, torch.device) and device.index is not None:
        cuda = device
    else:
        index = device if isinstance(device, int) else torch.cuda.current_device()
        cuda = torch.device("cuda", index)
    allocated = torch.cuda.memory_allocated(cuda)
    by_category = dict.fromkeys(CATEGORIES, 0)
    if model is not None:
        state = measure_model_state(model, optimizer, device=cuda).by_category
        by_category.update(state)
    accounted = sum(by_category.values())
    by_category["other"] += max(0, allocated - accounted)
    return MemoryReport(
        rank=_current_rank(),
        by_category=by_category,
        peak=torch.cuda.max_memory_allocated(cuda),
        reserved=torch.cuda.memory_reserved(cuda),
    )
