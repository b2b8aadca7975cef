"""Bytes per parameter and per saved activation per precision recipe: the formulas of
dtlab.memory.precision_bytes equal bytes read from the tensors a real step leaves behind (model
state) and from the saved-tensor hooks (an FP8 linear's saved inputs and scales; the lab GPT's
saved GEMM inputs per layer in fp32 vs FP8 at every granularity), and the per-recipe activation
formula is Korthikanti's with the GEMM inputs swapped."""

from __future__ import annotations

import copy

import pytest
import torch

from dtlab.memory.activations import ActivationMeter
from dtlab.memory.formulas import activation_bytes_per_layer, model_state_bytes
from dtlab.memory.precision_bytes import (
    BASELINE_BYTES_PER_PARAM,
    activation_bytes_per_element,
    activation_bytes_per_layer_for,
    bytes_per_param_table,
    gemm_input_bytes_per_layer,
    model_state_recipe,
)
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
from dtlab.parallel.zero.flat_segment import state_tensor_bytes
from dtlab.precision import PER_TENSOR, PER_TILE, Fp8Linear


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _state_after_one_step(recipe: str) -> tuple[int, int]:
    """(bytes held by params + grads + optimizer state after one step, Ψ) — measured."""
    config = GPTConfig.tiny()
    master = GPT(config, seed=0)
    x, y = SyntheticTokens(config, 1, 2)[0]
    if recipe == "bf16_pure":
        master, working = master.to(torch.bfloat16), None
    elif recipe.startswith("bf16_master"):
        working = copy.deepcopy(master).to(torch.bfloat16)
    else:
        working = None
    opt = torch.optim.AdamW(master.parameters(), lr=1e-3)
    model = working or master
    loss_fn(model(x).float(), y).backward()
    if working is not None:
        for m, w in zip(master.parameters(), working.parameters(), strict=True):
            m.grad = w.grad.float()
    opt.step()
    params = list(master.parameters())
    held = _nbytes(params) + state_tensor_bytes(opt)
    if recipe == "bf16_master":  # 16-bit copy and gradients; the fp32 grad is transient
        held += _nbytes(working.parameters()) + _nbytes(p.grad for p in working.parameters())
    elif recipe == "bf16_master_fp32_accum":  # 16-bit grads freed into a persistent fp32 one
        held += _nbytes(working.parameters()) + _nbytes(p.grad for p in params)
    else:
        held += _nbytes(p.grad for p in params)
    return held, sum(p.numel() for p in params)


@pytest.mark.parametrize("recipe", ["fp32", "bf16_master", "bf16_master_fp32_accum", "bf16_pure"])
def test_model_state_bytes_per_param_equal_the_tensors_of_a_real_step(recipe):
    held, psi = _state_after_one_step(recipe)
    assert held == model_state_bytes(psi, recipe=model_state_recipe(recipe)).total


def test_mixed_precision_is_the_16_byte_baseline_and_pure_bf16_halves_it():
    totals = {row["recipe"]: row["total"] for row in bytes_per_param_table()}
    assert totals["bf16_master"] == totals["fp32"] == BASELINE_BYTES_PER_PARAM == 16
    assert totals["bf16_pure"] == 8 and totals["bf16_master_fp32_accum"] == 18
    with pytest.raises(KeyError, match="bf16_master"):
        model_state_recipe("int4")


@pytest.mark.parametrize("recipe", [PER_TENSOR, PER_TILE], ids=lambda r: r.granularity)
def test_an_fp8_linear_saves_one_byte_per_input_element_plus_scales(recipe):
    layer = Fp8Linear.from_linear(torch.nn.Linear(256, 128), recipe)
    x = torch.randn(64, 256, requires_grad=True)
    with ActivationMeter(layer) as meter:
        layer(x)
    per_element = activation_bytes_per_element("fp8", recipe.granularity, numel=x.numel())
    weight_copy = 128 * 256 + (4 if recipe is PER_TENSOR else 4 * 2)  # fp8 W and its scales
    assert meter.total_bytes == pytest.approx(x.numel() * per_element + weight_copy)
    assert activation_bytes_per_element("bf16") == 2 and activation_bytes_per_element("nvfp4") < 0.6


@pytest.mark.parametrize("granularity", ["tensor", "row", "tile"])
def test_fp8_gpt_saves_what_the_per_layer_gemm_input_formula_says(granularity):
    """Measured on the lab GPT (separate q/k/v: three FP8 copies of their shared input):
    fp32 saved bytes − FP8 saved bytes = n_layers × (formula fp32 − formula fp8), exactly."""
    from dtlab.precision import Fp8Recipe, convert_to_fp8

    config = GPTConfig.tiny(seq_len=128, d_model=256, n_heads=4)
    x, _ = SyntheticTokens(config, 1, 2)[0]
    saved = {}
    for name in ("fp32", "fp8"):
        model = GPT(config, seed=0)
        if name == "fp8":
            convert_to_fp8(model, Fp8Recipe(granularity))
        with ActivationMeter(model) as meter:
            model(x)
        saved[name] = meter.total_bytes
    shape = (config.seq_len, 2, config.d_model, config.d_ff)
    fp32 = gemm_input_bytes_per_layer(*shape, "fp32")
    fp8 = gemm_input_bytes_per_layer(*shape, "fp8", granularity, qkv_copies=3)
    assert saved["fp32"] - saved["fp8"] == config.n_layers * (fp32 - fp8)


def test_per_recipe_activation_formula_swaps_the_gemm_inputs_of_korthikantis():
    s, b, h, a = 4096, 1, 4096, 32
    sbh = s * b * h
    bf16 = activation_bytes_per_layer_for("bf16", s, b, h, a)
    assert bf16 == activation_bytes_per_layer(s, b, h, a)  # 34·sbh + 5·a·s²·b
    assert activation_bytes_per_layer_for("fp32", s, b, h, a) == bf16 + 14 * sbh
    fp8_tile = activation_bytes_per_layer_for("fp8", s, b, h, a, "tile")
    weights = 12 * h * h  # q, k, v, out (h²) + up, down (4h²): the FP8 weight copies
    scales = 4 * (s * b * (3 * h + 4 * h) // 128 + weights // (128 * 128))
    assert fp8_tile == bf16 - 7 * sbh + weights + scales
    # the FP8 weight copies (12h² bytes per layer) outweigh the 7·sbh saved on the inputs until
    # a micro-batch holds more than 12h/7 ≈ 1.7·h tokens: 4096 tokens do not, 16384 do
    assert fp8_tile > bf16
    big = {r: activation_bytes_per_layer_for(r, s, 4, h, a, "tile") for r in ("bf16", "fp8")}
    assert big["fp8"] < big["bf16"]
