"""Fp8Linear quantises what the recipe says: E4M3 inputs and weights forward, E5M2 output
gradients backward (each GEMM equals the hand-built one from those FP8 values, and differs from
the one built with the other format); delayed scaling inside the layer keeps an amax history per
tensor role and saturates on a jump, current scaling does not; each GEMM names its path."""

from __future__ import annotations

import pytest
import torch

from dtlab.precision import GEMM_PATHS, Fp8Linear, Fp8Recipe, quantize_fp8, relative_error


def _layer_and_grads(recipe: Fp8Recipe):
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 128, bias=False)
    x = torch.randn(64, 256, requires_grad=True)
    dy = torch.randn(64, 128) * torch.logspace(-3, 1, 128)  # spread: formats differ visibly
    layer = Fp8Linear.from_linear(linear, recipe)
    out = layer(x)
    out.backward(dy)
    return linear.weight.detach(), x.detach(), dy, out.detach(), x.grad, linear.weight.grad


def _by_hand(w, x, dy, grad_format: str, granularity: str = "tensor"):
    """The three GEMMs from FP8 operands quantised by hand (simulated: dequantise, fp32)."""
    act, wt = ((1, 128), (128, 128)) if granularity == "tile" else (None, None)
    xq = quantize_fp8(x, "e4m3", granularity, act).dequantize()
    wq = quantize_fp8(w, "e4m3", granularity, wt).dequantize()
    dyq = quantize_fp8(dy, grad_format, granularity, act).dequantize()
    return xq @ wq.t(), dyq @ wq, dyq.t() @ xq


@pytest.mark.parametrize("granularity", ["tensor", "row", "tile"])
def test_forward_is_e4m3_and_gradients_are_e5m2(granularity):
    recipe = Fp8Recipe(granularity, use_scaled_mm=False)
    w, x, dy, out, grad_x, grad_w = _layer_and_grads(recipe)
    e5m2 = _by_hand(w, x, dy, "e5m2", granularity)
    e4m3 = _by_hand(w, x, dy, "e4m3", granularity)
    for got, want in zip((out, grad_x, grad_w), e5m2, strict=True):
        assert relative_error(want, got) < 1e-6
    # the gradients really went through E5M2: E4M3 (one more mantissa bit) gives other values
    for got, other in zip((grad_x, grad_w), e4m3[1:], strict=True):
        assert relative_error(other, got) > 1e-3


def test_scaled_mm_and_simulation_agree_on_all_three_gemms_and_name_their_path():
    results, paths = {}, {}
    for use in (True, False):
        GEMM_PATHS.clear()
        results[use] = _layer_and_grads(Fp8Recipe("tensor", use_scaled_mm=use))[3:]
        paths[use] = dict(GEMM_PATHS)
    assert paths[False] == {"forward:simulated": 1, "dgrad:simulated": 1, "wgrad:simulated": 1}
    assert set(paths[True]) <= {f"{g}:{p}" for g in ("forward", "dgrad", "wgrad") for p in (
        "scaled_mm", "simulated")}  # fmt: skip
    assert sum(paths[True].values()) == 3
    for a, b in zip(results[True], results[False], strict=True):
        assert relative_error(b, a) < 1e-5


def test_delayed_scaling_in_the_layer_saturates_on_a_jump_and_current_does_not():
    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 64, bias=False)
    layers = {
        scaling: Fp8Linear.from_linear(linear, Fp8Recipe(scaling=scaling, history=4))
        for scaling in ("delayed", "current")
    }
    g = torch.Generator().manual_seed(1)
    steady = torch.randn(32, 128, generator=g)
    quiet = [steady * 0.1, -steady * 0.1, steady * 0.05, steady * 0.1]  # amax never above 0.1×
    jump = torch.randn(32, 128, generator=g) * 100.0
    outputs = {}
    for scaling, layer in layers.items():
        for x in quiet:
            layer(x)
        assert layer.saturated["x"] == 0  # a steady amax: nothing saturates
        outputs[scaling] = layer(jump)
    delayed, current = layers["delayed"], layers["current"]
    assert len(delayed.histories["x"].history) == 4  # the last 4 amaxes, the jump included
    assert delayed.histories["x"].history[-1] == pytest.approx(float(jump.abs().max()))
    assert delayed.saturated["x"] > jump.numel() // 2 and current.saturated["x"] == 0
    reference = jump @ linear.weight.detach().t()
    assert relative_error(reference, outputs["delayed"]) > 10 * relative_error(
        reference, outputs["current"]
    )
    assert "w" in delayed.histories and "x" not in current.histories
