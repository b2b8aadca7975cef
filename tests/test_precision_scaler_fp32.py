"""The loss scale is an FP32 value, as in torch.amp.GradScaler: for many growth and backoff
factors, starting scales (2**127 at FP32's ceiling, 3.0, 65536, subnormals) and growth intervals,
dtlab's scale, clean-step count (GradScaler's growth tracker) and skip decisions equal
GradScaler's bit for bit after every step of a planted clean/overflow sequence; the update rule
alone equals the ``_amp_update_scale_`` kernel even where GradScaler's verdicts would always be
overflow; a growth past FP32's largest number is refused instead of skipping every other step."""

from __future__ import annotations

import pytest
import torch

from dtlab.precision import DynamicLossScaler, ScalerConfig, ScalerState, next_scale_state

# (growth_factor, backoff_factor): GradScaler's own, odd ratios whose products round in FP32,
# and factors so close to 1 that a step may round back to the same scale
FACTORS = [
    (2.0, 0.5),
    (1.5, 0.3),
    (1.0001, 0.999),
    (3.7, 0.1),
    (1.0 + 2.0**-30, 1.0 - 2.0**-30),
    (2.0, 0.3),
]
# FP32's largest power of two, near-max, ordinary, not representable in FP32 (0.1, 1e-30),
# the smallest normal and subnormal numbers
STARTS = [2.0**127, 3.0e38, 1.0, 3.0, 27.0, 65536.0, 0.1, 1e-30, 2.0**-126, 2.0**-149]
# c = clean step, o = an inf in one gradient: runs of growth and of backoff
EVENTS = "ccccccoccccccccooccccccccocccccccccccoooccccccccc"
TRUE_GRAD = torch.tensor([1.5, -0.25, 3.0, 1e-3])  # what backward would give for the loss itself


def run_scaler_steps(
    scaler, events: str, true_grad: torch.Tensor = TRUE_GRAD
) -> list[tuple[str, int, bool]]:
    """Per step: (the scale after update, in hex; the growth tracker; whether the optimizer
    stepped). Gradients are ``scaler.scale(true_grad)`` on ``true_grad``'s device (the GPU suite
    runs it on CUDA), as backward of the scaled loss gives
    them; an overflow plants one inf. Steps are read from the optimizer (a pre-hook)."""
    param = torch.nn.Parameter(torch.zeros_like(true_grad))
    opt = torch.optim.SGD([param], lr=0.0)
    stepped: list[bool] = []
    opt.register_step_pre_hook(lambda *_: stepped.__setitem__(-1, True))
    out = []
    for event in events:
        stepped.append(False)
        grad = scaler.scale(true_grad).detach().float()
        if event == "o":
            grad[1] = float("inf")
        param.grad = grad
        scaler.step(opt)
        scaler.update()
        if isinstance(scaler, DynamicLossScaler):
            tracker = scaler.state.clean_steps
        else:
            tracker = int(scaler._get_growth_tracker())
        out.append((float(scaler.get_scale()).hex(), tracker, stepped[-1]))
    return out


@pytest.mark.parametrize("interval", [1, 2, 5])
@pytest.mark.parametrize(("growth", "backoff"), FACTORS)
def test_scale_tracker_and_skips_equal_grad_scaler_bit_for_bit(growth, backoff, interval):
    for start in STARTS:
        knobs = dict(growth_factor=growth, backoff_factor=backoff, growth_interval=interval)
        ours = run_scaler_steps(DynamicLossScaler(ScalerConfig(init_scale=start, **knobs)), EVENTS)
        theirs = run_scaler_steps(torch.amp.GradScaler("cpu", init_scale=start, **knobs), EVENTS)
        for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert a == b, (
                f"start {start}, step {step} ({EVENTS[step]}): dtlab (scale, tracker, stepped) "
                f"{a}, GradScaler {b}"
            )


@pytest.mark.parametrize("interval", [1, 3])
@pytest.mark.parametrize(("growth", "backoff"), FACTORS)
def test_update_rule_equals_the_amp_update_scale_kernel(growth, backoff, interval):
    """The rule alone, with the verdicts planted (at a subnormal scale GradScaler's own unscale
    overflows on every step, so the run above never grows there)."""
    for start in STARTS:
        config = ScalerConfig(
            init_scale=start, growth_factor=growth, backoff_factor=backoff, growth_interval=interval
        )
        state = ScalerState.start(config)
        scale = torch.full((), start, dtype=torch.float32)
        tracker = torch.zeros((), dtype=torch.int32)
        assert state.scale == scale.item()
        for step, event in enumerate(EVENTS):
            found_inf = torch.full((), 1.0 if event == "o" else 0.0)
            torch._amp_update_scale_(scale, tracker, found_inf, growth, backoff, interval)
            state = next_scale_state(state, event == "o", config)
            assert (state.scale.hex(), state.clean_steps) == (
                scale.item().hex(),
                int(tracker),
            ), f"start {start}, step {step}"


def test_growth_past_fp32_max_is_refused_and_no_step_is_skipped():
    """From 2**127, doubling gives 2**128: a finite Python float, inf in FP32. Kept, the scaled
    gradients overflow and the scaler skips every other step (grow, overflow, back off, ...)."""
    scaler = DynamicLossScaler(ScalerConfig(init_scale=2.0**127, growth_interval=1))
    run = run_scaler_steps(
        scaler, "c" * 8, true_grad=TRUE_GRAD / 4
    )  # finite at 2**127, inf at 2**128
    assert [stepped for _, _, stepped in run] == [True] * 8
    assert {scale for scale, _, _ in run} == {(2.0**127).hex()}
    assert [tracker for _, tracker, _ in run] == [0] * 8  # the tracker resets, as the kernel's


def test_backoff_rounds_to_fp32_as_grad_scaler_does():
    config = ScalerConfig(init_scale=27.0, backoff_factor=0.3)
    state = next_scale_state(ScalerState.start(config), True, config)
    assert state.scale == 8.100000381469727 != 27.0 * 0.3  # fp32(8.1), not the double 8.1
    assert ScalerState.start(ScalerConfig(init_scale=0.1)).scale == 0.10000000149011612


@pytest.mark.parametrize("start", [2.0**128, 1e39, 2.0**-150, 1e-50])
def test_a_start_outside_fp32_says_what_to_choose(start):
    with pytest.raises(ValueError, match=r"finite in FP32.*2\*\*127"):
        ScalerConfig(init_scale=start)


def test_a_refused_growth_still_refills_the_hysteresis_allowance():
    """A whole growth interval passed without overflow, which is what the refill rewards; only
    the multiplication was impossible."""
    config = ScalerConfig(init_scale=2.0**127, growth_interval=1, hysteresis=2)
    state = next_scale_state(ScalerState.start(config), True, config)  # spends the allowance
    assert (state.scale, state.hysteresis_left) == (2.0**127, 1)
    state = next_scale_state(state, False, config)  # the growth to 2**128 is refused
    assert (state.scale, state.clean_steps, state.hysteresis_left) == (2.0**127, 0, 2)
