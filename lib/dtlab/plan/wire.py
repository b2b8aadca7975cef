"""Bytes on the wire per layer and micro-batch: tensor parallelism as Megatron-LM runs it, and
what only context and expert parallelism send.

Sizes: ``b`` micro-batch (sequences), ``s`` sequence length, ``c`` the CP degree, ``t`` TP,
``p`` EP, ``k`` experts per token, ``d`` width, ``e`` bytes per element (bf16: 2). Each function
returns what **one rank sends** (it receives as much), from :mod:`dtlab.cost.volumes`' formulas.

* **Tensor parallelism** (Shoeybi et al. 2019; with sequence parallelism Korthikanti et al.
  2022, Sec. 4.2.2): per layer two all-reduces of ``b·s·h·e`` forward and two backward, or with
  SP two all-gathers and two reduce-scatters each way (the same bytes) plus backward's
  :data:`SP_BACKWARD_REGATHERS`, each collective sending ``(t−1)/t`` of the tensor
  (:func:`tp_bytes_per_layer`). Full recomputation repeats forward's
  (:func:`tp_forward_share`).
* **Ring attention** (Liu et al. 2023, "Ring Attention with Blockwise Transformers for
  Near-Infinite Context", Sec. 3): a rank holds ``s/c`` tokens; in ``c − 1`` steps it passes the K
  and V blocks it holds to the next rank, ``2·b·(s/c)·kv_width/t·e`` each step
  (:func:`dtlab.cost.volumes.ring_attention_kv_bytes`, ``kv_width/t`` being the K/V heads of
  this TP rank, at least one head: grouped-query heads are replicated when ``t`` exceeds them).
  The backward pass circulates K and V again and their gradients with them: twice the forward
  bytes. Full recomputation runs the forward ring once more. So per layer and micro-batch
  ``3·(c−1)·2·b·(s/c)·kv/t·e``, or ``4·(…)`` with full recompute (flash-style attention keeps
  no scores, so selective recompute adds no ring pass).
* **Expert parallelism** (Lepikhin et al. 2020, GShard; Fedus et al. 2021, Switch): per MoE layer
  and micro-batch, the dispatch and combine all-to-alls in forward and both again in backward,
  each ``k·T·d·e·(p−1)/p`` for the ``T`` tokens the rank routes
  (:func:`dtlab.cost.volumes.moe_all_to_all_bytes_per_layer`, capacity factor 1, uniform
  routing). With TP + sequence parallelism a rank routes the ``T = b·(s/c)/t`` tokens of its
  sequence shard (Megatron-Core's MoE dispatch works on the SP-sharded tokens; an assumption
  for other implementations); full recomputation repeats forward's two all-to-alls.
"""

from __future__ import annotations

from dtlab.cost.volumes import (
    moe_all_to_all_bytes_per_layer,
    ring_attention_kv_bytes,
    sp_collective_volume_per_layer,
)
from dtlab.plan.job import Requirements
from dtlab.plan.parallel_plan import ParallelPlan

SP_BACKWARD_REGATHERS = 2
"""All-gathers sequence parallelism adds to each layer's backward: the LayerNorm outputs in front
of the QKV and first MLP GEMMs are stored ``1/t`` and gathered again for those GEMMs' weight
gradients (Korthikanti et al. 2022, Sec. 4.2.2: "we store only the Y_i^s part ... and perform an
extra all-gather in the backward pass", overlapped with the input-gradient GEMM)."""


def tp_collectives_per_layer(plan: ParallelPlan) -> tuple[int, int]:
    """(forward, backward) TP collectives of one layer, counted in reduce-scatter- or
    all-gather-sized units (an all-reduce is two): 4 and 4 without SP, 4 and 6 with it."""
    regathers = SP_BACKWARD_REGATHERS if plan.sequence_parallel else 0
    return 4, 4 + regathers


def tp_forward_share(plan: ParallelPlan) -> float:
    """Forward's share of :func:`tp_bytes_per_layer`: 4 of 8 without SP, 4 of 10 with it."""
    forward, backward = tp_collectives_per_layer(plan)
    return forward / (forward + backward)


def tp_bytes_per_layer(req: Requirements, plan: ParallelPlan, bytes_per_elem: int = 2) -> float:
    """Bytes one TP rank sends for one layer and micro-batch, forward and backward (module
    docstring); 0 without TP."""
    if plan.tp == 1:
        return 0.0
    volume = sp_collective_volume_per_layer(
        req.seq_len // plan.cp, plan.micro_batch_size, req.d_model, plan.tp, bytes_per_elem
    )
    return volume.bytes_sent_per_rank / volume.collectives * sum(tp_collectives_per_layer(plan))


def kv_width_per_tp_rank(req: Requirements, plan: ParallelPlan) -> int:
    """K (or V) values per token on one TP rank: ``kv_width/t``, at least one head's worth."""
    head_dim = req.d_model // req.n_heads
    return max(req.kv_width // plan.tp, head_dim)


def ring_attention_bytes_per_layer(
    req: Requirements, plan: ParallelPlan, bytes_per_elem: int = 2
) -> float:
    """One layer, one micro-batch, forward and backward: ``passes·(c−1)·2·b·(s/c)·kv/t·e`` with
    ``passes`` 3 (forward, backward's K/V and their gradients) or 4 with full recompute; 0 at
    ``c = 1``."""
    if plan.cp == 1:
        return 0.0
    forward = ring_attention_kv_bytes(
        req.seq_len,
        plan.micro_batch_size,
        kv_width_per_tp_rank(req, plan),
        plan.cp,
        bytes_per_elem,
    ).bytes_sent_per_rank
    return (4 if plan.recompute == "full" else 3) * forward


def tokens_routed_per_rank(req: Requirements, plan: ParallelPlan) -> int:
    """Tokens one rank dispatches per micro-batch: ``b·(s/c)/t`` (sequence-parallel shard)."""
    return max(1, plan.micro_batch_size * req.seq_len // (plan.cp * plan.tp))


def expert_all_to_all_bytes_per_layer(
    req: Requirements, plan: ParallelPlan, bytes_per_elem: int = 2
) -> float:
    """One MoE layer, one micro-batch: ``4·k·T·d·e·(p−1)/p`` (dispatch and combine, forward and
    backward), ``6·…`` with full recompute; 0 for a dense model or ``p = 1``."""
    if not req.is_moe or plan.ep == 1:
        return 0.0
    volume = moe_all_to_all_bytes_per_layer(
        tokens_routed_per_rank(req, plan), req.d_model, req.top_k, plan.ep, 1.0, bytes_per_elem
    )
    forward = volume.bytes_sent_per_rank / 2
    return volume.bytes_sent_per_rank + (forward if plan.recompute == "full" else 0.0)
