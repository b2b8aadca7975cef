"""DeepSpeed-Ulysses (Jacobs et al. 2023): trade the sequence shard for a head shard, attend, trade back.

Sharded dimension: the sequence outside attention, the heads inside it. With ``N`` CP ranks each
holding ``S/N`` tokens of all ``H`` query and ``Hkv`` key/value heads:

1. all-to-all q, k, v: rank ``r`` sends heads ``j·H/N … (j+1)·H/N − 1`` of its tokens to rank
   ``j`` and receives its own head slice of every rank's tokens — now it holds *all* ``S`` tokens
   of ``H/N`` heads (and ``Hkv/N`` KV heads, so each query head keeps its KV group);
2. ordinary full attention on those heads (the positions of all tokens, all-gathered once);
3. all-to-all the output back to sequence-sharded, all heads.

The backward of each all-to-all is the inverse all-to-all (:func:`dtlab.comm.all_to_all_rows`).
Bytes each rank sends per attention call (fp ``b`` bytes per value, ``B`` rows, head dim ``Dh``):
``(N−1)/N · B·(S/N)·Dh·b · (H + 2·Hkv)`` for q, k, v and ``(N−1)/N · B·(S/N)·Dh·b · H`` for the
output; the same again in backward. The volume per rank falls as ``1/N`` (the ring's does not),
but ``N`` cannot exceed the number of KV heads. Every rank must hold ``S/N`` tokens; the ranks
check that first with a control message not counted in ``comm.comm_stats``
(:mod:`~dtlab.parallel.context.agreement`).
"""

from __future__ import annotations

import torch

from dtlab.comm import Communicator, all_to_all_rows
from dtlab.mesh.layout_rules import raise_problems, ulysses_problems
from dtlab.models.attention import math_attention
from dtlab.parallel.context.agreement import check_equal_shards


def check_heads(heads: int, kv_heads: int, cp: int) -> None:
    """Refuse a CP degree that does not divide the query and KV heads, naming what fits
    (:func:`dtlab.mesh.layout_rules.ulysses_problems`)."""
    raise_problems(ulysses_problems(cp, heads, kv_heads))


def _sequence_to_heads(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """(B, H, S/N, Dh) sequence shard → (B, H/N, S, Dh) head shard (source ranks' tokens in
    rank order along S)."""
    n = comm.world_size
    b, h, s, d = x.shape
    rows = x.permute(1, 0, 2, 3).reshape(h, b * s * d)  # head j·H/N… goes to rank j
    got = all_to_all_rows(rows.contiguous(), comm)  # (N · H/N): rank i's tokens, my heads
    return got.view(n, h // n, b, s, d).permute(2, 1, 0, 3, 4).reshape(b, h // n, n * s, d)


def _heads_to_sequence(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """The inverse: (B, H/N, S, Dh) → (B, H, S/N, Dh)."""
    n = comm.world_size
    b, hn, s_full, d = x.shape
    s = s_full // n
    rows = x.view(b, hn, n, s, d).permute(2, 1, 0, 3, 4).reshape(n * hn, b * s * d)
    got = all_to_all_rows(rows.contiguous(), comm)  # rank j's heads of my tokens, rank order
    return got.view(n * hn, b, s, d).permute(1, 0, 2, 3)


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions_q: torch.Tensor,
    positions_k: torch.Tensor,
    comm: Communicator,
    *,
    causal: bool = True,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Exact attention of this rank's tokens over every rank's, by two all-to-alls.

    q (B, H, S/N, Dh), k and v (B, Hkv, S/N, Dh), positions (S/N,) of this rank's tokens (q and
    k the same tokens, as in self-attention); returns (B, H, S/N, Dh). Every rank must hold
    ``S/N`` tokens: the ranks compare shapes before the first all-to-all and, on a mismatch,
    all raise :class:`~dtlab.collectives.CollectiveMismatch` naming each rank's length
    (:mod:`~dtlab.parallel.context.agreement`).
    """
    check_heads(q.shape[1], k.shape[1], comm.world_size)
    if positions_q.dim() != 1 or positions_k.dim() != 1:
        raise ValueError("Ulysses attention takes positions of shape (S,), one per token")
    check_equal_shards(q, k, v, positions_q, positions_k, comm, "ulysses")
    everyone = torch.empty(
        comm.world_size * positions_k.numel(), dtype=positions_k.dtype, device=positions_k.device
    )
    comm.all_gather(everyone, positions_k.contiguous(), name="ulysses_positions")
    q_h, k_h, v_h = (_sequence_to_heads(t, comm) for t in (q, k, v))
    out = math_attention(q_h, k_h, v_h, everyone, everyone, causal=causal, dropout_p=dropout_p)
    return _heads_to_sequence(out, comm)


def ulysses_core(comm: Communicator):
    """An attention core (``block.attn.core = ulysses_core(comm)``) running
    :func:`ulysses_attention` over ``comm``."""

    def core(q, k, v, positions_q, positions_k, *, causal=True, dropout_p=0.0):
        return ulysses_attention(
            q, k, v, positions_q, positions_k, comm, causal=causal, dropout_p=dropout_p
        )

    return core
