"""Stochastic rounding and Kahan summation in BF16 against FP32 masters (issue 32)."""

import pytest
import torch

from dtlab.precision import (
    BF16Updater,
    kahan_add_,
    round_up_probability,
    stochastic_round_to_bf16,
    updates_lost_demo,
    weight_bytes_per_parameter,
)

SPACING_AT_1 = 2.0**-7  # bf16 keeps 7 mantissa bits


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_stochastic_rounding_is_unbiased_and_returns_a_neighbour(sign):
    x = sign * (1.0 + 2**-9 + 2**-11)  # 0.3125 of the way from 1 to the next bf16 value
    samples = 200_000
    gen = torch.Generator().manual_seed(0)
    rounded = stochastic_round_to_bf16(torch.full((samples,), x), gen).float()
    lo, hi = sign * 1.0, sign * (1.0 + SPACING_AT_1)
    assert set(rounded.unique().tolist()) == {lo, hi}
    p = round_up_probability(x)
    assert p == pytest.approx(0.3125)
    # Each sample is lo or hi: std of the mean = spacing·sqrt(p(1-p)/N) ≈ 8.2e-6; allow 6 sigma.
    # Round to nearest would give lo, 0.00244 away.
    bound = 6 * SPACING_AT_1 * (p * (1 - p) / samples) ** 0.5
    assert abs(rounded.double().mean().item() - x) < bound
    assert abs((rounded == hi).double().mean().item() - p) < 6 * (p * (1 - p) / samples) ** 0.5


def test_stochastic_rounding_keeps_bf16_values_zeros_and_specials():
    exact = (torch.randn(10_000, generator=torch.Generator().manual_seed(1)) * 100).bfloat16()
    out = stochastic_round_to_bf16(exact.float(), torch.Generator().manual_seed(2))
    assert torch.equal(out, exact)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan")])
    out = stochastic_round_to_bf16(specials).float()
    assert out[:4].tolist() == [0.0, 0.0, float("inf"), float("-inf")]
    assert torch.signbit(out[1]) and not torch.signbit(out[0])
    assert torch.isnan(out[4])


def test_stochastic_rounding_refuses_non_fp32_input():
    with pytest.raises(TypeError, match="fp32"):
        stochastic_round_to_bf16(torch.ones(2, dtype=torch.bfloat16))


def test_kahan_accumulates_updates_that_pure_bf16_rounds_away():
    update, copies = 1e-3, 1000  # below half the spacing at 1.0 (2^-8 ≈ 0.0039)
    expected = torch.tensor(1.0)
    for _ in range(copies):
        expected += update  # the fp32 sum: 2.00005 (fp32 rounding of 1000 adds)
    assert expected.item() == pytest.approx(2.0, abs=1e-4)
    kahan = torch.ones(1, dtype=torch.bfloat16)
    compensation = torch.zeros_like(kahan)
    pure = torch.ones(1, dtype=torch.bfloat16)
    for _ in range(copies):
        kahan_add_(kahan, compensation, torch.tensor([update]))
        pure = (pure.float() + update).bfloat16()
    assert pure.item() == 1.0  # every one of the 1000 updates lost
    spacing_at_2 = 2.0**-6
    assert abs(kahan.float().item() - expected.item()) <= spacing_at_2


def test_kahan_refuses_fp32_buffers():
    with pytest.raises(TypeError, match="zeros_like"):
        kahan_add_(torch.ones(2), torch.zeros(2), torch.ones(2))


def test_weight_bytes_per_parameter_counts_master_copy_and_compensation():
    assert weight_bytes_per_parameter("fp32_master") == 6
    assert weight_bytes_per_parameter("kahan") == 4
    assert weight_bytes_per_parameter("stochastic") == 2
    assert weight_bytes_per_parameter("bf16") == 2
    with pytest.raises(ValueError, match="choose one of"):
        weight_bytes_per_parameter("fp8")


def test_master_mode_equals_plain_fp32_sgd():
    start = torch.randn(64, generator=torch.Generator().manual_seed(3))
    updater = BF16Updater.start(start, "fp32_master")
    reference = start.bfloat16().float()
    grad = torch.randn(64, generator=torch.Generator().manual_seed(4))
    for _ in range(10):
        updater.step(grad, 1e-3)
        reference -= 1e-3 * grad
    assert torch.equal(updater.value(), reference)
    assert torch.equal(updater.weight, reference.bfloat16())


def test_updates_lost_demo_pure_bf16_stalls_kahan_and_sr_track_the_master():
    run = updates_lost_demo(steps=400, lr=1e-5)
    travel = run.master_travel[-1]
    # Sign steps of 1e-5 for 400 steps: the master moves ~3.8e-3 RMS.
    assert 3e-3 < travel < 4.5e-3
    # Pure bf16 stalls: it stays ~as far from the master as the master has travelled (measured
    # 3.6e-3 = 93%), and the gap keeps growing (1.8e-3 at step 200).
    assert run.final("bf16") > 0.9 * travel
    assert run.final("bf16") > 1.8 * run.distance["bf16"][199]
    # Stochastic rounding follows in expectation, off by its rounding noise (measured 5.3e-4).
    assert run.final("stochastic") < 0.2 * travel
    # Kahan follows closely (measured 3.5e-5, under 1% of the travel).
    assert run.final("kahan") < 0.02 * travel
    assert run.final("kahan") < run.final("stochastic") < run.final("bf16")
