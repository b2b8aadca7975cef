"""Attention's plug points: swappable cores, explicit positions, grouped-query attention."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dtlab.models import GPT, GPTConfig, SyntheticTokens, math_attention, repeat_kv

TIGHT = dict(rtol=1e-5, atol=1e-6)


def _inputs(config: GPTConfig, rows: int = 2) -> torch.Tensor:
    return SyntheticTokens(config, 1, rows, seed=9)[0][0]


def test_core_receives_per_head_tensors_with_unrepeated_kv_and_global_positions():
    config = GPTConfig.tiny(n_kv_heads=2)
    seen = []

    def recording_core(q, k, v, positions_q, positions_k, *, causal=True, dropout_p=0.0):
        seen.append((q.shape, k.shape, v.shape, positions_q.tolist(), causal, dropout_p))
        return math_attention(q, k, v, positions_q, positions_k, causal=causal)

    model = GPT(config, attention_core=recording_core).eval()
    model(_inputs(config)[:, :8], positions=torch.arange(8) + 3)
    assert len(seen) == config.n_layers
    q_shape, k_shape, v_shape, positions, causal, dropout_p = seen[0]
    assert q_shape == (2, 4, 8, 16)  # (batch, n_heads, seq, head_dim)
    assert k_shape == v_shape == (2, 2, 8, 16)  # n_kv_heads, before repetition
    assert positions == list(range(3, 11)) and causal and dropout_p == 0.0


def test_a_core_swapped_in_after_construction_replaces_the_math():
    """What context parallelism does: set ``block.attn.core``; here, torch's fused SDPA."""
    config = GPTConfig.tiny(n_kv_heads=2)
    model = GPT(config).eval()
    inputs = _inputs(config)
    expected = model(inputs)
    calls = []

    def sdpa_core(q, k, v, positions_q, positions_k, *, causal=True, dropout_p=0.0):
        calls.append(1)
        rep = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(
            q, repeat_kv(k, rep), repeat_kv(v, rep), dropout_p=dropout_p, is_causal=causal
        )

    for block in model.blocks:
        block.attn.core = sdpa_core
    torch.testing.assert_close(model(inputs), expected, **TIGHT)
    assert len(calls) == config.n_layers


def test_tokens_fed_out_of_order_with_their_global_positions_give_the_same_logits():
    """A zig-zag context-parallel shard holds chunks (0, 3) of 4: its tokens are not 0..S-1, and
    the causal mask and position embedding must follow the global positions."""
    config = GPTConfig.tiny()
    model = GPT(config, seed=2).eval()
    inputs = _inputs(config)
    chunks = torch.arange(config.seq_len).chunk(4)
    order = torch.cat([chunks[0], chunks[3], chunks[1], chunks[2]])
    shuffled = model(inputs[:, order], positions=order)
    torch.testing.assert_close(shuffled, model(inputs)[:, order], **TIGHT)
    batched = model(inputs[:, order], positions=order.expand(2, -1))  # (batch, seq) positions
    torch.testing.assert_close(batched, shuffled, **TIGHT)


def test_positions_are_checked_against_the_context_and_the_token_count():
    model = GPT(GPTConfig.tiny())
    idx = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="seq_len=32"):
        model(idx, positions=torch.tensor([0, 1, 2, 32]))
    with pytest.raises(ValueError, match="one per token"):
        model(idx, positions=torch.arange(3))


def test_non_causal_core_attends_to_every_key():
    q, k, v = torch.randn(3, 1, 2, 5, 4, generator=torch.Generator().manual_seed(0))
    out = math_attention(q, k, v, torch.arange(5), torch.arange(5), causal=False)
    torch.testing.assert_close(out, F.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1) @ v)


def test_gqa_with_n_kv_heads_equal_to_n_heads_is_the_default_model():
    assert GPTConfig.tiny(n_kv_heads=4) == GPTConfig.tiny()
    assert GPTConfig.small(n_kv_heads=8) == GPTConfig.small()
    config = GPTConfig.tiny()
    inputs = _inputs(config)
    assert torch.equal(GPT(GPTConfig.tiny(n_kv_heads=4))(inputs), GPT(config)(inputs))


def test_gqa_equals_multi_head_attention_with_each_kv_head_copied_to_its_query_group():
    gqa_config = GPTConfig.tiny(n_kv_heads=2)
    gqa, mha = GPT(gqa_config, seed=4), GPT(GPTConfig.tiny(), seed=4)
    assert gqa.blocks[0].attn.k_proj.out_features == 2 * 16
    assert gqa.num_params() == gqa_config.num_params() < mha.num_params()
    mha_params = dict(mha.named_parameters())
    with torch.no_grad():
        for name, p in gqa.named_parameters():
            if ".k_proj." in name or ".v_proj." in name:  # kv head j serves query heads 2j, 2j+1
                per_head = p.view(2, 16, *p.shape[1:])
                mha_params[name].copy_(
                    per_head.repeat_interleave(2, dim=0).reshape_as(mha_params[name])
                )
            else:
                mha_params[name].copy_(p)
    inputs = _inputs(gqa_config)
    torch.testing.assert_close(gqa(inputs), mha(inputs), **TIGHT)


def test_gqa_attention_sharded_by_whole_kv_groups_sums_to_the_full_output():
    """Tensor parallelism with tp=2 over 4 query heads and 2 KV heads: rank r keeps query heads
    2r, 2r+1 and KV head r; the row-sharded out_proj outputs sum to the full attention."""
    full = GPT(GPTConfig.tiny(n_kv_heads=2)).blocks[0].attn
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(1))
    outputs = []
    for rank in range(2):
        shard = copy.deepcopy(full)
        q_cols, kv_cols = slice(rank * 32, (rank + 1) * 32), slice(rank * 16, (rank + 1) * 16)
        for name, cols in (("q_proj", q_cols), ("k_proj", kv_cols), ("v_proj", kv_cols)):
            layer = getattr(shard, name)
            layer.weight = nn.Parameter(layer.weight[cols].clone())
            layer.bias = nn.Parameter(layer.bias[cols].clone())
        shard.out_proj.weight = nn.Parameter(shard.out_proj.weight[:, q_cols].clone())
        shard.out_proj.bias = nn.Parameter(shard.out_proj.bias / 2)
        outputs.append(shard(x))
    torch.testing.assert_close(outputs[0] + outputs[1], full(x), **TIGHT)


def test_config_rejects_kv_heads_that_do_not_divide_heads_and_names_the_choices():
    with pytest.raises(ValueError, match=r"choose n_kv_heads from \[1, 2, 4, 8\]"):
        GPTConfig.small(n_kv_heads=3)
    with pytest.raises(ValueError, match="positive integer"):
        GPTConfig.tiny(n_kv_heads=0)
