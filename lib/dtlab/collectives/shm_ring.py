"""The pipelined ring all-reduce over shared-memory channels (``all_reduce(transport="shm")``).

Same algorithm as :mod:`dtlab.collectives.ring_pipeline` — the same ``2 (N-1)`` steps, chunks
and segments (:func:`~dtlab.collectives.ring_pipeline._ring_steps`), the same messages counted
(``2 (N-1)/N · M`` bytes per rank) and every element folded in the same order, so the result is
bitwise the socket ring's. What changes is where a segment travels
(:mod:`~dtlab.collectives.shm_transport`) and how many times it is copied on the way:

=====================  ==========================================  ===========================
step                   socket ring (gloo)                          shared-memory ring
=====================  ==========================================  ===========================
reduce-scatter         send: kernel copy in; receive: kernel copy  ``torch.add(mine, slot,
(not the last)         out to scratch; add scratch into buffer     out=right's slot)``: 1 pass
last reduce-scatter    as above                                    add into buffer, copy to slot
all-gather             kernel copy in, kernel copy out in place    copy slot → buffer and →
                                                                   right's slot
=====================  ==========================================  ===========================

A reduce-scatter step that is not the last never writes the partial sum to the rank's own
buffer: the chunk it belongs to is overwritten by the all-gather anyway, so the sum goes
straight into the next rank's slot. Nothing waits for a receive to be posted: a free slot *is*
the posted receive.
"""

from __future__ import annotations

import torch

from dtlab import trace
from dtlab.collectives.ops import finish_
from dtlab.collectives.p2p import Peers, comm_stats
from dtlab.collectives.ring_pipeline import SEGMENT_BYTES, _draw_steps, _ring_steps
from dtlab.collectives.shm_transport import channels_for, close_all


def _combine_into(out: torch.Tensor, mine: torch.Tensor, theirs: torch.Tensor, op: str) -> None:
    """``out = mine ⊕ theirs`` (``avg`` sums; :func:`finish_` divides at the end)."""
    if op in ("sum", "avg"):
        torch.add(mine, theirs, out=out)
    elif op == "max":
        torch.maximum(mine, theirs, out=out)
    else:
        torch.minimum(mine, theirs, out=out)


def shm_ring_all_reduce_(
    flat: torch.Tensor,
    op: str,
    peers: Peers,
    *,
    name: str = "all_reduce.ring_shm",
    segment_bytes: int = SEGMENT_BYTES,
) -> None:
    """All-reduce ``flat`` (1-D, contiguous, CPU) in place by the ring, through shared memory.

    Counted like the socket ring: one message per non-empty segment sent or received. If
    anything fails mid-call (a neighbour died), this rank closes its channels — so its own
    neighbours fail too instead of waiting — and re-raises.
    """
    if flat.device.type != "cpu":
        raise ValueError(f"transport='shm' moves CPU tensors only, got one on {flat.device}")
    n, itemsize = peers.size, flat.element_size()
    steps = _ring_steps(flat.numel(), itemsize, n, peers.rank, segment_bytes)
    count = len(steps[0].sends)
    per_slot = max(s.stop - s.start for step in steps for s in step.recvs)
    ring = channels_for(peers, count + 1, per_slot * itemsize)
    try:
        _run(flat, op, n, steps, ring)
    except BaseException:
        close_all()
        raise
    _draw_steps(steps, itemsize, peers, name)


def _run(flat: torch.Tensor, op: str, n: int, steps, ring) -> None:
    out, inbox, dtype, stats = ring.outbox, ring.inbox, flat.dtype, comm_stats()
    itemsize = flat.element_size()

    def sent(slot: torch.Tensor) -> None:
        out.ready.ring()
        stats.messages_sent += 1
        stats.bytes_sent += slot.numel() * itemsize

    for where in steps[0].sends:
        if where.stop > where.start:
            steps[0].mark_started()
            slot = out.acquire(where.stop - where.start, dtype)
            slot.copy_(flat[where])
            sent(slot)
    last = len(steps) - 1
    for t, step in enumerate(steps):
        for where in step.recvs:
            length = where.stop - where.start
            if not length:
                continue
            step.mark_started()
            theirs = inbox.take(length, dtype)
            stats.messages_received += 1
            stats.bytes_received += length * itemsize
            if step.folds and t < n - 2:  # a partial sum: straight into the right's slot
                slot = out.acquire(length, dtype)
                _combine_into(slot, flat[where], theirs, op)
                sent(slot)
            elif step.folds:  # the last fold: this segment of my chunk is final
                _combine_into(flat[where], flat[where], theirs, op)
                finish_(flat[where], op, n)
                slot = out.acquire(length, dtype)
                slot.copy_(flat[where])
                sent(slot)
            else:
                flat[where].copy_(theirs)
                if t < last:
                    slot = out.acquire(length, dtype)
                    slot.copy_(theirs)
                    sent(slot)
            inbox.free.ring()
        step.ended_ns = trace.now_ns()
