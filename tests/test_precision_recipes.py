"""The lab GPT trained under each precision recipe (20 steps, seconds): within a stated tolerance
of FP32 where the recipe is sound, and the failure modes reproduced where it is not — FP16
without loss scaling underflows, pure BF16 loses updates and lags, FP8 per-tensor scaling breaks
on a massive activation that per-tile scaling absorbs. Thresholds sit between the measured
healthy and broken values (measured figures in comments)."""

from __future__ import annotations

import pytest

from dtlab.precision.recipes import TRAINING_RECIPES, train_recipe

STEPS = 20
SOUND = 0.01  # |final loss - FP32's| for a sound recipe (measured: <= 0.002)
ACCUMULATION = 1024  # gradients 1024x smaller, as a loop accumulating 1024 micro-batches
MASSIVE = 2.0**16


@pytest.fixture(scope="module")
def fp32():
    return {
        "plain": train_recipe("fp32", STEPS).final_loss,
        "small_grads": train_recipe("fp32", STEPS, accumulation=ACCUMULATION).final_loss,
        "massive": train_recipe("fp32", STEPS, massive_activation=MASSIVE).final_loss,
    }


def test_fp32_learns_at_all(fp32):
    first = train_recipe("fp32", 1).losses[0]
    assert fp32["plain"] < first - 1.0  # ln(128) = 4.85 falls below 3.85


@pytest.mark.parametrize("recipe", ["bf16_master", "fp8_tensor", "fp8_tile"])
def test_sound_recipes_track_fp32(fp32, recipe):
    run = train_recipe(recipe, STEPS)
    assert abs(run.final_loss - fp32["plain"]) < SOUND
    assert run.lost_update_fraction < 1e-4  # measured ~5e-6 (fp32 masters keep small steps)


def test_pure_bf16_loses_updates_and_lags(fp32):
    run = train_recipe("bf16_pure", STEPS)
    assert run.lost_update_fraction > 0.01  # measured 3%: updates below half a bf16 spacing
    assert run.final_loss > fp32["plain"] + 0.02  # measured +0.048


def test_fp16_with_loss_scaling_tracks_fp32_on_small_gradients(fp32):
    run = train_recipe("fp16_scaled", STEPS, accumulation=ACCUMULATION)
    assert run.underflow_fraction < 1e-3  # measured 8e-5
    assert abs(run.final_loss - fp32["small_grads"]) < SOUND


def test_fp16_without_loss_scaling_underflows(fp32):
    run = train_recipe("fp16_unscaled", STEPS, accumulation=ACCUMULATION)
    assert run.underflow_fraction > 0.05  # measured 16% of gradient elements flushed to zero
    assert run.final_loss > fp32["small_grads"] + 0.05  # measured +0.14


def test_a_massive_activation_breaks_per_tensor_fp8_but_not_per_tile(fp32):
    per_tensor = train_recipe("fp8_tensor", STEPS, massive_activation=MASSIVE)
    per_tile = train_recipe("fp8_tile", STEPS, massive_activation=MASSIVE)
    assert per_tensor.final_loss > fp32["massive"] + 0.02  # measured +0.044
    assert abs(per_tile.final_loss - fp32["massive"]) < SOUND  # measured 0.0007


def test_an_unknown_recipe_lists_the_real_ones():
    with pytest.raises(ValueError, match="bf16_master"):
        train_recipe("fp4_everything")
    assert "fp16_scaled" in TRAINING_RECIPES
