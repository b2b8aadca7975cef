"""The lab GPT trained under each precision recipe (20 steps, seconds): within a stated tolerance
of FP32 where the recipe is sound, and the failure modes reproduced where it is not — FP16
without loss scaling underflows, pure BF16 loses updates and lags, FP8 per-tensor scaling breaks
on a massive activation that per-tile scaling absorbs. Both the final loss and the whole curve
(largest per-step gap) are held to thresholds; pure BF16 also stalls at a fine-tuning learning
rate, and the updates it drops are exactly those below half its spacing. Thresholds sit between
the measured healthy and broken values (measured figures in comments)."""

from __future__ import annotations

import pytest
import torch

from dtlab.precision.recipes import TRAINING_RECIPES, train_recipe

STEPS = 20
SOUND = 0.01  # |final loss - FP32's| for a sound recipe (measured: <= 0.002)
CURVE = 0.015  # max over steps of |loss - FP32's| for a sound recipe (measured: <= 0.008)
BROKEN_CURVE = 0.04  # a broken recipe's curve leaves FP32's by more (measured: >= 0.053)
ACCUMULATION = 1024  # gradients 1024x smaller, as a loop accumulating 1024 micro-batches
MASSIVE = 2.0**16


class _Reference(dict):
    """FP32 runs by setting: ``ref["plain"]`` is the final loss, ``ref.curve("plain")`` the
    per-step losses."""

    def __init__(self, runs):
        super().__init__({k: r.final_loss for k, r in runs.items()})
        self.runs = runs

    def curve_gap(self, key, run) -> float:
        return max(abs(a - b) for a, b in zip(run.losses, self.runs[key].losses, strict=True))


@pytest.fixture(scope="module")
def fp32():
    return _Reference(
        {
            "plain": train_recipe("fp32", STEPS),
            "small_grads": train_recipe("fp32", STEPS, accumulation=ACCUMULATION),
            "massive": train_recipe("fp32", STEPS, massive_activation=MASSIVE),
        }
    )


def test_fp32_learns_at_all(fp32):
    first = train_recipe("fp32", 1).losses[0]
    assert fp32["plain"] < first - 1.0  # ln(128) = 4.85 falls below 3.85


@pytest.mark.parametrize("recipe", ["bf16_master", "fp8_tensor", "fp8_tile"])
def test_sound_recipes_track_fp32(fp32, recipe):
    run = train_recipe(recipe, STEPS)
    assert abs(run.final_loss - fp32["plain"]) < SOUND
    assert fp32.curve_gap("plain", run) < CURVE  # the whole curve, not only its end
    assert run.lost_update_fraction < 1e-4  # measured ~5e-6 (fp32 masters keep small steps)


def test_pure_bf16_loses_updates_and_lags(fp32):
    run = train_recipe("bf16_pure", STEPS)
    assert run.lost_update_fraction > 0.01  # measured 3%: updates below half a bf16 spacing
    assert run.final_loss > fp32["plain"] + 0.02  # measured +0.048
    assert fp32.curve_gap("plain", run) > BROKEN_CURVE  # measured 0.058


def test_pure_bf16_stalls_at_a_fine_tuning_learning_rate():
    """At lr 1e-5 Adam's steps (~lr) sit below half the bf16 spacing of most weights: pure BF16
    drops them and barely moves, BF16 with FP32 masters learns exactly as FP32 does."""
    untrained = train_recipe("fp32", STEPS, lr=0.0).final_loss  # the data's own drift
    progress = {
        r: untrained - train_recipe(r, STEPS, lr=1e-5).final_loss
        for r in ("fp32", "bf16_master", "bf16_pure")
    }
    pure = train_recipe("bf16_pure", STEPS, lr=1e-5)
    assert pure.lost_update_fraction > 0.8  # measured 89% of updates rounded away
    assert progress["bf16_pure"] < 0.35 * progress["fp32"]  # measured 20% of FP32's progress
    assert progress["bf16_master"] == pytest.approx(progress["fp32"], rel=0.05)  # measured 0.5%


def test_the_updates_bf16_loses_are_exactly_those_below_half_its_spacing():
    torch.manual_seed(0)
    weights = (torch.rand(4096) * 0.5 + 1).to(torch.bfloat16)  # in (1, 1.5]: spacing 2^-7
    update = torch.logspace(-5, -1, 4096)  # what the optimizer asks for, in fp32
    stepped = (weights.float() - update).to(torch.bfloat16)  # a pure-bf16 weight after the step
    half_spacing = 2.0**-8
    lost = stepped == weights
    # away from the rounding tie, and from 1.0 itself (below it the spacing halves)
    clear = ((update - half_spacing).abs() > 0.02 * half_spacing) & (weights > 1)
    assert torch.equal(lost[clear], (update < half_spacing)[clear])
    master = weights.float() - update  # an fp32 master keeps every one of them
    assert (master != weights.float()).all()


def test_fp16_with_loss_scaling_tracks_fp32_on_small_gradients(fp32):
    run = train_recipe("fp16_scaled", STEPS, accumulation=ACCUMULATION)
    assert run.underflow_fraction < 1e-3  # measured 8e-5
    assert abs(run.final_loss - fp32["small_grads"]) < SOUND
    assert fp32.curve_gap("small_grads", run) < CURVE  # measured 0.0001


def test_fp16_without_loss_scaling_underflows(fp32):
    run = train_recipe("fp16_unscaled", STEPS, accumulation=ACCUMULATION)
    assert run.underflow_fraction > 0.05  # measured 16% of gradient elements flushed to zero
    assert run.final_loss > fp32["small_grads"] + 0.05  # measured +0.14
    assert fp32.curve_gap("small_grads", run) > BROKEN_CURVE  # measured 0.146


def test_a_massive_activation_breaks_per_tensor_fp8_but_not_per_tile(fp32):
    per_tensor = train_recipe("fp8_tensor", STEPS, massive_activation=MASSIVE)
    per_tile = train_recipe("fp8_tile", STEPS, massive_activation=MASSIVE)
    assert per_tensor.final_loss > fp32["massive"] + 0.02  # measured +0.047
    assert fp32.curve_gap("massive", per_tensor) > BROKEN_CURVE  # measured 0.053
    assert abs(per_tile.final_loss - fp32["massive"]) < SOUND  # measured 0.0005
    assert fp32.curve_gap("massive", per_tile) < CURVE  # measured 0.004


def test_an_unknown_recipe_lists_the_real_ones():
    with pytest.raises(ValueError, match="bf16_master"):
        train_recipe("fp4_everything")
    assert "fp16_scaled" in TRAINING_RECIPES


def test_flushing_fp32_denormals_leaves_an_fp16_run_bit_identical():
    """The FP16 recipes run with the CPU's flush-to-zero flags for speed; the values must not move."""
    slow = train_recipe("fp16_unscaled", 2, accumulation=1024, flush_denormals=False)
    fast = train_recipe("fp16_unscaled", 2, accumulation=1024)
    assert fast.losses == slow.losses
    assert fast.underflow_fraction == slow.underflow_fraction > 0
    assert fast.lost_update_fraction == slow.lost_update_fraction
