"""Bytes a collective sends by the ring convention (nccl-tests' busbw factors), and a tensor's size.

The torch path of :class:`~dtlab.comm.communicator.Communicator` cannot see inside gloo's or
NCCL's algorithms, so it records what a ring would send for the payload: ``2(N-1)/N·M`` for an
all-reduce, ``(N-1)/N·M`` for reduce-scatter and all-gather, ``M`` for a chain broadcast.
"""

from __future__ import annotations

import torch

_RING_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0 if n > 1 else 0.0,
}


def ring_bytes_sent(op: str, payload_bytes: int, world_size: int) -> float:
    """Bytes one rank sends for ``op`` on a ``payload_bytes`` tensor (nccl-tests convention)."""
    if op not in _RING_FACTOR:
        raise ValueError(f"unknown collective {op!r}; choose one of {sorted(_RING_FACTOR)}")
    return _RING_FACTOR[op](world_size) * payload_bytes


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
