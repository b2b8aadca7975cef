"""All-reduce: every rank ends with the combination (sum, avg, max, min) of every rank's buffer.

Six schedules for the same result; ``M`` is the buffer's bytes, ``N`` the ranks, ``p`` the largest
power of two ≤ ``N``. Bytes are those each rank sends (power-of-two ``N``, ``N`` dividing the length).

=======================  ===========================================  ==================  ==============================
algorithm                who sends what to whom                       bytes sent / rank   alpha-beta time
=======================  ===========================================  ==================  ==============================
``naive``                everyone → rank 0 (flat reduce), then        root ``(N-1) M``,   ``2 (N-1)(α + M β)``
                         rank 0 → everyone (flat broadcast)           others ``M``
``ring``                 ring reduce-scatter, then ring all-gather    ``2 (N-1)/N · M``   ``2 (N-1)(α + M/N · β)``
``recursive_doubling``   step k: swap the whole buffer with r^2^k     ``log2 N · M``      ``log2 N (α + M β)``
``rabenseifner``         recursive-halving reduce-scatter, then       ``2 (N-1)/N · M``   ``2 log2 N α + 2 (N-1)/N M β``
                         recursive-doubling all-gather
``binary_tree``          reduce up a binary tree to rank 0, then      ``≤ 3 M`` (leaves   ``2 floor(log2 N)``
                         broadcast down it                            ``M``)              ``· (α + 2 M β)``
``double_binary_tree``   half the buffer up and down each of two      ``≤ 2 M``           ``2 (h + S - 1)``
                         trees, pipelined in ``S`` segments                               ``· (α + M/S · β)``
=======================  ===========================================  ==================  ==============================

The ring is bandwidth-optimal (Patarasuk & Yuan 2009; what NCCL runs for large messages and what
Horovod/Baidu popularised for deep learning). Recursive doubling and the tree pay ``log N``
latencies instead of ``2 (N-1)``, so they win for small messages. Rabenseifner ("Optimization of
collective reduction operations", ICCS 2004) gets both: the ring's bytes with ``log N`` steps.
For ``N`` not a power of two, recursive doubling and Rabenseifner first fold the first
``2 (N-p)`` ranks in pairs (even hands its buffer to odd) and unfold at the end (Thakur et al. 2005).
The double binary tree (:mod:`~dtlab.collectives.double_tree`; Sanders, Speck & Träff 2009,
NCCL's "tree") keeps the tree's ``log N`` latency at the ring's bandwidth: every rank is a leaf
in one of two trees, so no link carries more than ``2 M``. ``algorithm="auto"`` prices all six
on a fitted α-β model and runs the cheapest (:mod:`~dtlab.collectives.auto`).
The ring streams its chunks in segments of at most 4 MiB, several in flight
(:mod:`~dtlab.collectives.ring_pipeline`): same bytes and steps, ``K`` messages per step for
chunks of ``K`` segments, and steps that overlap; the model above is the textbook ring's.
``transport="shm"`` runs the same ring through shared-memory slots instead of the process
group's sockets (ranks of one host; :mod:`~dtlab.collectives.shm_transport`,
:mod:`~dtlab.collectives.shm_ring`).
"""

from __future__ import annotations

import torch

from dtlab.collectives import auto
from dtlab.collectives.agreement import CallDescriptor, check_agreement
from dtlab.collectives.broadcast import broadcast_flat_
from dtlab.collectives.double_tree import all_reduce_double_binary_tree_
from dtlab.collectives.ops import (
    combine_,
    finish_,
    flat_view,
    largest_power_of_two_at_most,
    normalize_op,
)
from dtlab.collectives.p2p import Group, Peers, peers_of
from dtlab.collectives.reduce import reduce_flat_
from dtlab.collectives.ring_pipeline import pipelined_ring_all_reduce_
from dtlab.collectives.shm_ring import shm_ring_all_reduce_


def all_reduce_naive_(flat: torch.Tensor, op: str, peers: Peers) -> None:
    """Reduce everything onto rank 0, finish it there, broadcast it back. Rank 0's link carries
    ``2 (N-1) M`` bytes: the bottleneck every better algorithm removes."""
    reduce_flat_(flat, 0, op, peers)
    if peers.rank == 0:
        finish_(flat, op, peers.size)
    broadcast_flat_(flat, 0, peers)


