"""NVFP4 and its training recipe, simulated bit-exactly: values on the NVFP4 grid, 2-D weight
blocks that forward and backward share, the Hadamard rotation that leaves wgrad exact, and
stochastic rounding that is unbiased (dtlab.precision.microscaling, dtlab.precision.nvfp4_linear)."""

import pytest
import torch

from dtlab.precision.microscaling import (
    E2M1_GRID,
    bits_per_value,
    nvfp4_quantize,
    round_to_e2m1,
)
from dtlab.precision.nvfp4_linear import (
    NVFP4_NAIVE,
    NVFP4_RECIPE,
    Nvfp4Linear,
    Nvfp4Recipe,
    random_hadamard,
    rotate_tokens,
    weight_mismatch,
    wgrad,
)
from dtlab.precision.recipes import train_recipe


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_every_value_is_an_e2m1_code_times_an_e4m3_block_scale_times_the_tensor_scale():
    q = nvfp4_quantize(_randn(64, 128), (16, 16))
    assert set(q.values.abs().unique().tolist()) <= set(E2M1_GRID.tolist())
    assert q.block_scales.dtype == torch.float8_e4m3fn and q.block_scales.shape == (4, 8)
    assert q.tensor_scale == pytest.approx(float(_randn(64, 128).abs().max()) / (448 * 6))
    for block in ((16, 16), (1, 16)):
        bits = nvfp4_quantize(_randn(64, 128), block).nbytes * 8 / (64 * 128)
        assert bits == pytest.approx(bits_per_value("nvfp4") + 32 / (64 * 128)) == 4.5 + 1 / 256


def test_a_2d_weight_block_reads_the_same_transposed_so_dgrad_sees_forwards_weight():
    w = _randn(64, 128)
    assert weight_mismatch(w, NVFP4_RECIPE) == 0.0
    assert weight_mismatch(w, Nvfp4Recipe(two_d_weights=False)) > 0.05
    two_d = nvfp4_quantize(w, (16, 16)).dequantize()
    assert torch.equal(nvfp4_quantize(w.t().contiguous(), (16, 16)).dequantize(), two_d.t())


def test_the_random_hadamard_rotation_is_orthogonal_so_unquantised_wgrad_is_unchanged():
    q = random_hadamard(seed=3)
    assert torch.allclose(q.t() @ q, torch.eye(16), atol=1e-6)
    x, dy = _randn(64, 32).double(), _randn(64, 8, seed=1).double()
    rotated = rotate_tokens(dy, q.double()).t() @ rotate_tokens(x, q.double())
    assert torch.allclose(rotated, dy.t() @ x, atol=1e-10)


def _crest_factor_of_group(t, first_token):
    group = t[first_token : first_token + 16]
    return float((group.abs().amax(0) / group.pow(2).mean(0).sqrt()).mean())


def test_the_rotation_spreads_a_token_outlier_over_its_group_of_16_tokens():
    """What RHT does to a block: a lone spike has max/rms = sqrt(16) = 4 over its 16-token block
    (the other 15 values sit near zero on the E2M1 grid); rotated, the 16 values are about
    equal (max/rms near 1), so the block's scale serves all of them."""
    x = _randn(256, 64)
    x[5] *= 200
    rotated = rotate_tokens(x, random_hadamard(seed=0))
    assert _crest_factor_of_group(x, 0) > 3.5
    assert _crest_factor_of_group(rotated, 0) < 1.5
    assert torch.allclose(rotated.norm(dim=0), x.norm(dim=0), rtol=1e-5)  # energy kept


def test_stochastic_rounding_is_unbiased_where_nearest_rounding_is_not():
    x = torch.full((20000,), 0.2)  # 0.4 of the gap between E2M1's 0 and 0.5
    gen = torch.Generator().manual_seed(0)
    assert round_to_e2m1(x).mean() == 0.0
    assert float(round_to_e2m1(x, stochastic=True, generator=gen).mean()) == pytest.approx(
        0.2, abs=0.01
    )


def test_stochastic_rounding_is_reproducible_from_its_generator():
    x = _randn(32, 64)
    a = nvfp4_quantize(x, (1, 16), True, torch.Generator().manual_seed(7)).dequantize()
    b = nvfp4_quantize(x, (1, 16), True, torch.Generator().manual_seed(7)).dequantize()
    assert torch.equal(a, b)
    assert not torch.equal(a, nvfp4_quantize(x, (1, 16)).dequantize())


def test_nvfp4_linear_gradients_are_the_recipes_gemms():
    lin = torch.nn.Linear(64, 32, bias=False)
    x = _randn(32, 64).requires_grad_()
    layer = Nvfp4Linear.from_linear(lin, NVFP4_NAIVE)
    layer(x).sum().backward()
    dy = torch.ones(32, 32)
    wq = nvfp4_quantize(lin.weight, (1, 16)).dequantize()
    w_col = nvfp4_quantize(lin.weight.t().contiguous(), (1, 16)).dequantize().t()
    dyq = nvfp4_quantize(dy, (1, 16)).dequantize()
    assert not torch.equal(wq, w_col)
    assert torch.allclose(x.grad, dyq @ w_col, atol=1e-6)
    want_w = wgrad(x.detach(), dy, NVFP4_NAIVE, torch.Generator())
    assert torch.allclose(lin.weight.grad, want_w, atol=1e-6)


def test_the_lab_gpt_trains_in_nvfp4_close_to_fp32():
    fp32 = train_recipe("fp32", 8).final_loss
    nvfp4 = train_recipe("nvfp4", 8).final_loss
    assert abs(nvfp4 - fp32) < 0.05
    assert nvfp4 < train_recipe("fp32", 8, lr=0.0).final_loss - 0.1


def test_a_block_that_does_not_divide_the_matrix_says_how_to_pad():
    with pytest.raises(ValueError, match="pad it"):
        nvfp4_quantize(torch.randn(20, 32), (16, 16))
    with pytest.raises(ValueError, match="power-of-two"):
        random_hadamard(0, size=12)
