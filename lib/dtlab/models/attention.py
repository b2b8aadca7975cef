"""Causal self-attention, split into projections (the module) and a pluggable *core* (a function).

:class:`CausalSelfAttention` owns the four Linear layers that tensor parallelism shards —
``q_proj``/``k_proj``/``v_proj`` by output columns, ``out_proj`` by input rows (Shoeybi et al.
2019, Megatron-LM) — and hands the per-head tensors to ``self.core``::

    q (B, H, Sq, Dh), k and v (B, Hkv, Sk, Dh), positions_q (Sq,), positions_k (Sk,)
        ──core──► out (B, H, Sq, Dh)

The core is the only part that has to see every key of a query. Context parallelism swaps it
(``block.attn.core = ring_core``) for one that fetches the other ranks' k and v — ring attention
(Liu et al. 2023), DeepSpeed-Ulysses (Jacobs et al. 2023) — while the projections stay local.
The core receives k and v *before* grouped-query repetition (``Hkv`` heads), so a parallel core
moves ``n_kv_heads · head_dim`` values per token, not ``d_model``.

Positions are explicit: a context-parallel rank holds tokens whose global positions are not
``0..S-1`` (zig-zag sharding gives rank ``r`` chunks ``r`` and ``2c-1-r``), and the causal mask
must compare global positions — query ``i`` sees key ``j`` iff ``positions_k[j] <=
positions_q[i]``. ``positions`` may also be ``(B, S)`` when rows differ.

Grouped-query attention (Ainslie et al. 2023, GQA): ``n_kv_heads`` divides ``n_heads``; query
head ``i`` reads kv head ``i // (n_heads / n_kv_heads)``. Each module derives its local head
counts from its projections' widths, so a tensor-parallel shard (fewer columns) simply runs fewer
heads — as long as every shard keeps whole KV-head groups (:func:`dtlab.mesh.validate_layout`).
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtlab.models.config import GPTConfig
from dtlab.models.dropout import residual_dropout


class AttentionCore(Protocol):
    """What ``CausalSelfAttention.core`` must be: ``(q, k, v, positions_q, positions_k) -> out``."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions_q: torch.Tensor,
        positions_k: torch.Tensor,
        *,
        causal: bool = True,
        dropout_p: float = 0.0,
    ) -> torch.Tensor: ...


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, Hkv, S, Dh) → (B, Hkv·n_rep, S, Dh), each kv head repeated for its ``n_rep`` query
    heads (head ``j`` becomes heads ``j·n_rep … j·n_rep + n_rep - 1``). ``n_rep == 1``: ``x``."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def future_mask(positions_q: torch.Tensor, positions_k: torch.Tensor) -> torch.Tensor:
    """``True`` where a key lies after its query: (Sq, Sk), or (B, 1, Sq, Sk) for (B, S) positions."""
    mask = positions_k.unsqueeze(-2) > positions_q.unsqueeze(-1)
    return mask.unsqueeze(-3) if mask.dim() == 3 else mask


def math_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions_q: torch.Tensor,
    positions_k: torch.Tensor,
    *,
    causal: bool = True,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """The default core: ``softmax(q·kᵀ/√Dh + mask) · v`` written out (Vaswani et al. 2017).

    q (B, H, Sq, Dh); k, v (B, Hkv, Sk, Dh) with ``Hkv`` dividing ``H``; returns (B, H, Sq, Dh).
    Materialises the (B, H, Sq, Sk) scores — the memory that FlashAttention and ring attention
    avoid. ``dropout_p`` drops attention weights (pass 0 in eval). A query that sees no key gets
    NaN: every query must see at least itself, as it does when positions_k ⊇ positions_q.
    """
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads:
        raise ValueError(
            f"{heads} query heads cannot share {kv_heads} kv heads evenly; shard q_proj and "
            "k_proj/v_proj so each rank keeps whole groups of n_heads/n_kv_heads query heads"
        )
    k, v = repeat_kv(k, heads // kv_heads), repeat_kv(v, heads // kv_heads)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))  # (B, H, Sq, Sk)
    if causal:
        scores = scores.masked_fill(future_mask(positions_q, positions_k), float("-inf"))
    weights = F.softmax(scores, dim=-1)
    if dropout_p > 0:
        weights = F.dropout(weights, dropout_p)
    return weights @ v


class CausalSelfAttention(nn.Module):
    """Multi-head (or grouped-query) causal self-attention with separate q, k, v projections.

    ``q_proj``: d → n_heads·Dh; ``k_proj``, ``v_proj``: d → n_kv_heads·Dh; ``out_proj``: d → d.
    ``core`` (default :func:`math_attention`) may be replaced after construction.
    """

    def __init__(
        self,
        config: GPTConfig,
        device: torch.device | str | None = None,
        core: AttentionCore | None = None,
    ) -> None:
        super().__init__()
        d, bias = config.d_model, config.bias
        kv_width = config.n_kv_heads * config.head_dim
        self.head_dim = config.head_dim
        self.dropout = config.dropout
        self.q_proj = nn.Linear(d, d, bias=bias, device=device)
        self.k_proj = nn.Linear(d, kv_width, bias=bias, device=device)
        self.v_proj = nn.Linear(d, kv_width, bias=bias, device=device)
        self.out_proj = nn.Linear(d, d, bias=bias, device=device)
        self.core = math_attention if core is None else core

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, S, d) at ``positions`` (S,) or (B, S) — default ``0..S-1`` — to (B, S, d)."""
        batch, seq, _ = x.shape
        if positions is None:
            positions = torch.arange(seq, device=x.device)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        heads = q.shape[-1] // self.head_dim  # fewer when q_proj is column-sharded (TP)
        q, k, v = (t.view(batch, seq, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        dropout_p = self.dropout if self.training else 0.0
        out = self.core(q, k, v, positions, positions, causal=True, dropout_p=dropout_p)
        out = out.transpose(1, 2).reshape(batch, seq, heads * self.head_dim)
        return residual_dropout(self.out_proj(out), self.dropout, self.training)
