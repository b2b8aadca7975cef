"""One input at a time, every effect of the step-time model points the way it should.

Issue 29 asks for a model that is principled rather than fitted: change one thing about a job
or a plan and the step moves in the direction the mechanism says, by the part of the step that
mechanism owns.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from dtlab.plan import LLAMA_70B, ParallelPlan
from dtlab.plan.compute import gemm_efficiency
from dtlab.plan.large_jobs import DEEPSEEK_V3, LLAMA3_405B
from dtlab.plan.layout_cost import activation_bytes_per_gpu, pipeline_bubble
from dtlab.plan.step_time import step_time

BASE = ParallelPlan(dp=32, tp=4, pp=8, zero_stage=1, virtual_stages=2)
JOB = replace(LLAMA_70B, nics_per_node=2)


def test_more_tp_means_more_tp_bytes_exposed():
    small = step_time(JOB, ParallelPlan(dp=64, tp=2, pp=16, zero_stage=1))
    large = step_time(JOB, ParallelPlan(dp=16, tp=8, pp=16, zero_stage=1))
    assert large.tp_exposed_s > small.tp_exposed_s


def test_more_micro_batches_mean_a_smaller_bubble():
    few = replace(JOB, global_batch_tokens=JOB.global_batch_tokens // 4)
    assert pipeline_bubble(JOB, BASE) < pipeline_bubble(few, BASE)


def test_deeper_interleaving_means_a_smaller_bubble():
    deeper = replace(BASE, virtual_stages=5)
    assert pipeline_bubble(JOB, deeper) < pipeline_bubble(JOB, BASE)


def test_interleaving_holds_more_activations_than_plain_1f1b():
    """Device 0 holds ``L·(1 + (p−1)/(p·v))`` layers' worth interleaved (Korthikanti et al.
    2022, Sec. 4.2.3): more than 1F1B's ``L``, less as ``v`` grows."""
    flat = replace(BASE, virtual_stages=1)
    deeper = replace(BASE, virtual_stages=5)
    assert activation_bytes_per_gpu(JOB, flat) < activation_bytes_per_gpu(JOB, deeper)
    assert activation_bytes_per_gpu(JOB, deeper) < activation_bytes_per_gpu(JOB, BASE)


def test_zero_bubble_and_dualpipe_schedules_idle_less_than_1f1b():
    flat = replace(BASE, virtual_stages=1)
    one_f_one_b = pipeline_bubble(JOB, flat)
    assert pipeline_bubble(JOB, replace(flat, schedule="zb-h1")) < one_f_one_b
    assert pipeline_bubble(JOB, replace(flat, schedule="dualpipev")) < one_f_one_b


def test_a_longer_context_means_more_attention_flops_and_time():
    longer = replace(JOB, seq_len=2 * JOB.seq_len)
    short, long_ = step_time(JOB, BASE), step_time(longer, BASE)
    assert long_.attention_s > short.attention_s
    assert long_.mfu_attention - long_.mfu > short.mfu_attention - short.mfu


def test_a_slower_nic_means_slower_data_parallel_sync():
    slow = replace(JOB, nic_bytes_per_s=JOB.nic_bytes_per_s / 4)
    assert step_time(slow, BASE).dp_s == pytest.approx(4 * step_time(JOB, BASE).dp_s)
    assert step_time(slow, BASE).step_s > step_time(JOB, BASE).step_s


def test_fewer_nics_per_node_mean_slower_pipeline_sends():
    assert step_time(JOB, BASE).pp_s < step_time(replace(JOB, nics_per_node=1), BASE).pp_s


def test_full_recomputation_costs_a_forward_and_saves_activations():
    full = replace(BASE, recompute="full")
    assert step_time(JOB, full).recompute_s > step_time(JOB, BASE).recompute_s
    assert activation_bytes_per_gpu(JOB, full) < activation_bytes_per_gpu(JOB, BASE)


