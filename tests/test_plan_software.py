"""The job's software as planner policy, sequence parallelism as a plan choice, and TP that
must divide a node (:mod:`dtlab.plan.software`, :mod:`dtlab.plan.layout_cost`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dtlab.memory import activation_bytes_per_layer
from dtlab.mesh.layout_rules import node_problems
from dtlab.mesh.rank_arithmetic import tp_leaves_node_problems
from dtlab.plan import LLAMA_70B, ParallelPlan, candidate_plans, plan_problems
from dtlab.plan.large_jobs import DEEPSEEK_V3
from dtlab.plan.layout_cost import (
    activation_bytes_by_device,
    activation_bytes_per_layer_of,
    held_stage_outputs_by_device,
)
from dtlab.plan.megatron_jobs import GPT3_175B
from dtlab.plan.software import SOFTWARE

JOB_2021 = GPT3_175B  # software "megatron-lm-2021"
PTD_P = ParallelPlan(4, 8, 12, 0, 1, 2, recompute="full", sequence_parallel=False)


def test_the_2021_job_runs_the_2021_software_and_its_layout_passes():
    assert JOB_2021.software == "megatron-lm-2021" and LLAMA_70B.software == "current"
    assert plan_problems(JOB_2021, PTD_P) == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"sequence_parallel": True}, "no sequence parallelism"),
        ({"recompute": "selective"}, "no recompute='selective'"),
        ({"cp": 2, "dp": 2}, "no context parallelism"),
        ({"schedule": "zb-h1", "virtual_stages": 1}, "no the 'zb-h1' schedule"),
        ({"zero_stage": 1}, "no ZeRO-1"),
        ({"zero_stage": 3, "zero3_collectives": "per_parameter"}, "ZeRO-3 with a pipeline"),
        ({"async_tp": True}, "no asynchronous TP"),
        ({"pp": 16, "dp": 3, "virtual_stages": 4}, "no uneven pipeline stages (96 layers over 64"),
        ({"pp": 2, "dp": 24}, "no interleaving on 2 stages"),
    ],
)
def test_a_technique_the_jobs_software_lacks_is_refused_by_name(change, named):
    problems = plan_problems(JOB_2021, replace(PTD_P, **change))
    assert any(named in p and "megatron-lm-2021" in p for p in problems), problems


def test_2021_zero3_is_deepspeeds_per_parameter_one_without_a_pipeline():
    zero3 = ParallelPlan(384, 1, 1, 3, 4, recompute="full")  # SP means nothing at tp 1
    assert plan_problems(JOB_2021, replace(zero3, zero3_collectives="per_parameter")) == []
    (problem,) = plan_problems(JOB_2021, zero3)
    assert "no zero3_collectives='per_layer'" in problem


def test_an_unknown_software_is_refused_with_the_presets():
    (problem,) = plan_problems(replace(LLAMA_70B, software="megatron-1999"), PTD_P)
    assert "software='megatron-1999' is not a preset" in problem
    assert all(name in problem for name in SOFTWARE)


def test_the_search_proposes_only_what_the_2021_software_offers():
    plans = list(candidate_plans(JOB_2021))
    assert len(plans) > 50
    assert {p.recompute for p in plans} == {"full", "none"}
    assert {p.zero_stage for p in plans} == {0, 3} and not any(p.sequence_parallel for p in plans)
    assert {p.zero3_collectives for p in plans if p.zero_stage == 3} == {"per_parameter"}
    assert all(p.pp == 1 for p in plans if p.zero_stage == 3)
    assert all(96 % (p.pp * p.virtual_stages) == 0 for p in plans)  # even stages only
    assert all(p.pp >= 3 for p in plans if p.virtual_stages > 1)
    assert {p.cp for p in plans} == {1} and {p.schedule for p in plans} == {"1f1b"}


def test_the_2022_software_adds_sp_and_selective_recomputation_only():
    """Korthikanti et al.'s Megatron-LM: the distributed optimizer merged after the paper."""
    job = replace(JOB_2021, software="megatron-lm-2022")
    plans = list(candidate_plans(job))
    assert {p.zero_stage for p in plans} == {0}
    assert all(p.sequence_parallel for p in plans) and "selective" in {p.recompute for p in plans}
    assert {p.cp for p in plans} == {1} and {p.schedule for p in plans} == {"1f1b"}


def test_no_plan_with_tp_that_does_not_divide_a_node_is_proposed_or_passes():
    assert not any(8 % p.tp for p in candidate_plans(replace(LLAMA_70B, n_gpus=384)))
    job = replace(LLAMA_70B, n_gpus=24 * 64)
    problems = plan_problems(job, ParallelPlan(512, 3, 1))
    assert any("TP 3 does not divide a node of 8 GPUs" in p for p in problems)
    assert node_problems(4, 8) == [] and node_problems(16, 8) != []


