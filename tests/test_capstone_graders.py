"""Lab 14's graders: wrong numbers, hard-coded answers, rank-dependent plans, bad plans and the
library's own answer (under any name) fail."""

from __future__ import annotations

import math

import dtlab
from dtlab.cost import gpu
from dtlab.plan import LLAMA_70B, ParallelPlan, plan_problems
from dtlab.plan import days_to_train as reference_training_days
from dtlab.plan import state_bytes_per_gpu as reference_memory_per_gpu
from dtlab.quiz import check_exercise
from dtlab.quiz.graders.capstone import async_checkpoint_interval_for


def test_reference_numbers_match_the_back_of_envelope():
    assert math.isclose(reference_training_days(LLAMA_70B), 12.0, rel_tol=0.01)
    assert reference_memory_per_gpu(70e9, ParallelPlan(dp=1, tp=1, pp=1, zero_stage=0)) == 1.12e12
    # async saves: 840 GB / 2048 GPUs over 63 GB/s PCIe = 6.5 ms stall, MTBF 24.4 h -> ~34 s
    assert math.isclose(async_checkpoint_interval_for(LLAMA_70B), 33.8, rel_tol=0.01)


def _async_interval(req):
    stall = 12 * req.params / req.n_gpus / gpu(req.gpu).host_link.bandwidth_bytes_per_s
    write = 12 * req.params / req.storage_write_bytes_per_s
    return max(math.sqrt(2 * stall * req.per_gpu_mtbf_hours * 3600 / req.n_gpus), write)


def test_the_async_interval_passes_and_the_sync_one_is_explained(cluster2):
    result = check_exercise("capstone.checkpoint_interval", _async_interval, cluster2, record=False)
    assert result, result.message

    def synchronous(req):
        write = 12 * req.params / req.storage_write_bytes_per_s
        return math.sqrt(2 * write * req.per_gpu_mtbf_hours * 3600 / req.n_gpus)

    result = check_exercise("capstone.checkpoint_interval", synchronous, cluster2, record=False)
    assert not result and "the cost in Young/Daly is that stall" in result.message

    def without_the_write_floor(req):
        stall = 12 * req.params / req.n_gpus / gpu(req.gpu).host_link.bandwidth_bytes_per_s
        return math.sqrt(2 * stall * req.per_gpu_mtbf_hours * 3600 / req.n_gpus)

    # with 2 GB/s storage one write (420 s) outlasts sqrt(2·S·MTBF): the floor binds there
    result = check_exercise(
        "capstone.checkpoint_interval", without_the_write_floor, cluster2, record=False
    )
    assert not result and "2 GB/s storage" in result.message


def test_plan_problems_name_every_broken_constraint():
    problems = plan_problems(LLAMA_70B, ParallelPlan(dp=16, tp=16, pp=3, zero_stage=4))
    text = "\n".join(problems)
    assert "dp·tp·pp = 768, but the job has 2048 GPUs" in text
    assert "TP 16 spans nodes" in text  # 80 layers over 3 stages is uneven, and allowed
    assert "ZeRO stage 4 does not exist" in text
    (batch,) = plan_problems(LLAMA_70B, ParallelPlan(dp=2048, tp=1, pp=1, zero_stage=1))
    assert "gives 0.5 micro-batches; need a whole number" in batch
    (memory,) = plan_problems(LLAMA_70B, ParallelPlan(dp=1024, tp=2, pp=1, zero_stage=0))
    assert memory.startswith("needs 605.6 GB per GPU") and "policy leaves 77.0 GB usable" in memory
    assert "usable_memory_fraction=0.9 of 79.6 GiB = 85.5 GB" in memory
    assert "528.7 GB (687%) over" in memory


def test_an_answer_hard_coded_for_the_70b_job_fails_on_the_others(cluster2):
    result = check_exercise("capstone.training_days", lambda req: 12.0, cluster2, record=False)
    assert not result and "13B on 256 A100-80GB: training days is 12.0" in result.message


