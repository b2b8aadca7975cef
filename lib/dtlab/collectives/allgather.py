"""All-gather: every rank contributes one chunk; every rank ends with all ``N`` chunks in rank order.

Rank ``r`` sends ``M - |chunk r+1|`` (ring) or the chunks it gathered so far (recursive doubling):
``(N-1)/N · M`` bytes when chunks are equal and ``N`` is a power of two, where ``M`` is the size
of the *gathered* buffer.

``ring``
    ``N-1`` steps. At step ``s`` rank ``r`` forwards chunk ``r-s`` to its right neighbour and
    receives chunk ``r-s-1`` from its left. Time ``(N-1)(α + M/N · β)``.
``recursive_doubling``
    ``log2 N`` steps. At step ``k`` rank ``r`` swaps everything it holds with rank ``r XOR 2^k``;
    what it holds doubles each time. Time ``log2 N · α + (N-1)/N · M β``: the ring's bytes in
    ``log N`` instead of ``N-1`` latencies. For ``N`` not a power of two the first ``2(N-p)``
    ranks pair up first (``p`` the largest power of two ≤ ``N``), as in MPICH (Thakur et al. 2005).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dtlab.collectives import auto
from dtlab.collectives.agreement import (
    CallDescriptor,
    CollectiveMismatch,
    check_agreement,
    describe_by_rank,
)
from dtlab.collectives.ops import chunk_bounds, flat_view, largest_power_of_two_at_most
from dtlab.collectives.p2p import Group, Peers, peers_of


def all_gather_ring_(
    flat: torch.Tensor,
    peers: Peers,
    bounds: Sequence[tuple[int, int]] | None = None,
    *,
    name: str = "all_gather.ring",
) -> None:
    """In place: chunk ``rank`` of ``flat`` is filled in; afterwards every chunk is."""
    n, r = peers.size, peers.rank
    bounds = bounds or chunk_bounds(flat.numel(), n)
    for s in range(n - 1):
        out_lo, out_hi = bounds[(r - s) % n]
        in_lo, in_hi = bounds[(r - s - 1) % n]
        peers.exchange(
            sends=[(peers.right, flat[out_lo:out_hi])],
            recvs=[(peers.left, flat[in_lo:in_hi])],
            name=name,
            step=s,
        )


def all_gather_recursive_doubling_(
    flat: torch.Tensor,
    peers: Peers,
    bounds: Sequence[tuple[int, int]] | None = None,
    *,
    name: str = "all_gather.recursive_doubling",
) -> None:
    """In place, in ``ceil(log2 N)`` (+2 when ``N`` is not a power of two) steps."""
    n, r = peers.size, peers.rank
    bounds = bounds or chunk_bounds(flat.numel(), n)
    p = largest_power_of_two_at_most(n)
    extra = n - p

    # Fold: among the first 2*extra ranks, even r hands its chunk to r + 1 and sits out; the
    # p remaining "new ranks" each speak for a contiguous run of real ranks.
    def first_real(new: int) -> int:
        return 2 * new if new < extra else new + extra

    def last_real(new: int) -> int:  # also the real rank that is active for ``new``
        return 2 * new + 1 if new < extra else new + extra

    def elements_of(new_lo: int, count: int) -> torch.Tensor:
        return flat[bounds[first_real(new_lo)][0] : bounds[last_real(new_lo + count - 1)][1]]

    if r < 2 * extra:
        if r % 2 == 0:
            peers.send(r + 1, flat[slice(*bounds[r])], name=name, step=0)
            peers.recv(r + 1, flat, name=name, step=p.bit_length() + 1)
            return
        peers.recv(r - 1, flat[slice(*bounds[r - 1])], name=name, step=0)
        new = r // 2
    else:
        new = r - extra
    for k in range(p.bit_length() - 1):
        mask = 1 << k
        partner = new ^ mask
        # Before step k each new rank holds the 2^k new ranks of its aligned block.
        mine, theirs = new & ~(mask - 1), partner & ~(mask - 1)
        peers.exchange(
            sends=[(last_real(partner), elements_of(mine, mask))],
            recvs=[(last_real(partner), elements_of(theirs, mask))],
            name=name,
            step=k + 1,
        )
    if r < 2 * extra:
        peers.send(r - 1, flat, name=name, step=p.bit_length() + 1)


ALL_GATHERS = {"ring": all_gather_ring_, "recursive_doubling": all_gather_recursive_doubling_}
auto.AUTO_CANDIDATES["all_gather"] = tuple(ALL_GATHERS)


def all_gather(
    chunk: torch.Tensor,
    *,
    algorithm: str = "ring",
    group: Group = None,
    sizes: Sequence[int] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every rank's ``chunk`` (flattened), concatenated in rank order, as a 1-D tensor.

    Chunks may differ in length across ranks: pass every rank's element count as ``sizes``
    (the same list on every rank). Without ``sizes`` every chunk is assumed as long as this one.
    The ranks compare their chunks' lengths first (a control message), so a wrong ``sizes`` or
    unequal chunks without it raise :class:`~dtlab.collectives.agreement.CollectiveMismatch`
    on every rank, naming each rank's length, instead of hanging. The result is a new tensor, or ``out`` (contiguous, ``sum(sizes)`` elements, the chunk's
    dtype) when given — as ``all_gather_into_tensor`` reuses its output, sparing a fresh buffer's
    page faults on every call. ``algorithm="auto"`` runs the schedule the α-β model predicts
    fastest (:mod:`~dtlab.collectives.auto`; ``M`` is the gathered buffer's bytes).
    """
    auto.check_algorithm("all_gather", algorithm, list(ALL_GATHERS))
    peers = peers_of(group)
    if sizes is not None:
        sizes = [int(s) for s in sizes]
        if len(sizes) != peers.size:
            raise ValueError(
                f"sizes {sizes} must list one element count per rank of the {peers.size}-rank group"
            )
    call = CallDescriptor(
        "all_gather",
        algorithm,
        chunk.dtype,
        chunk.numel(),
        counts=None if sizes is None else tuple(sizes),
    )
    calls = check_agreement(
        peers, auto.call_descriptor(call), chunk.device, same_numel=False, numels=sizes
    )
    held = [c.numel for c in calls]
    expected = [list(c.counts) if c.counts is not None else [c.numel] * peers.size for c in calls]
    if all(c.counts is None for c in calls) and len(set(held)) > 1:
        raise CollectiveMismatch(
            "all_gather without sizes needs chunks of one length, but the ranks' chunks have "
            f"{describe_by_rank(held, peers.global_ranks)} elements. To fix: pass "
            f"sizes={held} on every rank."
        )
    if any(e != held for e in expected):
        raise CollectiveMismatch(
            f"all_gather: the ranks' chunks have {held} elements, but the ranks expected "
            f"{describe_by_rank(expected, peers.global_ranks)} (their sizes=, or without it, "
            f"every chunk as long as the rank's own). To fix: pass sizes={held} on every rank."
        )
    sizes = held
    starts = [sum(sizes[:i]) for i in range(peers.size)]
    bounds = [(start, start + size) for start, size in zip(starts, sizes, strict=True)]
    if out is None:
        out = chunk.new_empty(sum(sizes))
    elif not (out.is_contiguous() and out.numel() == sum(sizes) and out.dtype == chunk.dtype):
        raise ValueError(
            f"out must be a contiguous {chunk.dtype} tensor of {sum(sizes)} elements (the sum of "
            f"sizes), got {out.dtype} {tuple(out.shape)}"
        )
    else:
        out = out.view(-1)
    out[slice(*bounds[peers.rank])] = flat_view(chunk)[0]
    if peers.size > 1:
        chosen = algorithm
        if algorithm == auto.AUTO:
            nbytes = out.numel() * out.element_size()
            chosen = auto.choose_for_call(peers, "all_gather", nbytes, out.device).algorithm
        with auto.labelled(algorithm, chosen):
            ALL_GATHERS[chosen](out, peers, bounds)
    return out
