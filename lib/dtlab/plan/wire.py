"""Bytes on the wire that only context and expert parallelism send, per layer and micro-batch.

Sizes: ``b`` micro-batch (sequences), ``s`` sequence length, ``c`` the CP degree, ``t`` TP,
``p`` EP, ``k`` experts per token, ``d`` width, ``e`` bytes per element (bf16: 2). Each function
returns what **one rank sends** (it receives as much), from :mod:`dtlab.cost.volumes`' formulas.

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

from dtlab.cost.volumes import moe_all_to_all_bytes_per_layer, ring_attention_kv_bytes
from dtlab.plan.job import Requirements
from dtlab.plan.parallel_plan import ParallelPlan


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
