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
``recursive_halving``
    ``log2 N`` steps (Thakur, Rabenseifner & Gropp, "Optimization of collective communication
    operations in MPICH", IJHPCA 2005). At distance ``N/2, N/4, …, 1`` rank ``r`` keeps
    the half of its current range of chunks that holds chunk ``r``, sends the other half to
    ``r XOR distance`` and adds in the partner's copy of the half it kept; the range halves every
    step and ends as chunk ``r``. Same ``(N-1)/N · M`` bytes as the ring in ``log2 N`` instead of
    ``N-1`` latencies: time ``log2 N · α + (N-1)/N · M β``. For ``N`` not a power of two
    (``p`` the largest power of two ≤ ``N``) the first ``2 (N-p)`` ranks pair up first, as in
    :mod:`~dtlab.collectives.allreduce`: even rank ``r`` hands its whole buffer to ``r+1``
    (``M`` bytes) and sits out; ``r+1`` then speaks for both chunks ``r`` and ``r+1`` in the
    halving, and at the end sends chunk ``r`` back (``M/N`` bytes). Two more steps, and the
    fold's ``M`` bytes: the ring wins for large buffers there.
"""

from __future__ import annotations

import torch

from dtlab.collectives import auto
from dtlab.collectives.agreement import CallDescriptor, check_agreement
from dtlab.collectives.ops import (
    chunk_bounds,
    combine_,
    finish_,
    flat_view,
    largest_power_of_two_at_most,
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


def reduce_scatter_recursive_halving_(
    flat: torch.Tensor, op: str, peers: Peers, *, name: str = "reduce_scatter.recursive_halving"
) -> list[tuple[int, int]]:
    """In place, like :func:`reduce_scatter_ring_`, by recursive halving (folding in first when
    ``N`` is not a power of two)."""
    n, r = peers.size, peers.rank
    bounds = chunk_bounds(flat.numel(), n)
    p = largest_power_of_two_at_most(n)
    extra, rounds = n - p, p.bit_length() - 1

    # After the fold, "new rank" w speaks for real ranks first_real(w) .. last_real(w).
    def first_real(w: int) -> int:
        return 2 * w if w < extra else w + extra

    def last_real(w: int) -> int:  # also the real rank that is active for w
        return 2 * w + 1 if w < extra else w + extra

    def elements_of(w_lo: int, w_hi: int) -> slice:
        return slice(bounds[first_real(w_lo)][0], bounds[last_real(w_hi - 1)][1])

    if r < 2 * extra and r % 2 == 0:
        peers.send(r + 1, flat, name=name + " fold", step=0)
        peers.recv(r + 1, flat[slice(*bounds[r])], name=name + " unfold", step=rounds + 1)
        return bounds
    scratch = workspace(flat.numel(), flat)
    if r < 2 * extra:
        peers.recv(r - 1, scratch, name=name + " fold", step=0)
        combine_(flat, scratch, op)
    new = r // 2 if r < 2 * extra else r - extra
    lo, hi = 0, p  # the new ranks whose chunks this rank still adds up
    for step, mask in enumerate(p >> (k + 1) for k in range(rounds)):
        mid = lo + mask
        keep, give = ((mid, hi), (lo, mid)) if new & mask else ((lo, mid), (mid, hi))
        kept = elements_of(*keep)
        incoming = scratch[: kept.stop - kept.start]
        partner = last_real(new ^ mask)
        peers.exchange(
            sends=[(partner, flat[elements_of(*give)])],
            recvs=[(partner, incoming)],
            name=name,
            step=step + 1,
        )
        combine_(flat[kept], incoming, op)
        lo, hi = keep
    if r < 2 * extra:
        peers.send(r - 1, flat[slice(*bounds[r - 1])], name=name + " unfold", step=rounds + 1)
    return bounds


REDUCE_SCATTERS = {
    "ring": reduce_scatter_ring_,
    "pairwise": reduce_scatter_pairwise_,
    "recursive_halving": reduce_scatter_recursive_halving_,
}
auto.AUTO_CANDIDATES["reduce_scatter"] = tuple(REDUCE_SCATTERS)


def reduce_scatter(
    tensor: torch.Tensor, op: str = "sum", *, algorithm: str = "ring", group: Group = None
) -> torch.Tensor:
    """This rank's chunk of the reduction of every rank's ``tensor`` (flattened, tensor_split rule).

    ``tensor`` is left unchanged; the result is a new 1-D tensor of ``|chunk rank|`` elements.
    ``algorithm="auto"`` runs the schedule the α-β model predicts fastest
    (:mod:`~dtlab.collectives.auto`; ``M`` is the input's bytes).
    """
    auto.check_algorithm("reduce_scatter", algorithm, list(REDUCE_SCATTERS))
    op = normalize_op(op)
    peers = peers_of(group)
    call = CallDescriptor("reduce_scatter", algorithm, tensor.dtype, tensor.numel(), op=op)
    check_agreement(peers, auto.call_descriptor(call), tensor.device)
    work = flat_view(tensor)[0].clone()
    if peers.size == 1:
        return finish_(work, op, 1)
    chosen = algorithm
    if algorithm == auto.AUTO:
        nbytes = work.numel() * work.element_size()
        chosen = auto.choose_for_call(peers, "reduce_scatter", nbytes, work.device).algorithm
    with auto.labelled(algorithm, chosen):
        bounds = REDUCE_SCATTERS[chosen](work, op, peers)
    return finish_(work[slice(*bounds[peers.rank])].clone(), op, peers.size)