def test_smaller_gemms_run_at_a_smaller_share_of_peak():
    assert gemm_efficiency("h100_sxm", 512, 8192, 8192) < gemm_efficiency(
        "h100_sxm", 8192, 8192, 8192
    )
    mbs2 = step_time(JOB, replace(BASE, micro_batch_size=2))
    assert mbs2.gemm_efficiency > step_time(JOB, BASE).gemm_efficiency


def test_zero3_pays_its_gathers_every_micro_batch():
    zero1 = step_time(JOB, replace(BASE, zero_stage=1))
    zero3 = step_time(JOB, replace(BASE, zero_stage=3))
    assert zero3.dp_s > 10 * zero1.dp_s


def test_async_tp_hides_forward_collectives():
    assert step_time(JOB, replace(BASE, async_tp=True)).tp_exposed_s < (
        step_time(JOB, BASE).tp_exposed_s
    )


def test_dualpipe_hides_the_moe_all_to_alls_that_1f1b_exposes():
    plan = ParallelPlan(dp=128, tp=1, pp=16, zero_stage=1, ep=64)
    plain = step_time(DEEPSEEK_V3, plan)
    dual = step_time(DEEPSEEK_V3, replace(plan, schedule="dualpipe"))
    assert plain.ep_exposed_s == pytest.approx(plain.ep_s) and dual.ep_exposed_s < plain.ep_s / 10


def test_a_node_limit_cuts_the_expert_traffic():
    plan = ParallelPlan(dp=128, tp=1, pp=16, zero_stage=1, ep=64)
    unlimited = replace(DEEPSEEK_V3, node_limit=0)
    assert step_time(DEEPSEEK_V3, plan).ep_s < step_time(unlimited, plan).ep_s


def test_all_gather_cp_is_exposed_where_ring_cp_hides():
    plan = ParallelPlan(dp=8, tp=8, pp=16, zero_stage=1, cp=16)
    ring = step_time(replace(LLAMA3_405B, seq_len=131072), plan)
    gather = step_time(replace(LLAMA3_405B, seq_len=131072), replace(plan, cp_kind="allgather"))
    assert ring.cp_exposed_s < gather.cp_exposed_s == pytest.approx(gather.cp_s)


def test_fp32_gradients_double_the_gradient_bytes():
    fp32 = step_time(JOB, replace(BASE, fp32_grad_accum=True))
    base = step_time(JOB, BASE)
    assert base.dp_s < fp32.dp_s < 2 * base.dp_s  # the reduce-scatter doubles, the gather not


def test_software_that_waits_on_each_pipeline_exchange_exposes_more_of_it():
    """Same bytes; Megatron-LM before 2023 waited on every exchange, so more of them shows —
    and each added chunk adds more exposed time when every exchange waits than when only the
    fill and drain do."""
    job = replace(JOB, software="megatron-lm-2022")
    today = replace(job, software="current")
    plan = replace(BASE, zero_stage=0, virtual_stages=1)
    deeper = replace(plan, virtual_stages=2)
    waited, overlapped = step_time(job, plan), step_time(today, plan)
    assert waited.pp_exposed_s > overlapped.pp_s > overlapped.pp_exposed_s  # the sends, and more
    more_waited = step_time(job, deeper).pp_exposed_s - waited.pp_exposed_s
    more_overlapped = step_time(today, deeper).pp_exposed_s - overlapped.pp_exposed_s
    assert more_waited > more_overlapped > 0


def test_recomputation_holds_the_rerun_layers_working_set_beside_the_kept_inputs():
    """A full rerun needs one layer's whole activations during its backward: more than the kept
    inputs alone, less than keeping every layer."""
    from dtlab.plan.layout_cost import activation_bytes_per_layer_of

    full = replace(BASE, recompute="full", pp=1, virtual_stages=1)
    inputs_only = JOB.n_layers * activation_bytes_per_layer_of(JOB, full)  # one micro-batch
    held = activation_bytes_per_gpu(JOB, full)
    assert inputs_only < held < activation_bytes_per_gpu(JOB, replace(full, recompute="none"))


