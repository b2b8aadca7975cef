"""The planner beyond (dp, tp, pp): context and expert parallelism, micro-batches and
recomputation, each formula on a hand-computed small case, and the 405B dense and 671B MoE jobs
planned end to end."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from dtlab.cost import gpu
from dtlab.plan import LLAMA_7B, LLAMA_70B, ParallelPlan, Requirements, plan_problems
from dtlab.plan.compute import micro_batch_compute
from dtlab.plan.exposed import remote_copies_per_token
from dtlab.plan.large_jobs import CAPSTONE_JOBS, DEEPSEEK_V3, LLAMA3_405B
from dtlab.plan.layout_cost import (
    activation_bytes_by_device,
    activation_bytes_per_gpu,
    activation_bytes_per_layer_of,
    micro_batches,
    rerun_bytes,
    traffic_per_gpu,
)
from dtlab.plan.memory_by_category import memory_per_gpu
from dtlab.plan.problems import shape_problems
from dtlab.plan.search import candidate_plans, first_plan_that_fits
from dtlab.plan.step_time import dp_bus_bandwidth_of, fastest_plans, step_time
from dtlab.plan.worked import format_worked, worked_jobs

# A small MoE, sizes chosen so every number below is worked by hand: 4 layers, all MoE, d = 512,
# 8 heads with 2 K/V heads (kv_width 128), 8 experts top-2; 10 B params of which 8 B experts.
TOY_MOE = Requirements(
    "toy MoE", 10e9, 4, 512, 8, 1024, 1e9, 16 * 1024, 16, n_kv_heads=2,
    n_experts=8, top_k=2, expert_params=8e9, moe_layers=4,
)  # fmt: skip
PEAK = gpu("h100_sxm").bf16_dense_flops


def test_existing_positional_plans_keep_their_meaning_with_the_new_fields_defaulted():
    plan = ParallelPlan(64, 8, 4, 1, 1, 2)
    assert (plan.cp, plan.ep, plan.recompute) == (1, 1, "selective")
    assert plan.world_size == 2048 and ParallelPlan(64, 8, 4, cp=2).world_size == 4096


def test_active_parameters_are_the_dense_ones_plus_top_k_of_n_experts():
    assert TOY_MOE.dense_params == 2e9 and TOY_MOE.active_params == 2e9 + 8e9 * 2 / 8
    assert LLAMA_70B.active_params == LLAMA_70B.params
    assert DEEPSEEK_V3.active_params == pytest.approx(37e9, rel=0.03)  # the paper's 37B
    assert LLAMA3_405B.kv_width == 8 * 128 and LLAMA3_405B.global_batch_sequences == 2048


def test_moe_state_shards_dense_params_over_dp_cp_and_experts_over_ep_then_dp_over_ep():
    plan = ParallelPlan(4, 1, 1, 1, ep=2, cp=2)  # ZeRO-1 over dp·cp = 8, experts over 8/2 = 4
    m = memory_per_gpu(TOY_MOE, plan)
    dense, experts = 2e9, 8e9 / 2
    assert m.parameters == 2 * dense + 2 * experts
    assert m.gradients == 2 * dense + 2 * experts
    assert m.optimizer == 12 * dense / 8 + 12 * experts / 4
    zero3 = memory_per_gpu(TOY_MOE, ParallelPlan(4, 1, 1, 3, ep=2, cp=2))
    assert zero3.zero3_gathered == 2 * 2 * (2e9 / 4 + 8e9 / 4 / 2)  # two layers, bf16, ep-split


def test_a_dense_plan_costs_what_it_cost_before_cp_ep_and_recompute_existed():
    plan = ParallelPlan(64, 8, 4, 1)
    m = memory_per_gpu(LLAMA_70B, plan)
    shard = 70e9 / 32
    assert m.model_state == pytest.approx(shard * (2 + 2 + 12 / 64))
    assert m.activations == 80 * 34 * 4096 * 8192 // 8 and m.zero3_gathered == 0


def test_context_parallelism_divides_and_full_recompute_shrinks_the_activations():
    base = ParallelPlan(16, 8, 1, 1)
    assert activation_bytes_per_gpu(LLAMA_7B, ParallelPlan(8, 8, 1, 1, cp=2)) == (
        activation_bytes_per_gpu(LLAMA_7B, base) / 2
    )
    full = ParallelPlan(16, 8, 1, 1, recompute="full")
    none = ParallelPlan(16, 8, 1, 1, recompute="none")
    sbh = 4096 * 4096
    scores = 5 * 32 * 4096 * sbh // 4096 // 8  # the 5·a·s²·b/t term selective recomputation drops
    kept = 34 * sbh // 8  # what a layer keeps with TP 8 + SP, scores aside (flash stores none)
    assert activation_bytes_per_gpu(LLAMA_7B, base) == 32 * kept  # selective: nothing to rerun
    assert activation_bytes_per_gpu(LLAMA_7B, none) == 32 * kept  # flash keeps no scores either
    eager = replace(LLAMA_7B, flash_attention=False)  # without flash the scores are kept
    assert activation_bytes_per_gpu(eager, none) == 32 * (kept + scores)
    assert activation_bytes_per_gpu(eager, base) == 32 * kept + scores  # and rerun, one layer
    # 32 kept inputs, plus the one layer whose backward reruns it, whole, while that backward runs
    assert activation_bytes_per_gpu(LLAMA_7B, full) == 32 * 2 * sbh // 8 + kept - 2 * sbh // 8


def test_a_trimmed_first_stage_moves_the_activation_peak_to_stage_one():
    plan = ParallelPlan(128, 8, 16, 1)  # Llama 3's TP 8 × PP 16: stage 0 runs 7 layers, 1 runs 8
    per_layer = activation_bytes_per_layer_of(LLAMA3_405B, plan)
    rerun = rerun_bytes(LLAMA3_405B, plan) - per_layer  # the norms selective drops, one layer
    by_device = activation_bytes_by_device(LLAMA3_405B, plan)
    assert 0 < rerun < per_layer
    assert by_device[0] == pytest.approx(16 * 7 * per_layer + rerun)  # 16 micro-batches in flight
    assert by_device[1] == pytest.approx(15 * 8 * per_layer + rerun)  # 15, but a full stage
    assert activation_bytes_per_gpu(LLAMA3_405B, plan) == max(by_device) == by_device[1]
    assert shape_problems(LLAMA3_405B, plan) == []  # 126 + 2 slots split over 16 stages
    untrimmed = replace(LLAMA3_405B, pipeline_end_trim=0)  # 126 over 16: uneven, still cut
    assert shape_problems(untrimmed, plan) == []
    too_deep = ParallelPlan(1, 8, 128, 1, virtual_stages=2)
    assert any("would hold no layer" in p for p in shape_problems(LLAMA3_405B, too_deep))


def test_ring_attention_sends_kv_blocks_three_times_and_four_with_full_recompute():
    plan = ParallelPlan(4, 1, 1, 1, cp=4)  # s/c = 256 tokens, kv_width 128, b = 1
    forward = (4 - 1) * 2 * 1 * 256 * 128 * 2
    m = micro_batches(TOY_MOE, plan)
    assert traffic_per_gpu(TOY_MOE, plan).cp == m * 4 * 3 * forward
    full = ParallelPlan(4, 1, 1, 1, cp=4, recompute="full")
    assert traffic_per_gpu(TOY_MOE, full).cp == m * 4 * 4 * forward
    assert traffic_per_gpu(TOY_MOE, ParallelPlan(16, 1, 1, 1)).cp == 0


def test_expert_all_to_alls_send_top_k_tokens_rows_times_ep_minus_1_over_ep():
    plan = ParallelPlan(16, 1, 1, 1, ep=4)  # 1,024 tokens routed per rank and micro-batch
    per_all_to_all = 2 * 1024 * 512 * 2 * 3 / 4
    assert traffic_per_gpu(TOY_MOE, plan).ep == 1 * 4 * 4 * per_all_to_all  # m=1, 4 MoE layers
    tp2 = ParallelPlan(8, 2, 1, 1, ep=4)  # sequence parallel: each TP rank routes half
    assert traffic_per_gpu(TOY_MOE, tp2).ep == 2 * 4 * 4 * per_all_to_all / 2  # m = 2
    assert traffic_per_gpu(TOY_MOE, ParallelPlan(16, 1, 1, 1)).ep == 0


def test_moe_gradients_reduce_dense_over_dp_and_experts_over_the_expert_data_parallel_group():
    plan = ParallelPlan(16, 1, 1, 1, ep=4)
    want = 2 * (15 / 16) * 2e9 * 2 + 2 * (3 / 4) * (8e9 / 4) * 2
    assert traffic_per_gpu(TOY_MOE, plan).dp == pytest.approx(want, rel=1e-9)


def test_step_compute_counts_active_params_and_recompute_is_extra_work_mfu_ignores():
    plan = ParallelPlan(16, 1, 1, 1, ep=4, recompute="full")
    tokens = TOY_MOE.global_batch_tokens / 16
    t = step_time(TOY_MOE, plan)
    c = micro_batch_compute(TOY_MOE, plan, 0)
    m = micro_batches(TOY_MOE, plan)
    assert t.recompute_s == pytest.approx(m * c.forward_s)  # one more forward, all of it
    assert t.compute_s == pytest.approx(m * (c.total_s - c.forward_s))
    assert t.mfu == pytest.approx(6 * 4e9 * tokens / (PEAK * t.step_s))  # 4B active, not 10B
    none = step_time(TOY_MOE, replace(plan, recompute="none"))
    assert none.recompute_s == 0 and none.mfu > t.mfu


def test_expert_all_to_alls_ride_nvlink_inside_a_node_and_node_limited_copies_across():
    inside = ParallelPlan(16, 1, 1, 1, ep=8)
    across = ParallelPlan(16, 1, 1, 1, ep=16)  # two nodes
    t_in, t_out = step_time(TOY_MOE, inside), step_time(TOY_MOE, across)
    assert t_in.ep_s == pytest.approx(traffic_per_gpu(TOY_MOE, inside).ep / 450e9)
    copies = remote_copies_per_token(2, 8, 2, None)  # top-2 of 8 experts over 2 nodes
    assert copies == pytest.approx(0.5 * (1 * 12 / 28 + 2 * 16 / 28))  # E[distinct nodes] · 1/2
    tokens, d = 1024, 512  # per micro-batch (m = 1), 4 MoE layers, forward and backward
    network = 2 * 4 * tokens * d * copies * (2 + 2) / 50e9
    nvlink = 2 * 4 * tokens * d * 2 * (2 + 2) * 15 / 16 / 450e9
    assert t_out.ep_s == pytest.approx(network + nvlink)
    assert t_out.ep_exposed_s == t_out.ep_s  # 1F1B: the all-to-alls stand in the critical path


def test_a_ring_or_a_gradient_group_that_leaves_the_node_runs_at_the_nics():
    in_node, across = ParallelPlan(4, 2, 1, 1, cp=2), ParallelPlan(1, 4, 1, 1, cp=4)  # 4, 16 ranks
    assert step_time(TOY_MOE, in_node).cp_s == pytest.approx(
        traffic_per_gpu(TOY_MOE, in_node).cp / 450e9
    )
    assert step_time(TOY_MOE, across).cp_s == pytest.approx(
        traffic_per_gpu(TOY_MOE, across).cp / 50e9
    )
    # gradients reduce over dp·cp = 16 ranks striding tp = 1: two nodes, 8 NICs per group
    assert dp_bus_bandwidth_of(TOY_MOE, ParallelPlan(4, 1, 1, 1, cp=4)) == 400e9


def test_the_ring_is_exposed_only_beyond_the_attention_compute_it_hides_behind():
    for req, plan in (
        (TOY_MOE, ParallelPlan(4, 1, 1, 1, cp=4)),
        (LLAMA_7B, ParallelPlan(32, 1, 1, 1, cp=2)),
    ):
        t = step_time(req, plan)
        m = micro_batches(req, plan)
        attention_s = 3 * micro_batch_compute(req, plan, 0).attention_forward_s * m
        assert t.cp_s > 0 and t.cp_exposed_s == pytest.approx(max(0.0, t.cp_s - attention_s))


def test_all_gather_cp_is_exposed_whole():
    plan = ParallelPlan(4, 1, 1, 1, cp=4, cp_kind="allgather")
    t = step_time(TOY_MOE, plan)
    assert t.cp_s > 0 and t.cp_exposed_s == pytest.approx(t.cp_s)


def test_each_new_problem_says_what_to_change():
    odd_sequence = replace(LLAMA_7B, seq_len=4000)  # 524 sequences: 262 micro-batches on dp 2
    (cp,) = plan_problems(odd_sequence, ParallelPlan(2, 1, 1, cp=32))
    assert "cannot split the 4000-token sequence into 2·cp = 64" in cp
    assert "choose cp from [1, 2, 4, 5, 8, 10, 16, 20, 25, 40, 50]" in cp
    assert any(
        "needs a mixture of experts" in p
        for p in plan_problems(LLAMA_7B, ParallelPlan(64, 1, 1, ep=2))
    )
    assert any(
        "does not divide n_experts=8" in p
        for p in plan_problems(TOY_MOE, ParallelPlan(48, 1, 1, ep=3))
    )
    assert any(
        "does not divide dp=16" in p for p in plan_problems(TOY_MOE, ParallelPlan(16, 1, 1, ep=32))
    )
    (bad,) = plan_problems(LLAMA_7B, ParallelPlan(64, 1, 1, recompute="some"))
    assert "recompute='some' is not a choice" in bad
    (memory,) = plan_problems(LLAMA_7B, ParallelPlan(64, 1, 1, 0))
    for category in ("params", "grads", "optimizer", "activations", "cut activations (cp"):
        assert category in memory


def test_405b_needs_tp_8_and_sharding_or_a_pipeline_to_fit():
    plan = first_plan_that_fits(LLAMA3_405B)
    assert plan.tp == 8 and plan_problems(LLAMA3_405B, plan) == []
    assert plan.zero_stage == 3 or plan.pp > 1
    classic = [p for p in candidate_plans(LLAMA3_405B) if (p.cp, p.recompute) == (1, "selective")]
    shaped = [p for p in classic if not shape_problems(LLAMA3_405B, p)]
    assert all(plan_problems(LLAMA3_405B, p) for p in shaped if p.tp < 8 and p.pp < 4)
    assert any("GB per GPU" in plan_problems(LLAMA3_405B, p)[0] for p in shaped if p.tp == 8)


def test_the_moe_job_needs_expert_parallelism_and_its_fastest_plan_uses_it():
    plan = first_plan_that_fits(DEEPSEEK_V3)
    assert plan.ep > 1 and plan_problems(DEEPSEEK_V3, plan) == []
    # without EP, ZeRO-3 must gather a layer's 256 experts to run it
    gathered = memory_per_gpu(DEEPSEEK_V3, replace(plan, ep=1, zero_stage=3)).zero3_gathered
    assert gathered > 20e9
    (best, t), *_ = fastest_plans(DEEPSEEK_V3, 1)
    assert best.ep > 1 and t.ep_s > 0


def test_the_search_stays_small_at_16384_gpus():
    plans = list(candidate_plans(LLAMA3_405B))
    assert len(plans) < 10_000 and len(set(plans)) == len(plans)
    assert all(p.tp <= 8 and p.world_size == LLAMA3_405B.n_gpus for p in plans if p.cp > 1)


def test_the_worked_jobs_are_planned_end_to_end():
    rows = worked_jobs()
    assert [r.job for r in rows] == [j for j in CAPSTONE_JOBS for _ in range(2)]
    for first, fastest in zip(rows[::2], rows[1::2], strict=True):
        assert (
            plan_problems(first.job, first.plan) == [] == plan_problems(fastest.job, fastest.plan)
        )
        assert fastest.time.step_s <= first.time.step_s
        assert math.isclose(first.memory.total, memory_per_gpu(first.job, first.plan).total)
    assert "MFU" in format_worked(rows[-1]) and "experts" not in format_worked(rows[0])


def test_zero_2_and_3_pay_per_micro_batch_and_zero_1_once_per_step():
    from dtlab.memory import zero_comm_bytes_per_rank
    from dtlab.plan.layout_cost import dp_bytes_per_step

    psi, n, e = 1_000, 4, 2
    one = (n - 1) * (psi // n) * e  # one reduce-scatter or all-gather of the shard
    for stage in (0, 1, 2, 3):  # one micro-batch: the classic per-step volumes
        assert dp_bytes_per_step(psi, n, stage, 1, e) == zero_comm_bytes_per_rank(psi, n, stage, e)
    assert dp_bytes_per_step(psi, n, 1, 8, e) == 2 * one  # accumulated locally, reduced once
    assert dp_bytes_per_step(psi, n, 2, 8, e) == (8 + 1) * one  # RS per micro-batch, AG once
    assert dp_bytes_per_step(psi, n, 3, 8, e) == 3 * 8 * one  # AG, AG, RS per micro-batch
