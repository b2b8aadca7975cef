"""All-gather K/V context parallelism (Llama 3's CP; Dubey et al. 2024, §3.3.2): the simple one.

Sharded dimension: the sequence (queries stay sharded). Every rank all-gathers the k and v of
every rank's tokens, with their positions, and runs ordinary attention of its own queries
against all keys; the backward reduce-scatters dK and dV home (:func:`dtlab.comm.gather_along`).
Bytes each rank sends per attention call, ``kv`` = bytes of one rank's k and v together: forward
``(N−1)·kv`` (all-gather of ``N·kv``), backward ``(N−1)·kv`` (reduce-scatter) — the ring's
volume, but in one collective that cannot hide behind compute, and every rank then holds the
full K/V (memory ``S``, not ``S/N``). With grouped-query attention K/V are small, which is why
Llama 3 chose it.
"""

from __future__ import annotations

import torch

from dtlab.comm import Communicator, gather_along
from dtlab.models.attention import math_attention
from dtlab.parallel.context.agreement import check_equal_shards


def allgather_attention(
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
    """Exact attention of this rank's q (B, H, Sq, Dh) over every rank's k, v (B, Hkv, Sk, Dh).

    Every rank must hold shards of one shape; on a mismatch every rank raises
    :class:`~dtlab.collectives.CollectiveMismatch` before K/V move
    (:mod:`~dtlab.parallel.context.agreement`)."""
    if positions_q.dim() != 1 or positions_k.dim() != 1:
        raise ValueError("all-gather attention takes positions of shape (S,), one per token")
    check_equal_shards(q, k, v, positions_q, positions_k, comm, "allgather")
    everyone = torch.empty(
        comm.world_size * positions_k.numel(), dtype=positions_k.dtype, device=positions_k.device
    )
    comm.all_gather(everyone, positions_k.contiguous(), name="cp_positions")
    k_all, v_all = (gather_along(t.contiguous(), 2, comm) for t in (k, v))
    return math_attention(
        q, k_all, v_all, positions_q, everyone, causal=causal, dropout_p=dropout_p
    )


def allgather_core(comm: Communicator):
    """An attention core (``block.attn.core = allgather_core(comm)``) running
    :func:`allgather_attention` over ``comm``."""

    def core(q, k, v, positions_q, positions_k, *, causal=True, dropout_p=0.0):
        return allgather_attention(
            q, k, v, positions_q, positions_k, comm, causal=causal, dropout_p=dropout_p
        )

    return core
