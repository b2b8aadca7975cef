"""Reduce: every rank's buffer combined (sum, avg, max, min) onto one root rank.

==============  ========================================  ==========================  =======================
algorithm       who sends what to whom                    bytes received by root      alpha-beta time
==============  ========================================  ==========================  =======================
``flat``        every rank → root, all at once            ``(N-1) M``                 ``α + (N-1) M β``
``binomial``    round k: ranks with bit k set send to     ``ceil(log2 N) M`` at most  ``ceil(log2 N)(α + M β)``
                ``v - 2^k`` and drop out
==============  ========================================  ==========================  =======================

Every non-root rank sends its (partial) buffer exactly once: ``M`` bytes. The binomial tree is the
mirror image of the binomial broadcast (MPICH; Thakur et al., IJHPCA 2005). Ranks other than the
root keep their input untouched: the partial sums live in a scratch copy.
"""

from __future__ import annotations

import torch

from dtlab.collectives.agreement import CallDescriptor, check_agreement
from dtlab.collectives.ops import ceil_log2, combine_, finish_, flat_view, normalize_op
from dtlab.collectives.p2p import Group, Peers, peers_of


def reduce_flat_(flat: torch.Tensor, root: int, op: str, peers: Peers) -> None:
    """Root receives all ``N-1`` buffers in one step, then folds them in rank order."""
    if peers.rank != root:
        peers.send(root, flat, name="reduce.flat")
        return
    others = [p for p in range(peers.size) if p != root]
    inbox = flat.new_empty((len(others), flat.numel()))
    peers.exchange(recvs=list(zip(others, inbox, strict=True)), name="reduce.flat")
    for row in inbox:
        combine_(flat, row, op)


def reduce_binomial_(flat: torch.Tensor, root: int, op: str, peers: Peers) -> None:
    """Round ``k``: rank ``v`` with bit ``k`` set sends to ``v - 2^k`` and is done; the rank it
    sends to folds the message in. After ``ceil(log2 N)`` rounds ``v = 0`` (the root) has it all."""
    v = (peers.rank - root) % peers.size
    scratch = None
    for k in range(ceil_log2(peers.size)):
        mask = 1 << k
        if v & mask:
            peers.send((v - mask + root) % peers.size, flat, name="reduce.binomial", step=k)
            return
        if v + mask < peers.size:
            scratch = torch.empty_like(flat) if scratch is None else scratch
            peers.recv((v + mask + root) % peers.size, scratch, name="reduce.binomial", step=k)
            combine_(flat, scratch, op)


_REDUCES = {"flat": reduce_flat_, "binomial": reduce_binomial_}


def reduce(
    tensor: torch.Tensor,
    root: int = 0,
    op: str = "sum",
    *,
    algorithm: str = "binomial",
    group: Group = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Combine every rank's ``tensor`` onto rank ``root`` (an index within ``group``).

    On the root the result goes to ``out`` if given, else into ``tensor`` (in place). Other ranks
    leave ``tensor`` unchanged and return it.
    """
    if algorithm not in _REDUCES:
        raise ValueError(f"unknown reduce algorithm {algorithm!r}; choose one of {list(_REDUCES)}")
    op = normalize_op(op)
    peers = peers_of(group)
    if not 0 <= root < peers.size:
        raise ValueError(f"root {root} is not a rank of this {peers.size}-rank group")
    call = CallDescriptor("reduce", algorithm, tensor.dtype, tensor.numel(), root=root, op=op)
    check_agreement(peers, call, tensor.device)
    is_root = peers.rank == root
    target = out if (is_root and out is not None) else tensor
    if target is not tensor:
        target.copy_(tensor)
    if peers.size == 1 or tensor.numel() == 0:
        return finish_(target, op, peers.size) if is_root else tensor
    flat, is_view = flat_view(target)
    if not is_root:
        flat = flat.clone()  # partial sums must not overwrite the caller's input
    _REDUCES[algorithm](flat, root, op, peers)
    if is_root:
        finish_(flat, op, peers.size)
        if not is_view:
            target.copy_(flat.view_as(target))
    return target
