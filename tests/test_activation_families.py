"""Activation bytes per tensor family: saved-tensor hooks against the formula, exactly.

One lab-GPT block in fp32 on CPU, dropout on and off, tensor parallelism with and without
sequence parallelism on two real ranks, and the recompute modes; plus Korthikanti et al.'s
16-bit families summing to the library's per-layer formula and the checkpoint-interval optimum.
"""

from __future__ import annotations

import math

import pytest
import torch

import dtlab
from dtlab.memory import ActivationMeter, activation_bytes_per_layer
from dtlab.memory.activation_families import (
    korthikanti_families,
    lab_layer_families,
    measured_families,
)
from dtlab.memory.formulas import (
    activation_checkpointing_bytes,
    best_layers_per_checkpoint,
    checkpoint_interval_optimum,
)
from dtlab.mesh import Mesh
from dtlab.models import GPT, GPTConfig
from dtlab.parallel.activations.recomputation import recompute, recompute_attention_core
from dtlab.parallel.tensor import parallelize_gpt

B, S = 2, 24
CONFIG = GPTConfig.tiny(seq_len=S, d_model=32, n_heads=4)  # head_dim 8: shapes tell families apart


def _measure_block(config: GPTConfig, recompute_mode: str = "none") -> dict[str, int]:
    model = GPT(config, seed=0)
    model.train()
    block = model.blocks[0]
    x = torch.randn(B, S, config.d_model, requires_grad=True)
    positions = torch.arange(S)
    if recompute_mode == "selective":
        recompute_attention_core(model)
    with ActivationMeter(block) as meter:
        run = recompute if recompute_mode == "full" else (lambda f, *a: f(*a))
        y = run(block, x, positions)
    y.sum().backward()
    return measured_families(meter.records, S, config.d_model, config.head_dim)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_measured_families_equal_the_lab_formula_exactly(dropout, mode):
    config = GPTConfig.tiny(seq_len=S, d_model=32, n_heads=4, dropout=dropout)
    measured = _measure_block(config, mode)
    assert measured == lab_layer_families(config, B, S, recompute=mode)


def test_recompute_savings_equal_the_families_removed():
    config = GPTConfig.tiny(seq_len=S, d_model=32, n_heads=4, dropout=0.1)
    none, selective, full = (_measure_block(config, m) for m in ("none", "selective", "full"))
    saved = sum(none.values()) - sum(selective.values())
    assert saved == none["scores"] + none["causal_mask"] - selective["positions"]
    assert sum(full.values()) == B * S * config.d_model * 4 + 8 * S  # the block input + positions


def test_dropout_adds_exactly_its_masks_and_outputs():
    on, off = (
        _measure_block(GPTConfig.tiny(seq_len=S, d_model=32, n_heads=4, dropout=p))
        for p in (0.1, 0.0)
    )
    sbh, a = B * S * 32, 4
    # CPU dropout saves its scaled noise in fp32: mask 4 B per element, plus the dropout output.
    assert on["scores"] - off["scores"] == a * S * S * B * (4 + 4)
    assert on["attention_out"] - off["attention_out"] == sbh * 4
    assert on["mlp"] - off["mlp"] == sbh * 4


def _tp_block_families(sequence_parallel: bool, dropout: float) -> dict:
    t = dtlab.world_size()
    config = GPTConfig.tiny(seq_len=S, d_model=32, n_heads=4, dropout=dropout)
    tp = parallelize_gpt(GPT(config, seed=0), Mesh(tp=t), sequence_parallel)
    tp.model.train()
    block = tp.model.blocks[0]
    local = S // t if sequence_parallel else S
    x = torch.randn(B, local, 32, requires_grad=True)
    with ActivationMeter(block) as meter:
        y = block(x, torch.arange(S))
    y.sum().backward()
    return {
        "measured": measured_families(meter.records, S, 32, config.head_dim),
        "formula": lab_layer_families(config, B, S, t, sequence_parallel),
    }


def _all_tp_cases() -> list[dict]:
    return [_tp_block_families(sp, p) for sp in (False, True) for p in (0.0, 0.1)]


def test_tensor_and_sequence_parallel_families_match_per_rank(cluster2):
    for per_rank in cluster2.run(_all_tp_cases):
        for case in per_rank:
            assert case["measured"] == case["formula"]


@pytest.mark.parametrize("tp,sp", [(1, False), (8, False), (8, True)])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_korthikanti_families_sum_to_the_per_layer_formula(tp, sp, mode):
    s, b, h, a = 2048, 1, 12288, 96
    families = korthikanti_families(s, b, h, a, tp, sp, mode)
    expected = activation_bytes_per_layer(s, b, h, a, tp, sp, mode)
    assert sum(families.values()) == expected


def test_lab_formula_at_16_bit_with_fused_masks_is_korthikantis_family_by_family():
    config = GPTConfig(vocab_size=8, seq_len=64, d_model=64, n_layers=1, n_heads=4, dropout=0.1)
    ours = lab_layer_families(config, 2, 64, bytes_per_element=2, mask_bytes=1)
    theirs = korthikanti_families(64, 2, 64, 4)
    for family in ("layernorm", "qkv", "scores", "attention_out", "mlp"):
        assert ours[family] == theirs[family], family


def test_the_optimal_checkpoint_interval_is_sqrt_of_l_a_over_b_not_sqrt_l():
    assert checkpoint_interval_optimum(64, 5, 5) == 8.0  # a = b: Chen et al.'s sqrt(L)
    assert math.isclose(checkpoint_interval_optimum(64, 1, 16), 2.0)
    # GPT-3-sized layer: internals are ~100x the input, so checkpoint every layer.
    assert best_layers_per_checkpoint(96, 2048, 1, 12288, 96) == 1
    curve = [activation_checkpointing_bytes(96, 2048, 1, 12288, 96, k) for k in (1, 2, 10)]
    assert curve[0] < curve[1] < curve[2]


def test_ambiguous_shapes_and_bad_modes_are_refused():
    with pytest.raises(ValueError, match="must all differ"):
        measured_families([], seq=32, d_model=32, head_dim=8)
    with pytest.raises(ValueError, match="recompute="):
        lab_layer_families(CONFIG, B, S, recompute="some")
    with pytest.raises(ValueError, match="tp=3"):
        korthikanti_families(64, 1, 64, 4, tp=3)
