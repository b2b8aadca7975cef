"""The pluggable GPT computes exactly what the original lab GPT computed.

``_reference_logits`` re-derives the original model (before attention cores, MLP factories, GQA
and explicit positions existed) from its parameters with torch.nn.functional calls, written
independently of ``dtlab.models``. Same ops in the same order, so the comparison is bitwise.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, math_attention


def _reference_logits(params: dict, config: GPTConfig, idx: torch.Tensor, training: bool):
    batch, seq = idx.shape
    d, heads = config.d_model, config.n_heads
    head_dim = d // heads
    p_drop = config.dropout if training else 0.0

    def drop(x):
        return F.dropout(x, p_drop) if p_drop > 0 else x

    def linear(x, name):
        return F.linear(x, params[name + ".weight"], params.get(name + ".bias"))

    def norm(x, name):
        return F.layer_norm(x, (d,), params[name + ".weight"], params.get(name + ".bias"))

    h = F.embedding(idx, params["embed.weight"]) + F.embedding(
        torch.arange(seq), params["pos_embed.weight"]
    )
    h = drop(h)
    for layer in range(config.n_layers):
        pre = f"blocks.{layer}."
        a = norm(h, pre + "attn_norm")
        q, k, v = (
            linear(a, pre + "attn." + n).view(batch, seq, heads, head_dim).transpose(1, 2)
            for n in ("q_proj", "k_proj", "v_proj")
        )
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
        scores = scores.masked_fill(
            torch.ones(seq, seq, dtype=torch.bool).triu(diagonal=1), float("-inf")
        )
        weights = drop(F.softmax(scores, dim=-1))
        out = (weights @ v).transpose(1, 2).reshape(batch, seq, d)
        h = h + drop(linear(out, pre + "attn.out_proj"))
        hidden = F.gelu(linear(norm(h, pre + "mlp_norm"), pre + "mlp.fc_in"), approximate="tanh")
        h = h + drop(linear(hidden, pre + "mlp.fc_out"))
    head = params["embed.weight"] if config.tie_embeddings else params["lm_head.weight"]
    return F.linear(norm(h, "final_norm"), head)


CASES = {
    "tiny_eval": (GPTConfig.tiny(), False),
    "dropout_training": (GPTConfig.tiny(dropout=0.1), True),
    "untied_no_bias_3_layers": (GPTConfig.tiny(tie_embeddings=False, bias=False, n_layers=3), True),
    "head_dim_12": (GPTConfig.tiny(d_model=48, n_heads=4), False),  # 1/√12 is not exact
    "n_kv_heads_equal_n_heads": (GPTConfig.tiny(n_kv_heads=4, dropout=0.1), True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_default_gpt_logits_and_grads_are_bit_identical_to_the_original_math(case):
    config, training = CASES[case]
    model = GPT(config, seed=3).train(training)
    inputs, targets = SyntheticTokens(config, 1, 4, seed=5)[0]
    torch.manual_seed(123)  # the same dropout masks, drawn in the same order
    logits = model(inputs)
    grads = torch.autograd.grad(loss_fn(logits, targets), list(model.parameters()))
    params = dict(model.named_parameters())
    torch.manual_seed(123)
    expected = _reference_logits(params, config, inputs, training)
    expected_grads = torch.autograd.grad(loss_fn(expected, targets), list(params.values()))
    assert torch.equal(logits, expected)
    for name, got, want in zip(params, grads, expected_grads, strict=True):
        assert torch.equal(got, want), name


def test_explicit_default_positions_and_an_explicit_default_core_change_nothing():
    config = GPTConfig.tiny()
    model = GPT(config, seed=1).eval()
    inputs, _ = SyntheticTokens(config, 1, 2)[0]
    default = model(inputs)
    assert torch.equal(model(inputs, positions=torch.arange(config.seq_len)), default)
    assert torch.equal(model.embed_tokens(inputs), model.embed_tokens(inputs, start_pos=0))
    explicit = GPT(config, seed=1, attention_core=math_attention).eval()
    assert torch.equal(explicit(inputs), default)


def test_default_model_aux_loss_is_a_zero_without_gradient():
    model = GPT(GPTConfig.tiny())
    assert model.aux_loss is None  # before the first forward
    model(torch.zeros(1, 8, dtype=torch.long))
    assert model.aux_loss.shape == () and model.aux_loss.item() == 0.0
    assert not model.aux_loss.requires_grad
    assert all(block.aux_loss is None for block in model.blocks)
