"""The online-softmax pieces context parallelism is built on, checked in one process (fp64).

Attention over key blocks, merged by log-sum-exp, must equal attention over all keys — in any
block order, causal or not, with grouped-query heads — and the blockwise backward, summed over
blocks, must equal autograd through the full attention. The sharding helpers must lay tokens out
as documented and put them back.
"""

from __future__ import annotations

import pytest
import torch

from dtlab.mesh import validate_layout
from dtlab.models import GPTConfig
from dtlab.models.attention import math_attention
from dtlab.parallel.context import (
    block_attention,
    block_attention_backward,
    check_heads,
    merge,
    parallelize_context,
    shard_positions,
    shard_sequence,
    unshard_sequence,
)

TOLERANCE = 1e-12


def _qkv(seq=12, heads=4, kv_heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, seq, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, kv_heads, seq, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, kv_heads, seq, 8, generator=g, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("causal", [True, False])
def test_lse_merge_of_key_blocks_in_any_order_equals_full_attention(causal):
    q, k, v = _qkv()
    pos = torch.arange(12)
    full = math_attention(q, k, v, pos, pos, causal=causal)
    blocks = [pos[i : i + 4] for i in (8, 0, 4)]  # out of order on purpose
    out, lse = None, None
    for p in blocks:
        o_b, l_b = block_attention(q, k[:, :, p], v[:, :, p], pos, p, causal=causal)
        out, lse = (o_b, l_b) if out is None else merge(out, lse, o_b, l_b)
    assert (out - full).abs().max() < TOLERANCE
    scores = q @ k.repeat_interleave(2, 1).transpose(-2, -1) / 8**0.5
    if causal:
        scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    assert (lse - torch.logsumexp(scores, -1)).abs().max() < TOLERANCE


def test_a_block_a_query_cannot_see_contributes_nothing_to_the_merge():
    q, k, v = _qkv()
    pos = torch.arange(12)
    o_late, lse_late = block_attention(q[:, :, :4], k[:, :, 8:], v[:, :, 8:], pos[:4], pos[8:])
    assert torch.isinf(lse_late).all() and (o_late == 0).all()
    o_early, lse_early = block_attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], pos[:4], pos[:4])
    out, lse = merge(o_early, lse_early, o_late, lse_late)
    assert (out - o_early).abs().max() == 0 and (lse - lse_early).abs().max() == 0


@pytest.mark.parametrize("causal", [True, False])
def test_blockwise_backward_summed_over_blocks_equals_autograd(causal):
    q, k, v = (t.requires_grad_() for t in _qkv())
    pos = torch.arange(12)
    d_out = torch.randn(
        2, 4, 12, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
    )
    full = math_attention(q, k, v, pos, pos, causal=causal)
    full.backward(d_out)
    with torch.no_grad():
        out, lse = block_attention(q, k, v, pos, pos, causal=causal)
        dq = torch.zeros_like(q)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        for p in (pos[:6], pos[6:]):
            dq_b, dk_b, dv_b = block_attention_backward(
                d_out, q, k[:, :, p], v[:, :, p], out, lse, pos, p, causal=causal
            )
            dq += dq_b
            dk[:, :, p] += dk_b
            dv[:, :, p] += dv_b
    for mine, ref in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
        assert (mine - ref).abs().max() < TOLERANCE


def test_zigzag_rank_holds_chunk_i_and_chunk_2n_minus_1_minus_i():
    assert shard_positions(16, 4, 0).tolist() == [0, 1, 14, 15]
    assert shard_positions(16, 4, 3).tolist() == [6, 7, 8, 9]
    assert shard_positions(16, 4, 1, "contiguous").tolist() == [4, 5, 6, 7]
    every = torch.cat([shard_positions(16, 4, r) for r in range(4)])
    assert sorted(every.tolist()) == list(range(16))


@pytest.mark.parametrize("style", ["zigzag", "contiguous"])
def test_unshard_puts_every_rank_shard_back_in_sequence_order(style):
    x = torch.arange(2 * 16 * 3).view(2, 16, 3)
    shards = [shard_sequence(x, 4, r, style, dim=1)[0] for r in range(4)]
    assert torch.equal(unshard_sequence(shards, style, dim=1), x)


def test_shard_sequence_takes_the_sequence_axis_explicitly_and_cuts_only_it():
    qkv = torch.arange(2 * 4 * 8 * 3).view(2, 4, 8, 3)  # (B, H, S, Dh): H=4 would split too
    with pytest.raises(TypeError, match="dim"):
        shard_sequence(qkv, 2, 0, "zigzag")  # no silent default that would cut the heads
    with pytest.raises(TypeError, match="dim"):
        unshard_sequence([qkv, qkv], "zigzag")
    shard, positions = shard_sequence(qkv, 2, 1, "zigzag", dim=2)
    assert shard.shape == (2, 4, 4, 3) and positions.tolist() == [2, 3, 4, 5]
    assert torch.equal(shard, qkv[:, :, 2:6])


def test_bad_cp_degrees_are_refused_with_what_to_choose():
    with pytest.raises(ValueError, match="multiple of 8"):
        shard_positions(12, 4, 0, "zigzag")
    with pytest.raises(ValueError, match=r"choose cp in \[1, 2\]"):
        check_heads(4, 2, 4)
    config = GPTConfig.tiny(seq_len=16, d_model=32, n_kv_heads=2)
    with pytest.raises(ValueError, match="Ulysses cp=4"):
        validate_layout(config, cp=4, cp_style="ulysses")

    class FourRanks:  # parallelize_context validates before it touches the communicator
        world_size, rank = 4, 0

    from dtlab.models import GPT

    with pytest.raises(ValueError, match="Ulysses cp=4"):
        parallelize_context(GPT(config, seed=0), FourRanks(), "ulysses")
    with pytest.raises(ValueError, match="zig-zag"):
        parallelize_context(GPT(GPTConfig.tiny(seq_len=12, d_model=32)), FourRanks(), "zigzag")


def test_unmasked_scores_counts_what_the_causal_mask_keeps_for_any_positions():
    from dtlab.models.attention import future_mask
    from dtlab.parallel.context.blockwise import unmasked_scores

    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        q = torch.randint(0, 40, (int(torch.randint(1, 25, (1,), generator=g)),), generator=g)
        k = torch.randint(0, 40, (int(torch.randint(1, 25, (1,), generator=g)),), generator=g)
        assert unmasked_scores(q, k, True) == int((~future_mask(q, k)).sum())
        assert unmasked_scores(q, k, False) == len(q) * len(k)
    batched = torch.arange(12).view(2, 6)  # (B, S): the mask path, summed over rows
    assert unmasked_scores(batched, batched, True) == 2 * 21