def all_reduce_ring_(
    flat: torch.Tensor, op: str, peers: Peers, *, name: str = "all_reduce.ring"
) -> None:
    """Ring reduce-scatter (``N-1`` steps), finish my chunk, ring all-gather (``N-1`` steps),
    streamed segment by segment as NCCL and gloo do (:mod:`dtlab.collectives.ring_pipeline`)."""
    pipelined_ring_all_reduce_(flat, op, peers, name=name)


def _fold_in(flat: torch.Tensor, op: str, peers: Peers, name: str) -> int | None:
    """Pair up the first ``2 (N-p)`` ranks: even hands its buffer to odd. Returns this rank's
    index among the ``p`` ranks that go on, or ``None`` if it sits out."""
    r, p = peers.rank, largest_power_of_two_at_most(peers.size)
    extra = peers.size - p
    if r >= 2 * extra:
        return r - extra
    if r % 2 == 0:
        peers.send(r + 1, flat, name=name + " fold")
        return None
    incoming = torch.empty_like(flat)
    peers.recv(r - 1, incoming, name=name + " fold")
    combine_(flat, incoming, op)
    return r // 2


def _real_rank(new: int, extra: int) -> int:
    return 2 * new + 1 if new < extra else new + extra


def _fold_out(flat: torch.Tensor, new: int | None, peers: Peers, name: str) -> None:
    """The odd ranks that absorbed a partner hand it the finished result."""
    r = peers.rank
    extra = peers.size - largest_power_of_two_at_most(peers.size)
    if r < 2 * extra:
        if new is None:
            peers.recv(r + 1, flat, name=name + " unfold")
        else:
            peers.send(r - 1, flat, name=name + " unfold")


def all_reduce_recursive_doubling_(flat: torch.Tensor, op: str, peers: Peers) -> None:
    """Step ``k``: swap the whole (partially reduced) buffer with new rank ``new XOR 2^k``."""
    name = "all_reduce.recursive_doubling"
    p = largest_power_of_two_at_most(peers.size)
    new = _fold_in(flat, op, peers, name)
    if new is not None:
        incoming = torch.empty_like(flat)
        for k in range(p.bit_length() - 1):
            partner = _real_rank(new ^ (1 << k), peers.size - p)
            peers.exchange(sends=[(partner, flat)], recvs=[(partner, incoming)], name=name, step=k)
            combine_(flat, incoming, op)
        finish_(flat, op, peers.size)
    _fold_out(flat, new, peers, name)