def test_the_mesh_says_a_tp_that_does_not_divide_the_node_straddles_it():
    (problem,) = tp_leaves_node_problems((2, 3), ("dp", "tp"), 4)
    assert "e.g. [3, 4, 5]" in problem and "tp=3 does not divide a node of 4 ranks" in problem
    (problem,) = tp_leaves_node_problems((1, 8), ("dp", "tp"), 4)
    assert "tp=8 is larger than a node" in problem


def test_without_sp_the_gpt_layer_keeps_korthikantis_tp_only_activations():
    s, b, h, a = 2048, 1, 12288, 96
    for recompute in ("none", "selective", "full"):
        plan = replace(PTD_P, recompute=recompute)
        expected = activation_bytes_per_layer(s, b, h, a, 8, False, recompute)
        assert activation_bytes_per_layer_of(JOB_2021, plan) == expected
        with_sp = activation_bytes_per_layer_of(JOB_2021, replace(plan, sequence_parallel=True))
        assert with_sp < expected
    # Korthikanti et al. 2022, Eq. 2: sbh(10 + 24/t + 5as/(ht)) with t = 8
    none = activation_bytes_per_layer_of(JOB_2021, replace(PTD_P, recompute="none"))
    assert none == s * b * h * (10 + 24 / 8 + 5 * a * s / (h * 8))


def test_without_sp_a_shaped_jobs_block_inputs_stay_whole_on_every_tp_rank():
    plan = ParallelPlan(16, 8, 16, 1, recompute="selective")
    d, s = LLAMA_70B.d_model, LLAMA_70B.seq_len
    job = replace(LLAMA_70B, d_ff=28672, gated_mlp=True, n_gpus=2048)
    gap = activation_bytes_per_layer_of(job, replace(plan, sequence_parallel=False))
    gap -= activation_bytes_per_layer_of(job, plan)
    assert gap == pytest.approx(2 * 2 * d * s * (1 - 1 / 8))  # two block inputs, 2 B each


def test_moe_with_tp_needs_sp():
    plan = ParallelPlan(16, 2, 16, 1, ep=8, sequence_parallel=False)
    assert any("needs sequence_parallel=True" in p for p in plan_problems(DEEPSEEK_V3, plan))


def test_the_2021_schedule_holds_each_in_flight_micro_batchs_stage_output():
    m = 384
    held = held_stage_outputs_by_device(JOB_2021, PTD_P, m)
    one = 2 * 2048 * 12288  # 2·s·b·h, whole on every TP rank without SP
    # device 0: 2·(p−1) + (v−1)·p + 1 = 35 chunk-micro-batches in flight, each holding its output
    assert held[0] == 35 * one
    # the last device: (v−1)·p = 12 warmup forwards of its first chunk, then one more in the
    # steady state before each backward — 13 hidden-state outputs (its loss chunk holds none)
    assert held[-1] == 13 * one
    flat = held_stage_outputs_by_device(JOB_2021, replace(PTD_P, virtual_stages=1), m)
    assert flat[0] == 12 * one and flat[-1] == 0
    later = replace(JOB_2021, software="megatron-lm-2022")
    assert [a - b for a, b in zip(
        activation_bytes_by_device(JOB_2021, PTD_P), activation_bytes_by_device(later, PTD_P),
        strict=True,
    )] == pytest.approx(held)  # fmt: skip


def test_without_recomputation_the_2021_175b_layout_overflows_an_80_gb_a100():
    """The bank's case: ~56 GB of activations on stage 0 beside ~38 GB of model state (20 B per
    parameter: 2021's FP16 optimizer kept an FP32 copy of every gradient); SP and selective
    recomputation (2022) keep ~10 GB, plus the scores of the one layer whose backward reruns."""
    from dtlab.cost import gpu
    from dtlab.plan.case_studies import megatron_175b_stage0_activations_gb
    from dtlab.plan.memory_by_category import memory_per_gpu

    plan = replace(PTD_P, recompute="none", virtual_stages=1)
    job = replace(JOB_2021, n_gpus=384)
    assert memory_per_gpu(job, plan).total > gpu(job.gpu).hbm_bytes
    assert megatron_175b_stage0_activations_gb() == pytest.approx(56.2, abs=0.1)
    later = megatron_175b_stage0_activations_gb("selective", True, "megatron-lm-2022")
    rerun_scores = 5 * 96 * 2048 * 2048 / 8  # 5·a·s²·b/t, one layer, while its backward runs
    assert later == pytest.approx((96 * 34 * 2048 * 12288 / 8 + rerun_scores) / 1e9)
    state = memory_per_gpu(job, plan).model_state
    assert state == pytest.approx(20 / 16 * memory_per_gpu(replace(job, software="current"),
                                                           plan).model_state)  # fmt: skip