def _fig13_steps(batch: int) -> dict[int, float]:
    from dtlab.plan.megatron_jobs import fig13_gpt_162b

    job = fig13_gpt_162b(batch)
    return {
        t: step_time(
            job, ParallelPlan(1, t, 64 // t, 0, 1, recompute="full", sequence_parallel=False)
        ).step_s
        for t in (2, 4, 8, 16, 32)
    }


@pytest.mark.parametrize("batch", [32, 128])
def test_tensor_parallelism_peaks_at_one_server(batch):
    """Narayanan et al. 2021, Fig. 13: on 64 A100s the 162B GPT ran fastest at ``t = 8`` of
    ``(t, p)`` = (2, 32) … (32, 2), at batch 32 and at 128 — a smaller ``t`` pays a deeper
    pipeline's bubble, a larger one runs its all-reduces between nodes (TP 16 and 32 are timed
    though :func:`~dtlab.plan.problems.plan_problems` refuses them). At batch 32 the margin over
    TP 16 is 2 %: its all-reduces cross two nodes' NICs (200 GB/s on Selene against NVLink's
    300), and each of its 16 ranks runs the LayerNorms and dropouts whole (no SP in 2021)."""
    steps = _fig13_steps(batch)
    assert min(steps, key=steps.get) == 8, steps


@pytest.mark.parametrize("batch", [32, 128, 512])
def test_trading_data_parallelism_for_pipeline_or_tensor_parallelism_slows_the_step(batch):
    """Narayanan et al. 2021, Figs. 14 and 15: for the 5.9B GPT on 64 A100s, throughput fell as
    the pipeline (``(p, d)`` = (2, 32) … (32, 2)) or the tensor-parallel group (``(t, d)``, the
    same degrees) grew in place of data parallelism, at every batch — a deeper pipeline idles
    more, a wider TP group all-reduces every layer (between nodes past 8)."""
    from dtlab.plan.megatron_jobs import fig14_gpt_5_9b

    job = fig14_gpt_5_9b(batch)

    def step(dp, tp, pp):
        plan = ParallelPlan(dp, tp, pp, 0, 1, recompute="full", sequence_parallel=False)
        return step_time(job, plan).step_s

    degrees = (2, 4, 8, 16, 32)
    by_pp = [step(64 // p, 1, p) for p in degrees]
    by_tp = [step(64 // t, t, 1) for t in degrees]
    assert by_pp == sorted(by_pp) and len(set(by_pp)) == len(by_pp), by_pp
    assert by_tp == sorted(by_tp) and len(set(by_tp)) == len(by_tp), by_tp


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_without_sp_each_tp_rank_runs_the_norms_and_dropouts_whole(tp):
    """Without sequence parallelism every TP rank runs the two LayerNorms and the two
    bias-dropout-adds on the whole sequence: ``(t − 1)/t`` of that work is redundant, priced from
    its bytes (22 per token and unit of width forward, 34 backward; 42 with 2021's two-pass
    LayerNorm backward) at HBM bandwidth; SP shards it. A wider TP group wastes more of each
    layer."""
    from dtlab.cost import gpu
    from dtlab.plan.compute import layer_compute
    from dtlab.plan.megatron_jobs import GPT3_175B

    plan = ParallelPlan(1, tp, 1, 0, 1, recompute="none", sequence_parallel=True)
    per_byte = (tp - 1) / tp * 2048 * 12288 / gpu("a100_80gb").hbm_bandwidth_bytes_per_s
    job_2022 = replace(GPT3_175B, software="megatron-lm-2022")
    sp = layer_compute(job_2022, plan)
    for job, backward in ((job_2022, 34), (GPT3_175B, 42)):  # GPT3_175B: 2021's software
        whole = layer_compute(job, replace(plan, sequence_parallel=False))
        assert whole.forward_s - sp.forward_s == pytest.approx(22 * per_byte)
        assert whole.input_grad_s - sp.input_grad_s == pytest.approx(backward * per_byte)
        assert whole.weight_grad_s == pytest.approx(sp.weight_grad_s)
