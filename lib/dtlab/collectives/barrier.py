"""Barrier by dissemination (Hensgen, Finkel & Manber, "Two algorithms for barrier synchronization",
1988): in round ``k`` rank ``r`` signals rank ``r + 2^k`` and waits for rank ``r - 2^k``.

After ``ceil(log2 N)`` rounds every rank has heard, directly or through a chain, from every
other, so none can leave before all have arrived. Each rank sends ``ceil(log2 N)`` one-byte
messages: time ``ceil(log2 N) · α`` — a barrier is pure latency. Works for any ``N``, no root.
"""

from __future__ import annotations

import torch

from dtlab.collectives.ops import ceil_log2
from dtlab.collectives.p2p import Group, peers_of
from dtlab.runtime.context import device


def barrier(*, algorithm: str = "dissemination", group: Group = None) -> None:
    """Return only once every rank of ``group`` has called ``barrier``."""
    if algorithm != "dissemination":
        raise ValueError(f"unknown barrier algorithm {algorithm!r}; choose 'dissemination'")
    peers = peers_of(group)
    token = torch.ones(1, dtype=torch.uint8, device=device())
    heard = torch.empty_like(token)
    for k in range(ceil_log2(peers.size)):
        distance = 1 << k
        peers.exchange(
            sends=[((peers.rank + distance) % peers.size, token)],
            recvs=[((peers.rank - distance) % peers.size, heard)],
            name="barrier.dissemination",
            step=k,
        )
