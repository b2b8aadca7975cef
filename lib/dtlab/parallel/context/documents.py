"""Packed documents under context parallelism: document masks in the ring, and their imbalance.

Pre-training packs several documents into one sequence (no padding) and masks attention so a
token sees only earlier tokens **of its own document** (Llama 3 does, Dubey et al. 2024, §3.2;
"intra-document" or "document-causal" masking). Under context parallelism the sequence is cut
across ranks, and the mask changes two things:

* **Blocks to skip.** In the ring a query block meets every key block; a pair of blocks that no
  document spans (every query's document ends before the block's first key, or starts after its
  last) contributes nothing and is skipped — not just the future blocks plain causal masking
  skips. :func:`document_ring_attention` skips them and counts the work it did
  (:class:`~dtlab.parallel.context.ring.AttentionWork`).
* **Load imbalance.** Zig-zag sharding balances one causal triangle: rank ``r``'s early chunk
  pairs with a late one. With documents the work is a sum of small triangles, one per document,
  and where the document boundaries fall decides each rank's share — a rank whose chunks hold
  the tails of long documents works more; the ring waits for it at every step.
  **Document-aware sharding** (:func:`document_zigzag_positions`) cuts *each document* into
  ``2N`` chunks and deals them zig-zag, so every rank holds a balanced piece of every triangle:
  equal work whatever the lengths (Megatron-Core / Transformer Engine do this for packed "THD"
  batches under CP; documents padded to a multiple of ``2N``).

:func:`unmasked_scores_per_rank` is the work formula the counted work is held to. The ring here
is forward-only: it shows the mask, the skipping and the balance on real ranks; the training
path's ring (:mod:`~dtlab.parallel.context.ring`) keeps its plain causal mask.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dtlab.comm import Communicator
from dtlab.models.attention import repeat_kv
from dtlab.parallel.context.blockwise import merge
from dtlab.parallel.context.ring import AttentionWork, _Ring
from dtlab.parallel.context.sharding import shard_positions

STYLES = ("contiguous", "zigzag", "document")


def document_ids(doc_lengths: Sequence[int]) -> torch.Tensor:
    """The document index of every position of the packed sequence."""
    if not doc_lengths or any(n < 1 for n in doc_lengths):
        raise ValueError(f"every document needs at least one token, got {list(doc_lengths)}")
    return torch.repeat_interleave(torch.arange(len(doc_lengths)), torch.tensor(doc_lengths))


def document_mask(pos_q: torch.Tensor, pos_k: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    """``visible[i, j]``: key ``pos_k[j]`` is in query ``pos_q[i]``'s document and not after it."""
    same = doc[pos_q].unsqueeze(1) == doc[pos_k].unsqueeze(0)
    return same & (pos_k.unsqueeze(0) <= pos_q.unsqueeze(1))


def document_zigzag_positions(doc_lengths: Sequence[int], cp: int, rank: int) -> torch.Tensor:
    """Document-aware sharding: every document cut into ``2·cp`` chunks, rank ``r`` taking
    chunks ``r`` and ``2·cp − 1 − r`` of each (each length must be a multiple of ``2·cp``)."""
    out, start = [], 0
    for n in doc_lengths:
        if n % (2 * cp):
            raise ValueError(
                f"document of {n} tokens does not cut into {2 * cp} equal chunks for cp={cp}; "
                f"pad each document to a multiple of {2 * cp}"
            )
        out.append(start + shard_positions(n, cp, rank, "zigzag"))
        start += n
    return torch.cat(out)


def positions_for(doc_lengths: Sequence[int], cp: int, rank: int, style: str) -> torch.Tensor:
    """Rank ``rank``'s positions under ``style``: contiguous, zig-zag over the whole sequence, or
    zig-zag inside each document."""
    if style not in STYLES:
        raise ValueError(f"style={style!r}; choose one of {STYLES}")
    if style == "document":
        return document_zigzag_positions(doc_lengths, cp, rank)
    return shard_positions(sum(doc_lengths), cp, rank, style)


def unmasked_scores_per_rank(doc_lengths: Sequence[int], cp: int, style: str) -> list[int]:
    """Score elements each rank's queries keep under the document mask (per batch row, head)."""
    doc = document_ids(doc_lengths)
    everything = torch.arange(len(doc))
    return [
        int(document_mask(positions_for(doc_lengths, cp, r, style), everything, doc).sum())
        for r in range(cp)
    ]


def imbalance(doc_lengths: Sequence[int], cp: int, style: str) -> float:
    """The busiest rank's work over the mean: the ring runs at the busiest rank's pace."""
    work = unmasked_scores_per_rank(doc_lengths, cp, style)
    return max(work) / (sum(work) / len(work))


def document_ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    doc: torch.Tensor,
    comm: Communicator,
    work: AttentionWork | None = None,
) -> torch.Tensor:
    """Forward ring attention of this rank's q (B, H, S, Dh) over every rank's k, v under the
    document-causal mask; ``positions`` are this rank's global positions, ``doc`` the document
    id of every global position (all on q's device: positions travel with their K/V). A key block that no document spans for these queries is
    skipped (its K/V still travel on: the next rank may need them)."""
    ring, scale = _Ring(comm), 1.0 / math.sqrt(q.shape[-1])
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    held = [k, v, positions]
    for step in range(ring.size):
        pending = ring.post(held) if step < ring.size - 1 else None
        k_blk, v_blk, pos_k = held
        visible = document_mask(positions, pos_k, doc)
        if bool(visible.any()):
            k_full = repeat_kv(k_blk, q.shape[1] // k_blk.shape[1])
            scores = (q @ k_full.transpose(-2, -1) * scale).masked_fill(~visible, float("-inf"))
            blk_lse = torch.logsumexp(scores, dim=-1)
            safe = torch.where(torch.isinf(blk_lse), torch.zeros_like(blk_lse), blk_lse)
            weights = torch.exp(scores - safe.unsqueeze(-1))
            blk_out = weights @ repeat_kv(v_blk, q.shape[1] // v_blk.shape[1])
            out, lse = merge(out, lse, blk_out, blk_lse)
            if work is not None:
                work.blocks_computed += 1
                work.unmasked_scores += int(visible.sum())
        elif work is not None:
            work.blocks_skipped += 1
        if pending is not None:
            incoming, wait = pending
            wait()
            held = incoming
    return out