def test_a_plan_that_differs_between_ranks_fails(cluster2):
    def rank_dependent(req):
        return ParallelPlan(dp=req.n_gpus // 8, tp=8, pp=1, zero_stage=1 + dtlab.rank())

    result = check_exercise("capstone.choose_plan", rank_dependent, cluster2, record=False)
    assert not result and "every rank must derive the same answer" in result.message


def test_a_plan_that_does_not_fit_is_explained(cluster2):
    def plain_ddp(req):
        return ParallelPlan(dp=req.n_gpus, tp=1, pp=1, zero_stage=0)

    result = check_exercise("capstone.choose_plan", plain_ddp, cluster2, record=False)
    assert not result and "7B on 64 H100: needs 130.3 GB per GPU" in result.message


def test_memory_without_zero_sharding_fails_with_the_plan_named(cluster2):
    def no_zero(params, plan):
        return 16 * params / (plan.tp * plan.pp)

    result = check_exercise("capstone.memory_per_gpu", no_zero, cluster2, record=False)
    assert not result and "zero_stage=3" in result.message


def test_calling_the_library_answer_fails_under_any_name(cluster2):
    from dtlab.cost import training_days as days
    from dtlab.cost import young_daly_interval as interval_from_the_library
    from dtlab.memory import model_state_bytes as state_bytes

    def training_days(req):
        peak = dtlab.cost.gpu(req.gpu).bf16_dense_flops
        return days(req.tokens, req.params, req.n_gpus, peak, req.mfu)

    def memory_per_gpu(params, plan):
        shard = math.ceil(params / (plan.tp * plan.pp))
        return float(state_bytes(shard, plan.dp, plan.zero_stage, "mixed_adam").total)

    def checkpoint_interval_s(req):
        write_s = 14 * req.params / req.storage_write_bytes_per_s
        return interval_from_the_library(write_s, req.per_gpu_mtbf_hours * 3600 / req.n_gpus)

    for exercise_id, fn, library in [
        ("capstone.training_days", training_days, "dtlab.cost.training_days"),
        ("capstone.memory_per_gpu", memory_per_gpu, "dtlab.memory.model_state_bytes"),
        ("capstone.checkpoint_interval", checkpoint_interval_s, "dtlab.cost.young_daly_interval"),
    ]:
        result = check_exercise(exercise_id, fn, cluster2, record=False)
        assert not result, f"{exercise_id} accepted {library}"
        assert f"your function calls {library}, which computes this answer" in result.message


def test_a_table_of_the_labs_answers_fails_on_jobs_the_lab_never_shows(cluster2):
    from dtlab.plan import JOBS

    table = {job.name: reference_training_days(job) for job in JOBS}

    def looked_up(req):
        return table.get(req.name, 0.0)

    result = check_exercise("capstone.training_days", looked_up, cluster2, record=False)
    assert not result and "34B on 512 H100: training days is 0.0" in result.message


def test_a_plan_from_the_planners_own_search_fails(cluster2):
    from dtlab.plan import first_plan_that_fits as search

    result = check_exercise("capstone.choose_plan", lambda req: search(req), cluster2, record=False)
    assert not result
    assert "your function calls dtlab.plan.first_plan_that_fits" in result.message


def test_the_dp_crossover_grader_accepts_the_formula_and_explains_the_step_mistake(cluster2):
    def right(peak, bus, ranks, grad_bytes):
        return 2 * (ranks - 1) / ranks * grad_bytes * peak / (4 * bus)

    result = check_exercise("capstone.dp_crossover", right, cluster2, record=False)
    assert result, result.message

    def whole_step(peak, bus, ranks, grad_bytes):
        return 2 * (ranks - 1) / ranks * grad_bytes * peak / (6 * bus)

    result = check_exercise("capstone.dp_crossover", whole_step, cluster2, record=False)
    assert not result and "overlaps *backward*" in result.message

    def large_n_only(peak, bus, ranks, grad_bytes):  # drops 2(N-1)/N: wrong for few ranks
        return 2 * grad_bytes * peak / (4 * bus)

    result = check_exercise("capstone.dp_crossover", large_n_only, cluster2, record=False)
    assert not result and "8 ranks" in result.message

    from dtlab.cost.crossover import dp_min_tokens_for as library

    result = check_exercise(
        "capstone.dp_crossover", lambda *case: library(*case), cluster2, record=False
    )
    assert not result and "dtlab.cost.crossover.dp_min_tokens_for" in result.message
