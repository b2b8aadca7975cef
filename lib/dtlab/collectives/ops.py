"""The arithmetic every collective shares: how a buffer is cut into chunks, and how two partial
results are combined.

Chunking follows ``torch.tensor_split``: a buffer of ``L`` elements cut into ``N`` chunks gives the
first ``L % N`` chunks ``ceil(L / N)`` elements and the rest ``floor(L / N)``. Every byte formula in
``dtlab.cost`` that mentions "a chunk" means a chunk cut this way, so a length not divisible by
``N`` still has an exact, rank-by-rank byte count.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

REDUCE_OPS = ("sum", "avg", "max", "min")

_FROM_TORCH = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "avg",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.MIN: "min",
}


def normalize_op(op: str | dist.ReduceOp) -> str:
    """``"sum"``, ``"avg"``, ``"max"`` or ``"min"`` from a string or a ``torch.distributed.ReduceOp``."""
    if isinstance(op, str):
        name = op.lower()
    else:
        name = next((v for k, v in _FROM_TORCH.items() if op == k), repr(op))
    if name not in REDUCE_OPS:
        raise ValueError(f"reduce op {op!r} is not supported; choose one of {REDUCE_OPS}")
    return name


def combine_(accumulator: torch.Tensor, incoming: torch.Tensor, op: str) -> torch.Tensor:
    """Fold ``incoming`` into ``accumulator`` in place. ``avg`` sums here and divides once at the end."""
    if op in ("sum", "avg"):
        accumulator.add_(incoming)
    elif op == "max":
        torch.maximum(accumulator, incoming, out=accumulator)
    else:
        torch.minimum(accumulator, incoming, out=accumulator)
    return accumulator


def finish_(result: torch.Tensor, op: str, world_size: int) -> torch.Tensor:
    """The last touch of a reduction: ``avg`` divides the sum by the number of ranks."""
    if op == "avg":
        if result.is_floating_point():
            result.div_(world_size)
        else:
            result.floor_divide_(world_size)
    return result


def chunk_bounds(length: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of ``parts`` chunks of a ``length``-element buffer (tensor_split rule)."""
    if parts <= 0:
        raise ValueError(f"cannot cut a buffer into {parts} chunks; need at least 1")
    base, extra = divmod(length, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def chunk_sizes(length: int, parts: int) -> list[int]:
    """Element count of each chunk under :func:`chunk_bounds`."""
    return [stop - start for start, stop in chunk_bounds(length, parts)]


def flat_view(tensor: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """A 1-D view of ``tensor`` and whether it *is* the tensor's storage.

    A non-contiguous tensor gets a contiguous copy (``False``); the caller copies the result back.
    """
    if tensor.is_contiguous():
        return tensor.view(-1), True
    return tensor.contiguous().view(-1), False


def ceil_log2(n: int) -> int:
    """Rounds of a tree or dissemination over ``n`` ranks: ``ceil(log2 n)``."""
    return (n - 1).bit_length()


def largest_power_of_two_at_most(n: int) -> int:
    """The ``p`` in "fold ``n - p`` extra ranks in, then run a power-of-two algorithm over ``p``"."""
    return 1 << (n.bit_length() - 1)


_workspaces = threading.local()


def workspace(numel: int, like: torch.Tensor) -> torch.Tensor:
    """A reusable receive buffer of ``numel`` elements (dtype and device of ``like``).

    Allocating a fresh multi-MiB buffer per call costs page faults on every first touch — the
    receive then pays them inside the transfer. Like NCCL's preallocated buffers, one buffer per
    dtype and device is kept (per thread) and grown when needed. Valid until the next call.
    """
    cache = _workspaces.__dict__.setdefault("buffers", {})
    key = (like.dtype, like.device)
    buffer = cache.get(key)
    if buffer is None or buffer.numel() < numel:
        buffer = cache[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return buffer[:numel]
