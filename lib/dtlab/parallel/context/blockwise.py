"""Attention one key block at a time, exactly: the online softmax and its log-sum-exp merge.

Softmax over a row of scores ``s_1 … s_n`` needs every score of that row. Split the keys into
blocks ``A`` and ``B`` and keep, per block and per query, the *normalised* output and the
log-sum-exp of its scores (Milakov & Gimelshein 2018, "Online normalizer calculation for
softmax"; the same recurrence as FlashAttention, Dao et al. 2022)::

    lse_A = log Σ_{j∈A} exp(s_j)            o_A = Σ_{j∈A} exp(s_j − lse_A) · v_j
    lse   = log(exp(lse_A) + exp(lse_B))    (= max + log(exp(lse_A − max) + exp(lse_B − max)))
    o     = exp(lse_A − lse) · o_A + exp(lse_B − lse) · o_B

``o`` and ``lse`` are then exactly those of the full row, so blocks can arrive in any order, on
any rank — what ring attention does. A query that sees no key of a block (causal mask) gives
``lse = −inf`` and ``o = 0``: the merge weighs it ``exp(−inf) = 0``.

Backward of one block, given the *final* ``o`` and ``lse`` of the row (FlashAttention-2's)::

    P  = exp(s − lse)                       (this block's share of the final softmax)
    dV = Pᵀ · dO          dP = dO · Vᵀ        D = rowsum(dO ∘ O)
    dS = P ∘ (dP − D)     dQ = dS · K / √Dh   dK = dSᵀ · Q / √Dh

so each block's gradients need only that block's ``K, V`` and the row statistics ``O, lse``.
K and V arrive with ``Hkv`` heads (grouped-query attention); they are repeated to the query
heads here, and ``dK, dV`` summed back over each group.
"""

from __future__ import annotations

import math

import torch

from dtlab.models.attention import future_mask, repeat_kv


def _scores(q: torch.Tensor, k: torch.Tensor, positions_q, positions_k, causal: bool):
    k = repeat_kv(k, q.shape[1] // k.shape[1])
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        scores = scores.masked_fill(future_mask(positions_q, positions_k), float("-inf"))
    return scores


def block_is_masked(positions_q: torch.Tensor, positions_k: torch.Tensor, causal: bool) -> bool:
    """Whether every key of the block lies after every query: its work can be skipped."""
    return causal and bool(positions_k.min() > positions_q.max())


def visible_part(
    positions_q: torch.Tensor, positions_k: torch.Tensor, causal: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(rows, cols)``: indices of the queries that see at least one key of the block, and of
    the keys that at least one query sees; ``None`` means all of them.

    Only this sub-block needs computing: every other score is masked. Under zig-zag sharding a
    block from an earlier rank is seen by every query but only through its *head* chunk, and a
    block from a later rank only by the *tail* chunk's queries, so each is half a block — the
    same half on every rank, which is what makes zig-zag's work, not just its unmasked scores,
    equal across ranks (FlashAttention skips masked tiles the same way, at tile granularity).
    """
    if not causal:
        return None, None
    rows = positions_q >= positions_k.min()
    cols = positions_k <= positions_q.max()
    return (
        None if bool(rows.all()) else rows.nonzero().squeeze(1),
        None if bool(cols.all()) else cols.nonzero().squeeze(1),
    )


def take(t: torch.Tensor, index: torch.Tensor | None, dim: int = 2) -> torch.Tensor:
    """``t``'s entries ``index`` along ``dim`` (all of ``t`` when ``index`` is None)."""
    return t if index is None else t.index_select(dim, index.to(t.device))


def unmasked_scores(positions_q: torch.Tensor, positions_k: torch.Tensor, causal: bool) -> int:
    """Score elements of one (query, key) block that survive the mask, per head: the pairs with
    key position ≤ query position. For one row of positions (1-D) they are counted per query by a
    binary search over the sorted keys (no ``Sq × Sk`` mask is built); for (B, S) positions the
    causal count is summed over the batch rows (the non-causal one is per row, ``Sq · Sk``)."""
    if not causal:
        return positions_q.shape[-1] * positions_k.shape[-1]
    if positions_q.dim() == 1 and positions_k.dim() == 1:
        keys = positions_k.sort().values
        return int(torch.searchsorted(keys, positions_q, right=True).sum())
    return int((~future_mask(positions_q, positions_k)).sum())


def block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions_q: torch.Tensor,
    positions_k: torch.Tensor,
    *,
    causal: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)`` of q (B, H, Sq, Dh) against one key block k, v (B, Hkv, Sk, Dh).

    ``o`` (B, H, Sq, Dh) is softmax-normalised within the block; ``lse`` (B, H, Sq) is the
    log-sum-exp of the block's scores (``-inf`` and ``o = 0`` where a query sees none of them).
    """
    scores = _scores(q, k, positions_q, positions_k, causal)
    lse = torch.logsumexp(scores, dim=-1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    weights = torch.exp(scores - safe.unsqueeze(-1))  # exp(-inf) = 0 on masked entries
    return weights @ repeat_kv(v, q.shape[1] // v.shape[1]), lse


def merge(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two blocks' ``(o, lse)`` into those of their union (the equations above)."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    w_a = torch.exp(lse_a - safe).unsqueeze(-1)
    w_b = torch.exp(lse_b - safe).unsqueeze(-1)
    return w_a * o_a + w_b * o_b, lse


def block_attention_backward(
    d_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    positions_q: torch.Tensor,
    positions_k: torch.Tensor,
    *,
    causal: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of one key block, from the row's final ``out`` and ``lse``.

    ``dq`` is this block's contribution (sum it over blocks); ``dk``, ``dv`` have ``Hkv`` heads.
    """
    rep = q.shape[1] // k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = _scores(q, k, positions_q, positions_k, causal)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    k_full, v_full = repeat_kv(k, rep), repeat_kv(v, rep)
    dv = probs.transpose(-2, -1) @ d_out
    d_probs = d_out @ v_full.transpose(-2, -1)
    row_dot = (d_out * out).sum(-1, keepdim=True)
    d_scores = probs * (d_probs - row_dot)
    dq = (d_scores @ k_full) * scale
    dk = (d_scores.transpose(-2, -1) @ q) * scale
    if rep > 1:
        b, _, s, d = dk.shape
        dk = dk.view(b, -1, rep, s, d).sum(2)
        dv = dv.view(b, -1, rep, s, d).sum(2)
    return dq, dk, dv
