"""The planner (dtlab.plan): its search agrees with lab 14's, its plans pass its own checklist,
its layouts are the mesh's, and its bytes on the wire are the ring formulas."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from dtlab.mesh import Layout
from dtlab.plan import (
    JOBS,
    LLAMA_7B,
    LLAMA_70B,
    ParallelPlan,
    Requirements,
    candidate_plans,
    first_plan_that_fits,
    micro_batches,
    plan_problems,
    state_bytes_per_gpu,
    traffic_per_gpu,
)
from dtlab.quiz.graders.capstone import GRADED_JOBS
from dtlab.workshop.exercises import list_exercises, load_exercise_function
from dtlab.workshop.source import read_lab_source

REPO = Path(__file__).resolve().parents[1]


def _lab_choose_plan():
    lab = read_lab_source(REPO / "solutions" / "14_capstone.py")
    (found,) = [e for e in list_exercises(lab) if e.exercise_id == "capstone.choose_plan"]
    return load_exercise_function(found, "solution")


def test_the_planners_search_finds_the_plan_lab_12s_solution_finds_for_every_graded_job():
    choose_plan = _lab_choose_plan()
    for job in GRADED_JOBS:
        assert first_plan_that_fits(job) == choose_plan(job), job.name


@pytest.mark.parametrize("job", GRADED_JOBS, ids=lambda job: job.name)
def test_the_chosen_plan_uses_every_gpu_and_passes_the_checklist(job: Requirements):
    plan = first_plan_that_fits(job)
    assert plan.world_size == job.n_gpus
    assert plan_problems(job, plan) == []


def test_candidates_come_smallest_tp_then_fewest_stages_then_lowest_zero_then_fewest_chunks():
    plans = list(candidate_plans(LLAMA_70B))
    classic = [p for p in plans if (p.cp, p.micro_batch_size, p.recompute) == (1, 1, "selective")]
    assert plans[: len(classic)] == classic  # the classic (dp, tp, pp) search runs first
    schedules = ("1f1b", "zb-h1", "dualpipe")
    order = [
        (p.tp, p.pp, p.zero_stage, p.virtual_stages, schedules.index(p.schedule)) for p in classic
    ]
    assert order == sorted(order) and len(order) == len(set(order))
    assert all(tp <= LLAMA_70B.gpus_per_node for tp, *_ in order)
    assert all(v == 1 for _, pp, _, v, _ in order if pp == 1)
    assert all(p.ep == 1 for p in plans)  # a dense job never tries expert parallelism


def test_a_job_nothing_fits_is_refused_with_what_to_change():
    huge = Requirements("1T on 8 H100", 1e12, 128, 16384, 128, 4096, 1e12, 2**20, 8)
    with pytest.raises(ValueError, match="no plan fits 1T on 8 H100: .* add GPUs"):
        first_plan_that_fits(huge)


def test_a_plans_layout_is_the_mesh_layout_with_tp_groups_inside_one_node():
    plan = ParallelPlan(dp=64, tp=8, pp=4, zero_stage=1)
    assert plan.layout == Layout(dp=64, tp=8, pp=4)
    assert plan.layout.world_size == plan.world_size == LLAMA_70B.n_gpus
    for group in plan.layout.groups("tp"):
        assert group == list(range(group[0], group[0] + 8))
        assert len({rank // LLAMA_70B.gpus_per_node for rank in group}) == 1
    assert ParallelPlan.from_layout(plan.layout, zero_stage=1) == plan


def test_a_layout_with_context_and_expert_parallelism_is_a_plan_with_them():
    layout = Layout(dp=4, tp=2, cp=2, ep=2)
    plan = ParallelPlan.from_layout(layout, zero_stage=1, recompute="full")
    assert plan == ParallelPlan(4, 2, 1, 1, 1, 1, cp=2, ep=2, recompute="full")
    assert plan.world_size == layout.world_size == 16 and plan.layout == layout
    assert plan.expert_data_parallel == 2


def test_state_bytes_are_16_per_parameter_of_the_model_shard_with_zero_over_dp():
    assert state_bytes_per_gpu(70e9, ParallelPlan(dp=1, tp=1, pp=1, zero_stage=0)) == 16 * 70e9
    shard = 70e9 / 32
    zero1 = state_bytes_per_gpu(70e9, ParallelPlan(dp=64, tp=8, pp=4, zero_stage=1))
    assert math.isclose(zero1, shard * (2 + 2 + 12 / 64), rel_tol=1e-9)


def test_bytes_each_gpu_sends_per_step_match_the_ring_formulas():
    job, plan = LLAMA_70B, ParallelPlan(dp=64, tp=8, pp=4, zero_stage=1, virtual_stages=2)
    traffic = traffic_per_gpu(job, plan)
    psi, n, m = job.params / 32, 64, micro_batches(job, plan)
    sbh = job.seq_len * plan.micro_batch_size * job.d_model * 2  # bf16
    assert math.isclose(traffic.dp, 2 * (n - 1) / n * psi * 2, rel_tol=1e-6)  # one all-reduce
    assert math.isclose(
        traffic.tp, m * (80 / 4) * 10 * (7 / 8) * sbh, rel_tol=1e-12
    )  # SP: 4 AG + 4 RS, and backward's 2 re-gathers of the stored input shards
    plain = traffic_per_gpu(job, replace(plan, sequence_parallel=False))
    assert math.isclose(plain.tp, m * (80 / 4) * 8 * (7 / 8) * sbh, rel_tol=1e-12)  # 4 AR
    # activations forward, gradients back, v = 2 chunks; each of the 8 TP ranks sends its slice
    assert traffic.pp == 2 * 2 * m * sbh / 8
    assert traffic.total == traffic.dp + traffic.tp + traffic.pp
    zero3 = traffic_per_gpu(job, ParallelPlan(dp=64, tp=8, pp=4, zero_stage=3, virtual_stages=2))
    # every one of the m micro-batches gathers the parameters twice and reduce-scatters once
    assert math.isclose(zero3.dp, 1.5 * m * traffic.dp, rel_tol=1e-6)


def test_without_tp_or_a_pipeline_only_data_parallel_traffic_is_left():
    plan = ParallelPlan(dp=64, tp=1, pp=1, zero_stage=1)
    traffic = traffic_per_gpu(LLAMA_7B, plan)
    assert traffic.tp == 0 and traffic.pp == 0 and traffic.dp > 0


def test_the_lab_jobs_are_the_llama_2_shapes():
    assert [(j.n_layers, j.d_model, j.n_heads) for j in JOBS] == [
        (80, 8192, 64),
        (40, 5120, 40),
        (32, 4096, 32),
    ]
