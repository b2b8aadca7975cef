"""Ring attention (Liu et al. 2023): queries stay, key/value blocks travel around the CP ring.

Sharded dimension: the sequence. Rank ``r`` of ``N`` holds its tokens' q, k, v (any positions —
contiguous or zig-zag, :mod:`~dtlab.parallel.context.sharding`). In step ``t = 0 … N−1`` it holds
the K/V block of rank ``r − t`` and folds it into its running ``(o, lse)`` with the exact
log-sum-exp merge (:mod:`~dtlab.parallel.context.blockwise`); no rank ever holds all of K/V.

Who sends what (``kv`` = bytes of one rank's k and v together, ``p`` = bytes of its positions):

==========  ===================================================  ===========================
pass        messages, each to the right neighbour ``r + 1``       bytes sent per rank
==========  ===================================================  ===========================
forward     the K/V block it holds (and its positions), N−1 times  (N−1)·(kv + p)
backward    K/V again, N−1 times; the block's dK/dV accumulator    (N−1)·(kv + p) + N·kv
            after each step, N times — the last send takes it home
==========  ===================================================  ===========================

Before the first step the ranks compare their shards' shapes — one tiny all-gather, a control
message not counted in ``comm.comm_stats`` (:mod:`~dtlab.parallel.context.agreement`) — so unequal
shards raise on every rank instead of aborting inside the transport.

Overlap: each step posts the next block's send and receive *before* computing on the current one
(``isend``/``irecv``, on transports that allow single messages in flight — gloo; otherwise
each step's exchange completes before its compute, without overlap). Causal: a block whose keys
all lie after every query of this rank is skipped (no scores computed), which is why contiguous
causal sharding leaves rank 0 idle most of the ring and zig-zag does not; of a partly masked
block only the queries that see some key and the keys that some query sees are computed
(:func:`~dtlab.parallel.context.blockwise.visible_part`) — under zig-zag half of every block
but the rank's own, on every rank alike. The messages go through the communication layer's non-blocking
point-to-point (:meth:`~dtlab.comm.Communicator.start_exchange`), which counts them into
``comm.comm_stats`` under ``"ring_send"``/``"ring_recv"`` whichever ``collectives=`` the communicator
was built with (the ring is point-to-point either way) and draws each step as a ``ring_kv`` /
``ring_dkv`` comm span plus the ``wait:`` idle span of its exposed part.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dtlab import trace
from dtlab.comm import Communicator
from dtlab.parallel.context.agreement import check_equal_shards
from dtlab.parallel.context.blockwise import (
    block_attention,
    block_attention_backward,
    block_is_masked,
    merge,
    take,
    unmasked_scores,
    visible_part,
)


@dataclass
class AttentionWork:
    """What one rank's attention computed, summed over the forward passes it was handed to:
    blocks done and skipped, unmasked score elements (per batch row and head), and the matmul
    FLOPs the forward executed (``Q·Kᵀ`` and ``P·V`` on the visible sub-blocks, counted from the
    shapes actually multiplied: 4·B·H·rows·cols·Dh per block), and ``forward_cpu_ns``: the CPU
    time this rank's thread spent in those block computations (``time.thread_time_ns``). With
    CPU tensors and one intra-op thread per rank (the Cluster's setting when ranks share the
    cores) that is the compute itself, not inflated when other processes take the core the way a
    wall-clock span is; with CUDA tensors it only counts kernel launches, so use the trace's
    spans there."""

    blocks_computed: int = 0
    blocks_skipped: int = 0
    unmasked_scores: int = 0
    forward_flops: int = 0
    forward_cpu_ns: int = 0


def _visible_attention(q, k, v, positions_q, positions_k, causal, work):
    """One block's ``(o, lse)`` for all of this rank's queries, computing only its visible part."""
    rows, cols = visible_part(positions_q, positions_k, causal)
    q_s, k_s, v_s = take(q, rows), take(k, cols), take(v, cols)
    o_s, lse_s = block_attention(
        q_s, k_s, v_s, take(positions_q, rows, 0), take(positions_k, cols, 0), causal=causal
    )
    if work is not None:
        b, h, r, d = q_s.shape
        work.forward_flops += 4 * b * h * r * k_s.shape[2] * d
    if rows is None:
        return o_s, lse_s
    o = o_s.new_zeros(*q.shape[:3], v.shape[-1]).index_copy_(2, rows, o_s)
    lse = lse_s.new_full(q.shape[:3], float("-inf")).index_copy_(2, rows, lse_s)
    return o, lse


def _visible_backward(d_out, q, k, v, out, lse, positions_q, positions_k, causal):
    """One block's ``(dq, dk, dv)`` at full shape, computing only its visible part."""
    rows, cols = visible_part(positions_q, positions_k, causal)
    dq_s, dk_s, dv_s = block_attention_backward(
        take(d_out, rows), take(q, rows), take(k, cols), take(v, cols), take(out, rows),
        take(lse, rows), take(positions_q, rows, 0), take(positions_k, cols, 0), causal=causal,
    )  # fmt: skip
    if rows is not None:
        dq_s = torch.zeros_like(q).index_add_(2, rows, dq_s)
    if cols is not None:
        dk_s = torch.zeros_like(k).index_add_(2, cols, dk_s)
        dv_s = torch.zeros_like(v).index_add_(2, cols, dv_s)
    return dq_s, dk_s, dv_s


