"""Broadcast: the root's buffer ends up on every rank. Three ways to move ``M`` bytes to ``N-1`` ranks.

==============  ====================================  =====================================  ============================
algorithm       who sends what to whom                bytes sent (root / others)             alpha-beta time
==============  ====================================  =====================================  ============================
``flat``        root → each other rank, all at once   ``(N-1) M`` / 0                        ``α + (N-1) M β``
``binomial``    round k: ranks < 2^k send to +2^k     ``ceil(log2 N) M`` / ≤ ``log2 N · M``  ``ceil(log2 N) (α + M β)``
``chain``       0 → 1 → … → N-1 in S segments,         ``M`` / ``M`` (last rank: 0)          ``(N-2+S) (α + M β / S)``
                pipelined (a segment per step)
==============  ====================================  =====================================  ============================

Ranks are numbered relative to the root (``v = (rank - root) mod N``). The binomial tree is the
one in MPICH (Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations
in MPICH", IJHPCA 2005); the pipelined chain is how NCCL's ring broadcast streams a large message.
"""

from __future__ import annotations

import torch

from dtlab.collectives.agreement import CallDescriptor, check_agreement
from dtlab.collectives.ops import ceil_log2, chunk_bounds, flat_view
from dtlab.collectives.p2p import Group, Peers, peers_of


def _check_root(root: int, peers: Peers) -> None:
    if not 0 <= root < peers.size:
        raise ValueError(f"root {root} is not a rank of this {peers.size}-rank group")


def broadcast_flat_(flat: torch.Tensor, root: int, peers: Peers) -> None:
    """Root sends the whole buffer to every other rank in one step."""
    if peers.rank == root:
        others = [p for p in range(peers.size) if p != root]
        peers.exchange(sends=[(p, flat) for p in others], name="broadcast.flat")
    else:
        peers.recv(root, flat, name="broadcast.flat")


def broadcast_binomial_(flat: torch.Tensor, root: int, peers: Peers) -> None:
    """Round ``k``: every rank that already has the data (``v < 2^k``) sends it to ``v + 2^k``."""
    v = (peers.rank - root) % peers.size
    for k in range(ceil_log2(peers.size)):
        mask = 1 << k
        if v < mask and v + mask < peers.size:
            peers.send((v + mask + root) % peers.size, flat, name="broadcast.binomial", step=k)
        elif mask <= v < 2 * mask:
            peers.recv((v - mask + root) % peers.size, flat, name="broadcast.binomial", step=k)


def default_segments(nbytes: int, world_size: int) -> int:
    """Segments for the chain: about 256 KiB each, at most 64, at least one per hop."""
    return max(1, min(64, max(world_size - 1, nbytes // (256 * 1024))))


def broadcast_chain_(
    flat: torch.Tensor, root: int, peers: Peers, segments: int | None = None
) -> None:
    """A pipelined chain: at step ``t`` rank ``v`` passes segment ``t - v`` on to ``v + 1``
    while receiving segment ``t - v + 1`` from ``v - 1``. ``N - 2 + S`` steps in all."""
    n = peers.size
    if segments is None:
        segments = default_segments(flat.numel() * flat.element_size(), n)
    segments = max(1, min(segments, flat.numel()))
    bounds = chunk_bounds(flat.numel(), segments)
    v = (peers.rank - root) % n
    before, after = (v - 1 + root) % n, (v + 1 + root) % n
    for t in range(n - 2 + segments):
        sends, recvs = [], []
        outgoing, incoming = t - v, t - v + 1
        if v < n - 1 and 0 <= outgoing < segments:
            sends.append((after, flat[slice(*bounds[outgoing])]))
        if v > 0 and 0 <= incoming < segments:
            recvs.append((before, flat[slice(*bounds[incoming])]))
        peers.exchange(sends, recvs, name="broadcast.chain", step=t)


_BROADCASTS = {"flat": broadcast_flat_, "binomial": broadcast_binomial_, "chain": broadcast_chain_}


def broadcast(
    tensor: torch.Tensor, root: int = 0, *, algorithm: str = "binomial", group: Group = None
) -> torch.Tensor:
    """Copy ``tensor`` from rank ``root`` (an index *within* ``group``) to every rank, in place."""
    if algorithm not in _BROADCASTS:
        raise ValueError(
            f"unknown broadcast algorithm {algorithm!r}; choose one of {list(_BROADCASTS)}"
        )
    peers = peers_of(group)
    _check_root(root, peers)
    call = CallDescriptor("broadcast", algorithm, tensor.dtype, tensor.numel(), root=root)
    check_agreement(peers, call, tensor.device)
    if peers.size == 1 or tensor.numel() == 0:
        return tensor
    flat, is_view = flat_view(tensor)
    _BROADCASTS[algorithm](flat, root, peers)
    if not is_view:
        tensor.copy_(flat.view_as(tensor))
    return tensor
