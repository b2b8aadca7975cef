"""Reduce-scatter: the sum of every rank's buffer, cut into ``N`` chunks, chunk ``r`` left on rank ``r``.

The buffer is cut with :func:`~dtlab.collectives.ops.chunk_bounds` (tensor_split rule). Both
algorithms send every chunk but one's own, so rank ``r`` sends ``M - |chunk r|`` bytes:
``(N-1)/N · M`` when ``N`` divides the length.

``ring``
    ``N-1`` steps. At step ``s`` rank ``r`` sends its running sum of chunk ``r-1-s`` to its right
    neighbour and receives the left neighbour's running sum of chunk ``r-2-s``, adding its own.
    After the last step (``s = N-2``) the chunk it received is chunk ``r``, complete.
    Time ``(N-1)(α + M/N · β)``: every link busy every step, the bandwidth-optimal schedule
    (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", 2009).
``pairwise``
    ``N-1`` steps. At step ``s`` rank ``r`` sends chunk ``r+s`` straight to its owner ``r+s`` and
    receives rank ``r-s``'s copy of chunk ``r``. Same bytes and steps as the ring, but every rank
    talks to every other: no neighbour structure to exploit, no forwarding.
"""

from __future__ import annotations

import torch

from dtlab.collectives.agreement import CallDescriptor, check_agreement
from dtlab.collectives.ops import (
    chunk_bounds,
    combine_,
    finish_,
    flat_view,
    normalize_op,
    workspace,
)
from dtlab.collectives.p2p import Group, Peers, peers_of


def reduce_scatter_ring_(
    flat: torch.Tensor, op: str, peers: Peers, *, name: str = "reduce_scatter.ring"
) -> list[tuple[int, int]]:
    """In place: afterwards chunk ``rank`` of ``flat`` holds the reduced chunk (the other chunks
    hold partial sums). Returns the chunk bounds used."""
    n, r = peers.size, peers.rank
    bounds = chunk_bounds(flat.numel(), n)
    scratch = workspace(bounds[0][1] - bounds[0][0], flat)  # chunk 0 is a largest chunk
    for s in range(n - 1):
        send_lo, send_hi = bounds[(r - 1 - s) % n]
        recv_lo, recv_hi = bounds[(r - 2 - s) % n]
        incoming = scratch[: recv_hi - recv_lo]
        peers.exchange(
            sends=[(peers.right, flat[send_lo:send_hi])],
            recvs=[(peers.left, incoming)],
            name=name,
            step=s,
        )
        combine_(flat[recv_lo:recv_hi], incoming, op)
    return bounds


def reduce_scatter_pairwise_(
    flat: torch.Tensor, op: str, peers: Peers, *, name: str = "reduce_scatter.pairwise"
) -> list[tuple[int, int]]:
    """In place, like :func:`reduce_scatter_ring_`, by direct exchange with every other rank."""
    n, r = peers.size, peers.rank
    bounds = chunk_bounds(flat.numel(), n)
    mine = flat[slice(*bounds[r])]
    incoming = torch.empty_like(mine)
    for s in range(1, n):
        to, frm = (r + s) % n, (r - s) % n
        peers.exchange(
            sends=[(to, flat[slice(*bounds[to])])], recvs=[(frm, incoming)], name=name, step=s - 1
        )
        combine_(mine, incoming, op)
    return bounds


REDUCE_SCATTERS = {"ring": reduce_scatter_ring_, "pairwise": reduce_scatter_pairwise_}


def reduce_scatter(
    tensor: torch.Tensor, op: str = "sum", *, algorithm: str = "ring", group: Group = None
) -> torch.Tensor:
    """This rank's chunk of the reduction of every rank's ``tensor`` (flattened, tensor_split rule).

    ``tensor`` is left unchanged; the result is a new 1-D tensor of ``|chunk rank|`` elements.
    """
    if algorithm not in REDUCE_SCATTERS:
        raise ValueError(
            f"unknown reduce-scatter algorithm {algorithm!r}; choose one of {list(REDUCE_SCATTERS)}"
        )
    op = normalize_op(op)
    peers = peers_of(group)
    call = CallDescriptor("reduce_scatter", algorithm, tensor.dtype, tensor.numel(), op=op)
    check_agreement(peers, call, tensor.device)
    work = flat_view(tensor)[0].clone()
    bounds = REDUCE_SCATTERS[algorithm](work, op, peers) if peers.size > 1 else [(0, work.numel())]
    return finish_(work[slice(*bounds[peers.rank])].clone(), op, peers.size)