def all_reduce_rabenseifner_(flat: torch.Tensor, op: str, peers: Peers) -> None:
    """Recursive halving: at distance ``p/2, p/4, …, 1`` keep one half of the current range, send
    the other to the partner, add the partner's copy of the kept half. Then retrace the halvings
    backwards, swapping owned ranges, to gather (recursive doubling)."""
    name = "all_reduce.rabenseifner"
    p = largest_power_of_two_at_most(peers.size)
    new = _fold_in(flat, op, peers, name)
    if new is not None:
        lo, hi, history = 0, flat.numel(), []
        scratch = torch.empty_like(flat[: (hi + 1) // 2])
        step, mask = 0, p >> 1
        while mask:
            partner = _real_rank(new ^ mask, peers.size - p)
            mid = lo + (hi - lo + 1) // 2
            keep, give = ((mid, hi), (lo, mid)) if new & mask else ((lo, mid), (mid, hi))
            incoming = scratch[: keep[1] - keep[0]]
            peers.exchange(
                sends=[(partner, flat[slice(*give)])],
                recvs=[(partner, incoming)],
                name=name + " reduce-scatter",
                step=step,
            )
            combine_(flat[slice(*keep)], incoming, op)
            history.append((partner, keep, give))
            (lo, hi), step, mask = keep, step + 1, mask >> 1
        finish_(flat[lo:hi], op, peers.size)
        for partner, keep, give in reversed(history):
            peers.exchange(
                sends=[(partner, flat[slice(*keep)])],
                recvs=[(partner, flat[slice(*give)])],
                name=name + " all-gather",
                step=step,
            )
            step += 1
    _fold_out(flat, new, peers, name)


def all_reduce_binary_tree_(flat: torch.Tensor, op: str, peers: Peers) -> None:
    """Heap-ordered binary tree rooted at rank 0 (children ``2r+1``, ``2r+2``): receive both
    children's partial results, fold them in, pass up; then receive the total from the parent
    and pass it down. NCCL pipelines a *double* binary tree (Sanders et al. 2009); this is one
    tree, unpipelined, to show the shape."""
    name = "all_reduce.binary_tree"
    r, n = peers.rank, peers.size
    children = [c for c in (2 * r + 1, 2 * r + 2) if c < n]
    parent = (r - 1) // 2
    if children:
        inbox = flat.new_empty((len(children), flat.numel()))
        peers.exchange(recvs=list(zip(children, inbox, strict=True)), name=name + " up", step=0)
        for row in inbox:
            combine_(flat, row, op)
    if r > 0:
        peers.send(parent, flat, name=name + " up", step=1)
        peers.recv(parent, flat, name=name + " down", step=2)
    else:
        finish_(flat, op, n)
    if children:
        peers.exchange(sends=[(c, flat) for c in children], name=name + " down", step=3)


ALL_REDUCES = {
    "naive": all_reduce_naive_,
    "ring": all_reduce_ring_,
    "recursive_doubling": all_reduce_recursive_doubling_,
    "rabenseifner": all_reduce_rabenseifner_,
    "binary_tree": all_reduce_binary_tree_,
    "double_binary_tree": all_reduce_double_binary_tree_,
}
auto.AUTO_CANDIDATES["all_reduce"] = tuple(ALL_REDUCES)


def all_reduce(
    tensor: torch.Tensor,
    op: str = "sum",
    *,
    algorithm: str = "ring",
    group: Group = None,
    out: torch.Tensor | None = None,
    transport: str = "torch",
) -> torch.Tensor:
    """Combine every rank's ``tensor``; the result lands in ``out`` if given, else in ``tensor``.

    Every rank must pass the same number of elements, dtype, op and algorithm; a rank that does
    not makes every rank raise :class:`~dtlab.collectives.agreement.CollectiveMismatch`.
    ``algorithm="auto"`` runs the schedule the α-β model predicts fastest for this size and
    group (:mod:`~dtlab.collectives.auto`). ``transport="shm"`` runs the ring through
    shared memory instead of the process group's messages (CPU ranks of one host;
    :mod:`~dtlab.collectives.shm_transport`); the check then sees the algorithm ``"ring_shm"``,
    so ranks that disagree on the transport raise too.
    """
    auto.check_algorithm("all_reduce", algorithm, list(ALL_REDUCES))
    if transport not in ("torch", "shm") or (transport == "shm" and algorithm != "ring"):
        raise ValueError(
            f"transport={transport!r} with algorithm={algorithm!r}: choose transport='torch' "
            "(any algorithm) or transport='shm' with algorithm='ring'"
        )
    op = normalize_op(op)
    peers = peers_of(group)
    described = "ring_shm" if transport == "shm" else algorithm
    call = CallDescriptor("all_reduce", described, tensor.dtype, tensor.numel(), op=op)
    check_agreement(peers, auto.call_descriptor(call), tensor.device)
    target = tensor if out is None else out.copy_(tensor)
    flat, is_view = flat_view(target)
    if peers.size == 1 or flat.numel() == 0:
        finish_(flat, op, peers.size)
    else:
        chosen, choice = algorithm, None
        if algorithm == auto.AUTO:
            nbytes = flat.numel() * flat.element_size()
            choice = auto.choose_for_call(peers, "all_reduce", nbytes, flat.device)
            chosen = choice.algorithm
        with auto.labelled(algorithm, chosen):
            if transport == "shm":
                shm_ring_all_reduce_(flat, op, peers)
            else:
                ALL_REDUCES[chosen](flat, op, peers, **auto.schedule_options(choice))
    if not is_view:
        target.copy_(flat.view_as(target))
    return target