def test_2021_software_waits_for_backwards_tp_all_reduce_and_the_gradient_sync():
    """Megatron-LM of April 2021: backward's all-reduce synchronous (asynchronous from September
    2021), gradients reduced after the backward (``--DDP-impl local``)."""
    from dtlab.plan.step_time import step_time

    job = replace(JOB_2021, n_gpus=384)
    then, now = step_time(job, PTD_P), step_time(replace(job, software="current"), PTD_P)
    assert then.tp_s == now.tp_s and then.dp_s == now.dp_s  # the same bytes
    assert then.tp_exposed_s > now.tp_exposed_s and then.dp_exposed_s == pytest.approx(then.dp_s)
    assert now.dp_exposed_s < now.dp_s and then.step_s > now.step_s


def test_2021_and_2022_software_wait_on_every_pipeline_exchange():
    """Megatron-LM's ``_communicate`` waited on each ``batch_isend_irecv`` and then synchronized
    the device until its 2023 ``--overlap-p2p-comm``: every exchange is on the critical path, and
    without SP so is the NVLink all-gather after each receive (scatter/gather). Today's
    software hides the steady state and exposes only the fill's and drain's hops."""
    from dtlab.cost import gpu
    from dtlab.plan.exposed import pp_exposed_s
    from dtlab.plan.software import SOFTWARE

    job = replace(JOB_2021, n_gpus=384)
    assert SOFTWARE["megatron-lm-2021"].blocking_p2p and SOFTWARE["megatron-lm-2022"].blocking_p2p
    assert not SOFTWARE["current"].blocking_p2p
    hop = 2048 * 12288 * 2 / 8  # one micro-batch's stage output, one TP rank's slice
    nic, nvlink = 25e9, gpu(job.gpu).nvlink.bandwidth_bytes_per_s  # HDR 200 per GPU; NVLink3
    exchanges = 2 * 384 * 2  # forward and backward, 384 micro-batches, 2 chunks per device
    sends, fill_and_drain = exchanges * hop / nic, 2 * (24 - 1) * hop / nic
    gathers = exchanges * 7 * hop / nvlink
    assert pp_exposed_s(job, PTD_P) == pytest.approx((sends, fill_and_drain))
    every = sends + gathers + fill_and_drain  # all of it on the path: 0.62 s, 0.8 % of the step
    assert pp_exposed_s(job, PTD_P, blocking=True) == pytest.approx((every, every))
    with_sp = pp_exposed_s(job, replace(PTD_P, sequence_parallel=True), blocking=True)
    assert with_sp[1] == pytest.approx(sends + fill_and_drain)  # each slice its own: no gather


def test_2021_megatron_holds_20_bytes_per_parameter_and_deepspeeds_zero3_does_not():
    """``Float16OptimizerWithFloat16Params`` (April 2021) set ``main_param.grad =
    model_param.main_grad.float()`` and its ``zero_grad`` never freed it: FP16 weights and
    gradients, FP32 master weights, FP32 gradients, Adam's two moments — 20 B per parameter,
    which rules out TP 4 × PP 12 for the 175B job (3.6 B parameters a GPU, 75 GB on stage 0). With FP32 gradient accumulation the copy is the gradient
    itself: 18 B."""
    from dtlab.plan.memory_by_category import memory_per_gpu
    from dtlab.plan.problems import plan_problems

    job = replace(JOB_2021, n_gpus=384)
    tp4 = ParallelPlan(8, 4, 12, 0, 1, 2, recompute="full", sequence_parallel=False)
    then = memory_per_gpu(job, tp4)
    assert then.gradients == pytest.approx(3 * then.parameters)  # 2 + 4 B against 2 B
    assert then.model_state > 72e9 and any("memory" in p for p in plan_problems(job, tp4))
    now = memory_per_gpu(replace(job, software="current"), tp4)
    assert now.model_state == pytest.approx(then.model_state * 16 / 20)
    fp32 = memory_per_gpu(job, replace(tp4, fp32_grad_accum=True))
    assert fp32.model_state == pytest.approx(then.model_state * 18 / 20)
    zero3 = ParallelPlan(384, 1, 1, 3, 4, recompute="full", zero3_collectives="per_parameter",
                         sequence_parallel=False)  # fmt: skip
    assert memory_per_gpu(job, zero3).gradients == pytest.approx(
        memory_per_gpu(job, zero3).parameters
    )
