"""Packed documents under context parallelism: the document mask in the ring, skipped blocks,
the imbalance of plain sharding and document-aware sharding that removes it."""

from __future__ import annotations

import math

import pytest
import torch

from dtlab.parallel.context.documents import (
    document_ids,
    document_mask,
    imbalance,
    positions_for,
    unmasked_scores_per_rank,
)

DOCS = [8, 24, 8, 8]  # a packed sequence of 48 tokens, one long document


def _qkv(seq: int):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, seq, 4, generator=g, dtype=torch.float64) for _ in range(3)]


def _reference(seq_docs):
    q, k, v = _qkv(sum(seq_docs))
    doc, pos = document_ids(seq_docs), torch.arange(sum(seq_docs))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(4)
    scores = scores.masked_fill(~document_mask(pos, pos, doc), float("-inf"))
    return torch.softmax(scores, -1) @ v


def _on_rank(style: str, docs: list[int]) -> dict:
    from dtlab.comm import Communicator
    from dtlab.parallel.context.documents import document_ring_attention
    from dtlab.parallel.context.ring import AttentionWork

    comm = Communicator(collectives="dtlab", dim="cp")
    positions = positions_for(docs, comm.world_size, comm.rank, style)
    q, k, v = (t.index_select(2, positions) for t in _qkv(sum(docs)))
    work = AttentionWork()
    out = document_ring_attention(q, k, v, positions, document_ids(docs), comm, work)
    return {"out": out, "positions": positions, "work": work}


@pytest.mark.parametrize("style", ["contiguous", "zigzag", "document"])
def test_document_ring_equals_one_process_with_the_document_mask(cluster2, style):
    reference = _reference(DOCS)
    for r in cluster2.run(_on_rank, style, DOCS):
        torch.testing.assert_close(r["out"], reference.index_select(2, r["positions"]))


def test_counted_work_is_the_formula_and_blocks_no_document_spans_are_skipped(cluster4):
    docs = [16, 16, 16, 16]  # four documents, one per contiguous rank
    results = cluster4.run(_on_rank, "contiguous", docs)
    counted = [r["work"].unmasked_scores for r in results]
    assert counted == unmasked_scores_per_rank(docs, 4, "contiguous")
    # each rank's queries see only their own block: 3 of 4 blocks skipped on every rank,
    # where plain causal masking would skip only the future ones (3, 2, 1, 0)
    assert [r["work"].blocks_skipped for r in results] == [3, 3, 3, 3]


def test_document_aware_sharding_balances_what_zigzag_does_not():
    assert imbalance(DOCS, 2, "zigzag") > 1.2  # the long document's tail sits on one rank
    assert imbalance(DOCS, 2, "document") == 1.0
    assert imbalance([64], 4, "zigzag") == 1.0  # one document: zig-zag was already balanced
    with pytest.raises(ValueError, match="pad each document"):
        positions_for([10, 6], 2, 0, "document")


def test_which_plain_layout_is_worse_depends_on_where_the_boundaries_fall():
    """Lab 06 says zig-zag is the worse plain layout for its documents on 2 or 4 ranks and
    contiguous on 8; the direction is not a rule (the full-mode lengths once reversed it)."""
    for docs in ([16, 48, 16, 16], [256, 768, 256, 256]):
        for cp, worse, better in ((2, "zigzag", "contiguous"), (4, "zigzag", "contiguous")):
            assert imbalance(docs, cp, worse) > imbalance(docs, cp, better)
    assert imbalance([256, 768, 256, 256], 8, "contiguous") > imbalance(
        [256, 768, 256, 256], 8, "zigzag"
    )
    assert imbalance([256, 1536, 128, 128], 2, "zigzag") < imbalance(
        [256, 1536, 128, 128], 2, "contiguous"
    )
