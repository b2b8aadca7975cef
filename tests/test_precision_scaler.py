"""Dynamic loss scaling on one process: the same trajectory, skipped steps (read from the
optimizer) and parameters as torch.amp.GradScaler with planted overflows (whole-loss inf, one NaN
or inf element); scalers that never back off or step through an overflow are told apart;
hysteresis equals a line-by-line transcription of DeepSpeed's rule. The distributed half (one
rank's shard overflows) is in test_precision_scaler_sharded.py."""

from __future__ import annotations

import pytest
import torch

from dtlab.precision import (
    DynamicLossScaler,
    ScalerConfig,
    ScalerState,
    next_scale_state,
)

# step -> how it overflows: the whole loss times inf, or one planted element of one gradient
PLANTED = {2: "loss_inf", 3: "grad_nan", 9: "grad_inf", 13: "grad_inf", 14: "loss_inf"}


def _toy_run(scaler, steps: int = 24, planted=PLANTED):
    """Adam on a small MLP; returns (scale per step, steps the optimizer skipped, parameters).
    Skips are read from the optimizer itself (a step pre-hook), the same way for both scalers."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    stepped: set[int] = set()
    opt.register_step_pre_hook(lambda *_: stepped.add(step))
    g = torch.Generator().manual_seed(1)
    scales = []
    for step in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        loss = ((model(x) - y) ** 2).mean()
        how = planted.get(step)
        if how == "loss_inf":
            loss = loss * float("inf")
        opt.zero_grad()
        scales.append(scaler.get_scale())
        scaler.scale(loss).backward()
        if how in ("grad_nan", "grad_inf"):  # one element of one (scaled) gradient
            model[2].weight.grad[0, step % 16] = float("nan" if how == "grad_nan" else "inf")
        scaler.step(opt)
        scaler.update()
    skipped = [s for s in range(steps) if s not in stepped]
    return scales, skipped, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("interval", [1, 3, 4])
def test_scale_trajectory_skips_and_parameters_equal_torch_grad_scaler(interval):
    ours_scaler = DynamicLossScaler(ScalerConfig(init_scale=2.0**10, growth_interval=interval))
    ours = _toy_run(ours_scaler)
    torch_amp = _toy_run(torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=interval))
    assert ours[0] == torch_amp[0]  # the scale before every step
    assert ours[1] == torch_amp[1] == sorted(PLANTED) == ours_scaler.skipped_steps
    assert all(torch.equal(a, b) for a, b in zip(ours[2], torch_amp[2], strict=True))
    grew = [i for i in range(len(ours[0]) - 1) if ours[0][i + 1] == 2 * ours[0][i]]
    assert grew  # it grew after clean windows, not only backed off
    assert all(ours[0][s + 1] == ours[0][s] / 2 for s in PLANTED)  # and halved at each overflow


def test_a_scaler_that_never_backs_off_differs_from_grad_scaler():
    never = ScalerConfig(init_scale=2.0**10, growth_interval=3, backoff_factor=0.999)
    ours = _toy_run(DynamicLossScaler(never))
    torch_amp = _toy_run(torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3))
    assert ours[0] != torch_amp[0]


def test_a_scaler_that_steps_through_an_overflow_differs_from_grad_scaler():
    class StepsAnyway(DynamicLossScaler):
        def step(self, optimizer, grads=None):
            self.unscale_(optimizer)
            optimizer.step()
            return True

    ours = _toy_run(StepsAnyway(ScalerConfig(init_scale=2.0**10, growth_interval=3)))
    torch_amp = _toy_run(torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3))
    assert ours[1] == [] != torch_amp[1]  # the skips are read from the optimizer, not the scale
    assert not all(torch.isfinite(p).all() for p in ours[2])  # and the inf reached the weights


def test_hysteresis_skips_without_backing_off_until_the_allowance_is_spent():
    config = ScalerConfig(init_scale=8.0, growth_interval=2, hysteresis=2)
    state = ScalerState.start(config)
    state = next_scale_state(state, True, config)  # first overflow: skip, keep the scale
    assert (state.scale, state.hysteresis_left) == (8.0, 1)
    state = next_scale_state(state, True, config)  # second: back off
    assert state.scale == 4.0
    state = next_scale_state(next_scale_state(state, False, config), False, config)
    assert (state.scale, state.hysteresis_left) == (8.0, 2)  # grew, allowance refilled


class DeepSpeedRule:
    """DeepSpeed's ``DynamicLossScaler.update_scale`` (deepspeed/runtime/fp16/loss_scaler.py),
    transcribed line by line as the oracle for our hysteresis (``delayed_shift``)."""

    def __init__(self, init_scale, scale_window, delayed_shift, consecutive_hysteresis):
        self.cur_scale, self.cur_iter, self.last_overflow_iter = init_scale, 0, -1
        self.scale_factor, self.scale_window, self.min_scale = 2.0, scale_window, 1.0
        self.delayed_shift = self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            if (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1


@pytest.mark.parametrize("hysteresis", [1, 2, 3])
@pytest.mark.parametrize("consecutive", [False, True])
@pytest.mark.parametrize("window", [1, 2, 5])
def test_hysteresis_trajectory_equals_deepspeeds_rule(hysteresis, consecutive, window):
    config = ScalerConfig(
        init_scale=2.0**16,
        growth_interval=window,
        hysteresis=hysteresis,
        consecutive_hysteresis=consecutive,
        min_scale=1.0,
    )
    g = torch.Generator().manual_seed(hysteresis * 10 + window + consecutive)
    for _ in range(20):  # random overflow patterns, bursty: runs of overflows and of clean steps
        events = (torch.rand(60, generator=g) < torch.rand(1, generator=g)).tolist()
        ours, theirs = (
            ScalerState.start(config),
            DeepSpeedRule(2.0**16, window, hysteresis, consecutive),
        )
        for overflow in events:
            ours = next_scale_state(ours, overflow, config)
            theirs.update_scale(overflow)
            assert ours.scale == theirs.cur_scale
            assert ours.hysteresis_left == theirs.cur_hysteresis


def test_with_hysteresis_the_first_overflow_skips_without_backing_off():
    scaler = DynamicLossScaler(ScalerConfig(init_scale=2.0**10, growth_interval=4, hysteresis=2))
    scales, skipped, _ = _toy_run(scaler, steps=8, planted={2: "loss_inf", 3: "grad_inf"})
    assert skipped == [2, 3] == scaler.skipped_steps  # both overflowing steps are skipped
    assert scales[:5] == [2.0**10, 2.0**10, 2.0**10, 2.0**10, 2.0**9]  # only the second halves


def test_bad_scaler_settings_say_what_to_change():
    with pytest.raises(ValueError, match="backoff_factor"):
        ScalerConfig(backoff_factor=2.0)
    with pytest.raises(RuntimeError, match="before update"):
        DynamicLossScaler().update()
