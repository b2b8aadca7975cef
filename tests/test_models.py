"""dtlab.models: the GPT's shape, deterministic init, parameter count, data and a learning run."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn as nn

import dtlab
from dtlab.cost import gpt_param_count
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank


@pytest.mark.parametrize(
    "config",
    [
        GPTConfig.tiny(),
        GPTConfig.tiny(tie_embeddings=False),
        GPTConfig.tiny(bias=False),
        GPTConfig.tiny(d_ff=96, n_layers=3),
        GPTConfig.small(),
    ],
    ids=["tiny", "untied", "no_bias", "custom_d_ff", "small"],
)
def test_gpt_parameter_count_equals_cost_formula_exactly(config):
    model = GPT(config)
    expected = gpt_param_count(
        config.n_layers,
        config.d_model,
        config.vocab_size,
        config.seq_len,
        d_ff=config.d_ff,
        tie_embeddings=config.tie_embeddings,
        bias=config.bias,
    )
    assert model.num_params() == config.num_params() == expected


def test_gpt2_124m_config_counts_124_439_808_parameters():
    assert GPTConfig.gpt2_124m().num_params() == 124_439_808


def test_tied_lm_head_is_the_embedding_parameter():
    model = GPT(GPTConfig.tiny())
    assert model.lm_head.weight is model.embed.weight
    untied = GPT(GPTConfig.tiny(tie_embeddings=False))
    assert untied.lm_head.weight is not untied.embed.weight


def test_same_seed_gives_bit_identical_params_whatever_the_global_rng():
    torch.manual_seed(1)
    a = GPT(GPTConfig.tiny(), seed=7)
    torch.manual_seed(2)
    torch.rand(1000)
    b = GPT(GPTConfig.tiny(), seed=7)
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
    c = GPT(GPTConfig.tiny(), seed=8)
    assert not torch.equal(a.blocks[0].attn.q_proj.weight, c.blocks[0].attn.q_proj.weight)


def test_construction_leaves_the_global_rng_untouched():
    state = torch.get_rng_state()
    GPT(GPTConfig.tiny(), seed=3)
    assert torch.equal(state, torch.get_rng_state())


def test_reset_parameters_restores_the_seeded_init():
    model = GPT(GPTConfig.tiny(), seed=5)
    reference = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    model.reset_parameters()
    for name, value in model.state_dict().items():
        assert torch.equal(value, reference[name]), name


def test_layers_carry_the_names_parallel_code_targets():
    model = GPT(GPTConfig.tiny())
    assert isinstance(model.blocks, nn.ModuleList) and len(model.blocks) == 2
    block = model.blocks[0]
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        assert isinstance(getattr(block.attn, name), nn.Linear)
    assert isinstance(block.mlp.fc_in, nn.Linear) and isinstance(block.mlp.fc_out, nn.Linear)
    assert block.mlp.fc_in.out_features == 4 * 64
    for name in ("embed", "pos_embed", "final_norm", "lm_head"):
        assert hasattr(model, name)


def test_config_rejects_heads_that_do_not_divide_d_model_and_names_the_choices():
    with pytest.raises(
        ValueError, match=r"choose n_heads from \[1, 2, 3, 4, 6, 8, 12, 16, 24, 48\]"
    ):
        GPTConfig(d_model=48, n_heads=5)
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(dropout=1.5)
    assert GPTConfig.tiny().d_ff == 256
    assert dataclasses.replace(GPTConfig.tiny(), d_model=128, d_ff=None).d_ff == 512


def test_logits_at_a_position_ignore_future_tokens():
    model = GPT(GPTConfig.tiny()).eval()
    idx = torch.randint(128, (2, 32), generator=torch.Generator().manual_seed(0))
    changed = idx.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % 128
    out, out_changed = model(idx), model(changed)
    assert out.shape == (2, 32, 128)
    assert torch.equal(out[:, :20], out_changed[:, :20])
    assert not torch.allclose(out[:, 20:], out_changed[:, 20:])


def test_sequences_longer_than_the_context_are_refused():
    with pytest.raises(ValueError, match="seq_len=32"):
        GPT(GPTConfig.tiny())(torch.zeros(1, 33, dtype=torch.long))


def test_attention_with_column_sharded_heads_sums_to_the_full_output():
    """Attention reads its head count from q_proj, so tensor-parallel shards need no new class."""
    config = GPTConfig.tiny()
    full = GPT(config).blocks[0].attn
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(1))
    halves = []
    for part in range(2):
        shard = copy.deepcopy(full)
        cols = slice(part * 32, (part + 1) * 32)  # heads 2·part, 2·part+1
        for name in ("q_proj", "k_proj", "v_proj"):
            layer = getattr(shard, name)
            layer.weight = nn.Parameter(layer.weight[cols].clone())
            layer.bias = nn.Parameter(layer.bias[cols].clone())
        shard.out_proj.weight = nn.Parameter(shard.out_proj.weight[:, cols].clone())
        shard.out_proj.bias = nn.Parameter(shard.out_proj.bias / 2)
        halves.append(shard(x))
    torch.testing.assert_close(halves[0] + halves[1], full(x), rtol=1e-5, atol=1e-6)


def test_synthetic_tokens_are_deterministic_and_targets_are_shifted_inputs():
    config = GPTConfig.tiny()
    data = SyntheticTokens(config, n_batches=3, batch_size=4, seed=11)
    (x0, y0), (x1, _), _ = list(data)
    assert x0.shape == y0.shape == (4, 32) and x0.dtype == torch.long
    assert torch.equal(x0[:, 1:], y0[:, :-1])
    again = SyntheticTokens(config, n_batches=3, batch_size=4, seed=11)
    assert torch.equal(again[0][0], x0) and torch.equal(data[1][0], x1)
    assert not torch.equal(SyntheticTokens(config, 3, 4, seed=12)[0][0], x0)
    assert int(x0.max()) < config.vocab_size


def test_shard_for_rank_gives_disjoint_rows_that_rebuild_the_batch():
    x, y = SyntheticTokens(GPTConfig.tiny(), 1, 8)[0]
    shards = [shard_for_rank((x, y), r, 4) for r in range(4)]
    assert all(sx.shape == (2, 32) for sx, _ in shards)
    assert torch.equal(torch.cat([sx for sx, _ in shards]), x)
    assert torch.equal(torch.cat([sy for _, sy in shards]), y)
    with pytest.raises(ValueError, match="multiple of 3"):
        shard_for_rank(x, 0, 3)


@pytest.fixture
def one_torch_thread():
    """Tiny ops run fastest single-threaded, and far faster on a CPU shared with other jobs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_tiny_gpt_loss_decreases_over_30_steps_on_synthetic_data(one_torch_thread):
    config = GPTConfig.tiny()
    model = GPT(config, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for inputs, targets in SyntheticTokens(config, n_batches=30, batch_size=16, seed=0):
        loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(torch.log(torch.tensor(128.0)).item(), abs=0.3)
    assert sum(losses[-5:]) / 5 < 0.75 * losses[0]


def _init_fingerprint_and_shard():
    model = GPT(GPTConfig.tiny(), seed=42)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    x, _ = SyntheticTokens(GPTConfig.tiny(), 1, 4)[0]
    return flat, shard_for_rank(x, dtlab.rank(), dtlab.world_size())


def test_every_rank_builds_identical_params_and_sees_disjoint_rows(cluster2):
    (flat0, rows0), (flat1, rows1) = cluster2.run(_init_fingerprint_and_shard)
    assert torch.equal(flat0, flat1)
    assert torch.equal(
        flat0,
        torch.cat([p.detach().reshape(-1) for p in GPT(GPTConfig.tiny(), seed=42).parameters()]),
    )
    x, _ = SyntheticTokens(GPTConfig.tiny(), 1, 4)[0]
    assert torch.equal(torch.cat([rows0, rows1]), x)
