"""Recipes without a step time: the planner ranks the layout their authors recommend near its
top."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dtlab.plan.problems import plan_problems
from dtlab.plan.published import PUBLISHED_RUNS
from dtlab.plan.published_recipes import PUBLISHED_RECIPES, recipe_rank_fraction
from dtlab.plan.published_run import passing_plans_timed
from dtlab.plan.step_time import step_time


@pytest.mark.parametrize("recipe", PUBLISHED_RECIPES, ids=lambda r: r.name)
def test_the_recommended_layout_passes_and_ranks_in_the_fastest_hundredth(recipe):
    assert plan_problems(recipe.job, recipe.plan) == []
    assert recipe_rank_fraction(recipe) < 0.01


@pytest.mark.parametrize("recipe", PUBLISHED_RECIPES, ids=lambda r: r.name)
def test_the_recipes_tp_4_beats_the_same_layout_at_tp_8(recipe):
    """The degree is what the recipe chose: TP 8 with the same depth and interleaving (half the
    data parallelism) is slower."""
    tp8 = replace(recipe.plan, tp=8, dp=recipe.plan.dp // 2)
    assert plan_problems(recipe.job, tp8) == []
    assert step_time(recipe.job, recipe.plan).step_s < step_time(recipe.job, tp8).step_s


@pytest.mark.parametrize("gpus", ["384", "768", "1,536"])
def test_the_fastest_recomputing_plan_ahead_of_the_2021_layout_is_tp_4_like_the_recipe(gpus):
    """Of the plans faster than Narayanan et al.'s TP 8 × PP 12 under 2021's software, the
    fastest that recomputes whole layers as that layout did is TP 4 — the degree NVIDIA's
    later recipe for the same model chose."""
    run = next(r for r in PUBLISHED_RUNS if r.name == f"GPT-3 175B, {gpus} A100 PTD-P")
    published = step_time(run.job, run.plan).step_s
    ahead = [p for t, p in passing_plans_timed(run.job) if t.step_s < published]
    assert {r.plan.tp for r in PUBLISHED_RECIPES} == {4}
    assert next(p for p in ahead if p.recompute == "full").tp == 4
