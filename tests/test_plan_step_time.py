"""The planner's step-time model: a plan that fits can still be communication-bound, and each
mechanism's communication shows only where nothing hides it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dtlab.cost.hardware import IB_NDR_400
from dtlab.plan import JOBS, LLAMA_70B, ParallelPlan, first_plan_that_fits
from dtlab.plan.constants import GEMM_MAX_FRACTION
from dtlab.plan.layout_cost import dp_bytes_per_step
from dtlab.plan.step_time import fastest_plans, step_time


def test_the_first_70b_plan_that_fits_is_communication_bound_only_with_one_nic_per_node():
    chosen = first_plan_that_fits(LLAMA_70B)
    rails = step_time(LLAMA_70B, chosen)
    one_nic = step_time(LLAMA_70B, chosen, nics_per_node=1)
    assert not rails.communication_bound and one_nic.communication_bound
    assert one_nic.dp_s == pytest.approx(8 * rails.dp_s)  # 8 NICs shared vs 1
    best_plan, best = fastest_plans(LLAMA_70B, 1, nics_per_node=1)[0]
    assert not best.communication_bound and best.step_s < one_nic.step_s / 2
    assert best_plan.tp * best_plan.pp > chosen.tp * chosen.pp  # smaller dp shards to reduce


@pytest.mark.parametrize("req", JOBS, ids=lambda r: r.name)
def test_the_step_covers_its_compute_and_mfu_stays_under_what_gemms_sustain(req):
    for _, t in fastest_plans(req, 3):
        assert t.step_s >= t.compute_s + t.recompute_s
        assert t.step_s >= t.compute_s + t.exposed_communication_s - t.pp_exposed_s
        assert 0 < t.mfu < t.mfu_attention <= GEMM_MAX_FRACTION[req.gpu]


def test_a_dp_group_across_nodes_runs_at_its_members_nics():
    plan = ParallelPlan(dp=1024, tp=2, pp=1, zero_stage=3)
    t = step_time(LLAMA_70B, plan)  # 4 dp members per node, one 400 Gb/s NIC each; ZeRO-3, m = 1
    shard = 70e9 / 2
    want = dp_bytes_per_step(int(shard), 1024, 3, 1) / (4 * IB_NDR_400.bandwidth_bytes_per_s)
    assert t.dp_s == pytest.approx(want, rel=1e-3)


def test_without_async_tp_forward_and_sps_gradient_gathers_are_exposed():
    """Issue 30: backward's input-gradient reduction (all-reduce, or SP's reduce-scatter) hides
    behind the weight-gradient GEMM and SP's re-gathers of the stored input shards behind dgrad;
    forward's collectives are exposed, and so are SP's all-gathers of the output gradient, which
    the row-parallel layers' dgrad needs at once (Megatron-LM's ``_ReduceScatterToSequence
    ParallelRegion.backward``). Per layer in collective-sized units: without SP 4 forward
    (exposed) + 4 backward (hidden); with SP 4 forward + 2 gathers (exposed) + 2 re-gathers + 2
    reduce-scatters (hidden)."""
    plan = ParallelPlan(dp=256, tp=8, pp=1, zero_stage=1)
    t = step_time(LLAMA_70B, plan)
    assert t.tp_exposed_s == pytest.approx(0.6 * t.tp_s)
    assert t.tp_hideable_s == pytest.approx(0.4 * t.tp_s)
    plain = step_time(LLAMA_70B, replace(plan, sequence_parallel=False))
    assert plain.tp_s == pytest.approx(0.8 * t.tp_s)  # the same bytes, less the re-gathers
    assert plain.tp_exposed_s == pytest.approx(plain.tp_s / 2)
    rerun = step_time(LLAMA_70B, replace(plan, recompute="full"))
    # the rerun forward repeats forward's collectives (1.4× the bytes), exposed like them
    assert rerun.tp_s == pytest.approx(1.4 * t.tp_s)
    assert rerun.tp_exposed_s == pytest.approx(1.0 * t.tp_s)
    assert rerun.tp_hideable_s == pytest.approx(0.4 * t.tp_s)
    overlapped = step_time(LLAMA_70B, replace(plan, async_tp=True))
    assert overlapped.tp_exposed_s < t.tp_exposed_s / 10 and overlapped.step_s < t.step_s


def test_dp_sync_hides_only_behind_the_backward_that_follows_it_on_stage_zero():
    """Under a pipeline, device 0's gradient sync can hide only behind its own last backward
    (of one micro-batch, of one chunk): deeper interleaving leaves less to hide behind."""
    req = replace(LLAMA_70B, nics_per_node=1)
    flat = step_time(req, ParallelPlan(dp=64, tp=8, pp=4, zero_stage=1))
    chunked = step_time(req, ParallelPlan(dp=64, tp=8, pp=4, zero_stage=1, virtual_stages=4))
    assert flat.dp_s == pytest.approx(chunked.dp_s)
    assert chunked.dp_exposed_s > flat.dp_exposed_s > 0


def test_on_rails_the_first_70b_plan_that_fits_is_within_3_percent_of_the_fastest():
    """Lab 11's claim ("within about 2 % of the fastest on rails": 2.1 %): the expert's first fit is
    not the model's fastest once GEMMs are priced by waves of tiles (that one trades TP for CP),
    but it is close."""
    first = first_plan_that_fits(LLAMA_70B)
    chosen = step_time(LLAMA_70B, first)
    plan, best = fastest_plans(LLAMA_70B, 1)[0]
    assert plan != first and (plan.tp, plan.cp) == (1, 2)
    assert chosen.step_s <= 1.03 * best.step_s
