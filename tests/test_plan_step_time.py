"""The planner's step-time model: a plan that fits can still be communication-bound."""

from __future__ import annotations

import pytest

from dtlab.cost.hardware import IB_NDR_400
from dtlab.plan import JOBS, LLAMA_70B, ParallelPlan, first_plan_that_fits, traffic_per_gpu
from dtlab.plan.step_time import MATMUL_EFFICIENCY, fastest_plans, step_time


def test_the_first_70b_plan_that_fits_memory_is_communication_bound_and_a_faster_one_exists():
    chosen = first_plan_that_fits(LLAMA_70B)
    slow = step_time(LLAMA_70B, chosen)
    assert slow.communication_bound and slow.dp_exposed_s > slow.compute_s
    best_plan, best = fastest_plans(LLAMA_70B, 1)[0]
    assert not best.communication_bound and best.step_s < slow.step_s / 2
    assert best_plan.tp > chosen.tp or best_plan.pp > chosen.pp  # fewer, larger dp shards


@pytest.mark.parametrize("req", JOBS, ids=lambda r: r.name)
def test_step_time_adds_up_and_mfu_never_exceeds_the_matmul_efficiency(req):
    for _, t in fastest_plans(req, 3):
        assert t.step_s >= t.compute_s
        assert t.step_s == pytest.approx(
            (t.compute_s + t.tp_s + t.pp_s) / (1 - t.bubble) + t.dp_exposed_s
        )
        assert 0 < t.mfu <= MATMUL_EFFICIENCY + 1e-12


def test_a_dp_group_across_nodes_runs_at_the_nic_bandwidth():
    plan = ParallelPlan(dp=1024, tp=2, pp=1, zero_stage=3)
    t = step_time(LLAMA_70B, plan)
    assert t.dp_s == pytest.approx(
        traffic_per_gpu(LLAMA_70B, plan).dp / IB_NDR_400.bandwidth_bytes_per_s
    )
