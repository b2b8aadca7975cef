"""A batch ramp as part of the job (:mod:`dtlab.plan.batch_ramp`): every stage must split into
the plan's micro-batches, and the time to train prices each stage at its own step time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dtlab.plan import LLAMA_70B, ParallelPlan, plan_problems
from dtlab.plan.batch_ramp import (
    ramp_overhead,
    ramp_stages,
    ramp_step_times,
    time_to_train_s,
)
from dtlab.plan.megatron_jobs import GPT3_175B
from dtlab.plan.step_time import fastest_plans, step_time

MIB = 2**20
RAMPED_70B = replace(LLAMA_70B, batch_ramp=((20e9, 1 * MIB), (80e9, 2 * MIB)))
"""Llama 2 70B's job starting at 256 sequences of 4,096, then 512, then its 1,024."""
PLAN = ParallelPlan(dp=32, tp=2, pp=8, zero_stage=1, virtual_stages=4, cp=4)


def test_the_stages_are_the_ramp_then_the_final_batch_with_the_tokens_left():
    stages = ramp_stages(RAMPED_70B)
    assert [t for t, _ in stages] == [20e9, 80e9, 2e12 - 100e9]
    assert [j.global_batch_tokens for _, j in stages] == [MIB, 2 * MIB, 4 * MIB]
    assert all(j.batch_ramp == () for _, j in stages)


@pytest.mark.parametrize(
    ("ramp", "named"),
    [
        (((1e9, MIB + 1),), "use whole sequences of 4096 tokens"),
        (((1e9, 8 * MIB),), "fewer than the final batch"),
        (((3e12, MIB),), "leave some for the final batch"),
        (((0.0, MIB),), "give > 0"),
    ],
)
def test_a_ramp_that_cannot_be_is_refused_with_what_to_change(ramp, named):
    job = replace(LLAMA_70B, batch_ramp=ramp)
    assert any(named in p for p in plan_problems(job, PLAN))
    with pytest.raises(ValueError, match=named.split(" of")[0]):
        ramp_stages(job)


def test_a_layout_with_more_data_parallel_ranks_than_the_first_batch_has_sequences_is_refused():
    wide = ParallelPlan(dp=1024, tp=1, pp=1, zero_stage=3, cp=2)
    assert plan_problems(LLAMA_70B, wide) == []
    (problem, _) = plan_problems(RAMPED_70B, wide)
    assert "during the batch ramp at 256 sequences per step" in problem
    assert "0.25 micro-batches" in problem
    with pytest.raises(ValueError, match="cannot run the batch ramp"):
        ramp_step_times(RAMPED_70B, wide)


def test_megatrons_2021_recipe_ramp_refuses_interleaving_at_its_small_batches():
    """``--rampup-batch-size 16 16 5859375``: 16, 32, … 1,520 sequences (95 increments) before
    1,536. Megatron's interleaved schedule asserts micro-batches divisible by pp; plain 1F1B runs
    them all."""
    step = 5_859_375 / 95 * 2048
    ramp = tuple((step, 16 * k * 2048) for k in range(1, 96))
    job = replace(GPT3_175B, batch_ramp=ramp)
    interleaved = ParallelPlan(4, 8, 12, 0, 1, 2, recompute="full", sequence_parallel=False)
    problems = plan_problems(job, interleaved)
    assert "at 16 sequences per step, 4 micro-batches per pipeline: interleaving" in problems[0]
    assert plan_problems(job, replace(interleaved, virtual_stages=1)) == []


def test_time_to_train_adds_each_stages_steps_at_its_own_step_time():
    expected = 0.0
    for tokens, batch in ((20e9, MIB), (80e9, 2 * MIB), (2e12 - 100e9, 4 * MIB)):
        job = replace(LLAMA_70B, global_batch_tokens=batch)
        expected += tokens / batch * step_time(job, PLAN).step_s
    assert time_to_train_s(RAMPED_70B, PLAN) == pytest.approx(expected)


def test_a_smaller_batch_costs_more_time_per_token():
    """Fewer micro-batches fill the same pipeline: the bubble's share grows."""
    per_token = [step / job.global_batch_tokens for (_, job), (_, step) in zip(
        ramp_stages(RAMPED_70B), ramp_step_times(RAMPED_70B, PLAN), strict=True
    )]  # fmt: skip
    assert per_token == sorted(per_token, reverse=True)
    assert 1.0 < ramp_overhead(RAMPED_70B, PLAN) < 1.05


def test_zero_bubble_and_dualpipe_need_their_micro_batches_at_every_ramp_stage():
    """ZB-H1 fills its drain with pp micro-batches' deferred weight gradients, DualPipe needs
    2·pp (DeepSeek's implementation asserts it): a ramp stage with fewer is refused."""
    zb = ParallelPlan(dp=16, tp=8, pp=16, zero_stage=1, schedule="zb-h1")
    job = replace(LLAMA_70B, batch_ramp=((1e9, 16 * 4096),), max_bubble=1.0)
    (problem,) = plan_problems(job, zb)
    assert "at 16 sequences per step, 1 micro-batches per pipeline: ZB-H1" in problem
    assert plan_problems(job, replace(zb, schedule="1f1b")) == []


def test_the_planner_only_proposes_layouts_that_run_the_whole_ramp():
    """Without the ramp the fastest 70B plan is DP 1,024 × CP 2; 256 sequences cannot feed it."""
    ((unramped, _),) = fastest_plans(LLAMA_70B, 1)
    assert unramped.dp * unramped.micro_batch_size > 256
    for plan, _ in fastest_plans(RAMPED_70B, 3):
        assert plan_problems(RAMPED_70B, plan) == []
        assert 256 % (plan.dp * plan.micro_batch_size) == 0