class _Ring:
    """This rank's two neighbours on the CP ring (group ranks of ``comm``)."""

    def __init__(self, comm: Communicator) -> None:
        self.comm, self.size = comm, comm.world_size
        self.right, self.left = (comm.rank + 1) % self.size, (comm.rank - 1) % self.size

    def post(
        self, outgoing: list[torch.Tensor], name: str = "ring_kv"
    ) -> tuple[list[torch.Tensor], Callable[[], None]]:
        """Start sending ``outgoing`` right and receiving their like from the left; returns the
        receive buffers and ``wait``, which blocks until every message has moved. Counting and
        spans are the communication layer's (:meth:`Communicator.start_exchange`)."""
        outgoing = [t.contiguous() for t in outgoing]
        incoming = [torch.empty_like(t) for t in outgoing]  # contiguous too: irecv needs it
        pending = self.comm.start_exchange(
            [(self.right, t) for t in outgoing],
            [(self.left, t) for t in incoming],
            name=name,
            op="ring",
        )
        return incoming, pending.wait


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, positions_q, positions_k, comm, causal, work):
        ring = _Ring(comm)
        held = [k, v, positions_k]
        out, lse = None, None
        for step in range(ring.size):
            pending = ring.post(held) if step < ring.size - 1 else None
            k_blk, v_blk, pos_blk = held
            if block_is_masked(positions_q, pos_blk, causal):
                if work is not None:
                    work.blocks_skipped += 1
            else:
                cpu_start = time.thread_time_ns()
                with trace.span("ring_block_forward", kind="compute", ring_step=step):
                    o_blk, lse_blk = _visible_attention(
                        q, k_blk, v_blk, positions_q, pos_blk, causal, work
                    )
                out, lse = (o_blk, lse_blk) if out is None else merge(out, lse, o_blk, lse_blk)
                if work is not None:
                    work.forward_cpu_ns += time.thread_time_ns() - cpu_start
                    work.blocks_computed += 1
                    work.unmasked_scores += unmasked_scores(positions_q, pos_blk, causal)
            if pending is not None:
                held, wait = pending
                wait()
        ctx.save_for_backward(q, k, v, positions_q, positions_k, out, lse)
        ctx.comm, ctx.causal = comm, causal
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, positions_q, positions_k, out, lse = ctx.saved_tensors
        ring = _Ring(ctx.comm)
        d_out = d_out.contiguous()
        dq = torch.zeros_like(q)
        held = [k, v, positions_k]
        d_kv = [torch.zeros_like(k), torch.zeros_like(v)]  # travels with the block it belongs to
        for step in range(ring.size):
            pending = ring.post(held) if step < ring.size - 1 else None
            k_blk, v_blk, pos_blk = held
            if not block_is_masked(positions_q, pos_blk, ctx.causal):
                with trace.span("ring_block_backward", kind="compute", ring_step=step):
                    dq_blk, dk_blk, dv_blk = _visible_backward(
                        d_out, q, k_blk, v_blk, out, lse, positions_q, pos_blk, ctx.causal
                    )
                dq += dq_blk
                d_kv = [d_kv[0] + dk_blk, d_kv[1] + dv_blk]
            if pending is not None:
                held, wait = pending
                wait()
            if ring.size > 1:  # after the last step this send takes each accumulator home
                d_kv, wait_grads = ring.post(d_kv, name="ring_dkv")
                wait_grads()
        return dq, d_kv[0], d_kv[1], None, None, None, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions_q: torch.Tensor,
    positions_k: torch.Tensor,
    comm: Communicator,
    *,
    causal: bool = True,
    work: AttentionWork | None = None,
) -> torch.Tensor:
    """Exact attention of this rank's q (B, H, Sq, Dh) over the k, v (B, Hkv, Sk, Dh) of every
    rank of ``comm``. ``positions_q`` and ``positions_k`` are the global positions (S,) int64 of
    this rank's own queries and keys; other ranks' key positions travel with their blocks.
    Differentiable in q, k, v (dk, dv come back to the rank that owns them).
    ``work``, if given, is incremented with what this rank computed.

    Every rank must hold shards of one shape (as :func:`~dtlab.parallel.context.shard_sequence`
    cuts them): before any block moves the ranks compare shapes, and on a mismatch every rank
    raises :class:`~dtlab.collectives.CollectiveMismatch` naming each rank's length
    (:mod:`~dtlab.parallel.context.agreement`)."""
    if positions_q.dim() != 1 or positions_k.dim() != 1:
        raise ValueError("ring attention takes positions of shape (S,), one per token")
    check_equal_shards(q, k, v, positions_q, positions_k, comm, "ring")
    return _RingAttention.apply(q, k, v, positions_q, positions_k, comm, causal, work)


def ring_core(comm: Communicator, work: AttentionWork | None = None):
    """An attention core (``block.attn.core = ring_core(comm)``) running :func:`ring_attention`
    over ``comm``: feed the model this rank's tokens and their global positions."""

    def core(q, k, v, positions_q, positions_k, *, causal=True, dropout_p=0.0):
        if dropout_p > 0:
            raise ValueError(
                "ring attention does not drop attention weights; set config.dropout=0 or call "
                "model.eval()"
            )
        return ring_attention(q, k, v, positions_q, positions_k, comm, causal=causal, work=work)

    return core
