"""Published large runs, as jobs and layouts the planner prices: the model held against reality.

Each :class:`~dtlab.plan.published_run.PublishedRun` is one row of a paper: the job (model
shapes, batch, hardware, and the paper's own **policy** — how much HBM it planned into and how
large a bubble it accepted), the layout it ran, and the throughput it reported. Published step
time is derived from the reported throughput under the paper's own FLOP convention, or is the
measured iteration time where a paper gives one (Korthikanti et al. 2022):

* **Llama 3 405B** (Dubey et al. 2024, "The Llama 3 Herd of Models", Sec. 3.3, Table 4; 126
  layers, d 16,384, FFN 53,248 SwiGLU, 128 heads / 8 K/V heads, vocabulary 128,256; H100 with
  a 400 Gb/s NIC per GPU): TP 8, CP 1, PP 16, DP 64 / 128 at 8K context, and TP 8, CP 16, PP 16,
  DP 8 at 131K, 16M tokens per step, 430 / 400 / 380 TFLOP/s per GPU (43 / 41 / 38 % BF16 MFU).
  The paper does not state its FLOP convention; 380 TFLOP/s at 131K only makes sense with
  attention counted, so this module reads it as ``6N + 6·L·s·d`` (causal attention,
  :func:`dtlab.plan.compute.attention_flops_per_token`). The layout: interleaved 1F1B (the
  paper's Sec. 3.3.2; depth 8, one layer slot per chunk, is this module's reading), the first
  and last stage one layer short, no activation checkpointing at 8K (recompute "none"; flash
  attention keeps no scores), all-gather CP, FSDP that does not reshard after forward with
  FP32 gradient accumulation and reduce-scatter (Sec. 3.3.2 and 3.3.4). Policy: all 80 GB
  (the paper tunes memory to the limit), bubble cap 15 %, FP32 gradients and all-gather CP as
  requirements every candidate plan carries too.
* **Megatron-LM 2021** (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
  GPU Clusters Using Megatron-LM", Tables 1 and 2; Selene, DGX A100 80 GB, eight 200 Gb/s HDR
  NICs per node): GPT-3 175B (96 layers, h 12,288, 96 heads, s 2,048, vocabulary 51,200, batch
  1,536) with PTD-P (t 8, p 12) on 384 / 768 / 1,536 GPUs at 153 / 149 / 141 TFLOP/s, and ZeRO-3
  without model parallelism at 144 / 88 / 44; the 1T model (128 layers, h 25,600, 160 heads,
  t 8, p 64, 3,072 GPUs, batch 3,072) at 163 TFLOP/s. Its FLOPs are the paper's own
  ``96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))`` — full recomputation and the full attention
  square counted — so the 6N MFU is about three quarters of its "% of peak". Layout: full
  recomputation, micro-batch 1 (the 175B example script merged in January 2021,
  ``examples/pretrain_gpt3_175B.sh``: ``--micro-batch-size 1``, ``--checkpoint-activations``),
  DDP (ZeRO-0) and, for PTD-P, the interleaved schedule (Sec. 2.2.2) with two chunks per device
  for 175B and none for 1T (depths are this module's reading: with two the 1T stage 0 would
  hold 191 stage outputs of 105 MB each — 2021's schedule kept them until their backward — and
  need 84 GB, over the 77.3 GB policy); ZeRO-3 with resharding for the
  ZeRO-3 rows (micro-batch = the whole per-GPU batch, one micro-batch: the paper's batch over
  GPUs). Policy: 90 % of HBM, and no bubble cap (the paper reports throughput whatever the
  bubble).

  **The ZeRO-3 rows ran DeepSpeed's stage 3 of 2021**, one list collective per parameter
  tensor behind a device-wide synchronize, with host work linear in N: their plans carry
  ``zero3_collectives="per_parameter"`` (:mod:`dtlab.plan.zero3_per_parameter`). Priced as a
  modern per-layer ZeRO-3 they would be 1.3–4.1× faster than measured
  (:mod:`dtlab.plan.zero3_gap`). They are the baseline the paper's PTD-P beat, not a layout it
  chose (``PublishedRun.baseline``), so the rank goal (the fastest quarter) is not theirs.

  The 2021 jobs run Megatron-LM's software of 2021 (``software="megatron-lm-2021"``,
  :mod:`dtlab.plan.software`), and their layouts are priced as they ran: no sequence
  parallelism, every in-flight stage output held until its backward.
* **Korthikanti et al. 2022** (:mod:`dtlab.plan.published_selective`): the same GPTs on the same
  Selene A100s with sequence parallelism and selective recomputation, and with full
  recomputation — seven measured iteration times. They pin the recomputation tax and the
  A100 MFU ceiling (55–56 % on 6N) the planner's winner for the 2021 1T job claims when given
  2022's software (:func:`best_published_mfu_6n`); their Table 4's one measured layer, with and
  without SP and recomputation, checks the layer itself (:mod:`dtlab.plan.published_layer_times`).
* **DeepSeek-V3** (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", Sec. 3–4): 671B (37B
  active), 61 layers, d 7,168, 128 heads (MLA priced as attention of width 20,480: 128 heads
  of 192 for ``Q·Kᵀ`` and 128 for ``A·V``, averaged), 3 dense layers (FFN 18,432) and 58 MoE
  layers of 1 shared + 256 routed experts (width 2,048, top 8, at most 4 nodes per token);
  4K context, batch 15,360; 2,048 H800 (NVLink 400 GB/s bidirectional, 50 GB/s IB per GPU);
  PP 16 with DualPipe, EP 64 over 8 nodes, ZeRO-1 DP, no TP, FP8 GEMMs and FP8 dispatch.
  Published throughput: 180K H800 GPU-hours per trillion tokens (Sec. 1) → 1,543 tokens/s per
  GPU; MFU is derived, not stated. Also from the report: 20 of 132 SMs run communication
  (Sec. 3.2.2), one multi-token-prediction block (Sec. 2.2), selective recomputation of norms
  and MLA up-projections with the MLA latents (1,536 + 576 per token) kept instead of Q, K, V
  (Sec. 3.2.3), FP8 caching of the experts' inputs (Sec. 3.3.3). Micro-batch 1 is this module's
  assumption. Policy: all 80 GB, bubble cap 15 %.
"""

from __future__ import annotations

from dataclasses import replace

from dtlab.plan.job import Requirements
from dtlab.plan.large_jobs import DEEPSEEK_V3, LLAMA3_405B
from dtlab.plan.megatron_jobs import GPT3_175B, GPT_1T
from dtlab.plan.parallel_plan import ParallelPlan
from dtlab.plan.published_run import (
    PlannerVsPublished,
    PublishedRun,
    causal_flops_per_step,
    compare,
    megatron_flops_per_step,
)
from dtlab.plan.published_selective import SELECTIVE_RUNS
from dtlab.plan.zero3_gap import implied_zero3_bandwidth, zero3_bytes_per_gpu

LLAMA3_SOURCE = "Dubey et al. 2024, The Llama 3 Herd of Models, Sec. 3.3, Table 4"
MEGATRON_SOURCE = "Narayanan et al. 2021, Megatron-LM on GPU clusters, Table"
DEEPSEEK_SOURCE = "DeepSeek-AI 2024, DeepSeek-V3 Technical Report, Sec. 1 and 3.2"


LLAMA3_405B_8K = replace(
    LLAMA3_405B,
    name="Llama 3 405B, 8K, 16,384 H100",
    usable_memory_fraction=1.0,
    fp32_grads=True,
    cp_kind="allgather",
)
LLAMA3_PLAN = ParallelPlan(
    dp=128,
    tp=8,
    pp=16,
    zero_stage=3,
    virtual_stages=8,
    recompute="none",
    reshard_after_forward=False,
    fp32_grad_accum=True,
)


def _llama3(gpus: int, seq: int, cp: int, tflops: float) -> PublishedRun:
    job = replace(
        LLAMA3_405B_8K,
        name=f"Llama 3 405B, {seq // 1024}K, {gpus:,} H100",
        n_gpus=gpus,
        seq_len=seq,
    )
    dp = gpus // (8 * 16 * cp)
    plan = replace(LLAMA3_PLAN, dp=dp, cp=cp, cp_kind="allgather" if cp > 1 else "ring")
    return PublishedRun(job.name, LLAMA3_SOURCE, job, plan, tflops, causal_flops_per_step(job))


def _megatron(
    job: Requirements,
    gpus: int,
    tp: int,
    pp: int,
    zero: int,
    tflops: float,
    table: int,
    chunks: int = 1,
):
    """One row of Narayanan et al.'s Tables 1–2 as it ran: ``chunks`` model chunks per pipeline
    device (the interleaving depth this module reads, module docstring), full recomputation,
    no sequence parallelism; its ZeRO-3 rows DeepSpeed's per-parameter stage 3."""
    job = replace(job, n_gpus=gpus, name=f"{job.name.split(' (')[0]}, {gpus:,} A100")
    dp = gpus // (tp * pp)
    mbs = 1 if zero < 3 else job.global_batch_sequences // dp
    plan = ParallelPlan(dp, tp, pp, zero, mbs, chunks, recompute="full", sequence_parallel=False)
    if zero == 3:  # DeepSpeed's stage 3 of 2021 (dtlab.plan.zero3_per_parameter)
        plan = replace(plan, zero3_collectives="per_parameter")
    label = "PTD-P" if zero < 3 else "ZeRO-3"
    return PublishedRun(
        f"{job.name} {label}",
        f"{MEGATRON_SOURCE} {table}",
        job,
        plan,
        tflops,
        megatron_flops_per_step(job),
        baseline=zero == 3,
    )


DEEPSEEK_V3_JOB = replace(DEEPSEEK_V3, name="DeepSeek-V3, 2,048 H800", usable_memory_fraction=1.0)
DEEPSEEK_V3_PLAN = ParallelPlan(dp=128, tp=1, pp=16, zero_stage=1, ep=64, schedule="dualpipe")
DEEPSEEK_TOKENS_PER_GPU_S = 1e12 / (180e3 * 3600)
"""180K H800 GPU-hours per trillion tokens (DeepSeek-V3 report, Sec. 1)."""


def _deepseek() -> PublishedRun:
    job = DEEPSEEK_V3_JOB
    step = job.global_batch_tokens / (job.n_gpus * DEEPSEEK_TOKENS_PER_GPU_S)
    flops = 6 * job.active_params * job.global_batch_tokens
    tflops = flops / (job.n_gpus * step) / 1e12  # 6N-basis throughput implied by the hours
    return PublishedRun(job.name, DEEPSEEK_SOURCE, job, DEEPSEEK_V3_PLAN, tflops, flops)


PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    _llama3(8192, 8192, 1, 430),
    _llama3(16384, 8192, 1, 400),
    _llama3(16384, 131072, 16, 380),
    _megatron(GPT3_175B, 384, 8, 12, 0, 153, 2, chunks=2),
    _megatron(GPT3_175B, 768, 8, 12, 0, 149, 2, chunks=2),
    _megatron(GPT3_175B, 1536, 8, 12, 0, 141, 2, chunks=2),
    _megatron(GPT3_175B, 384, 1, 1, 3, 144, 2),
    _megatron(GPT3_175B, 768, 1, 1, 3, 88, 2),
    _megatron(GPT3_175B, 1536, 1, 1, 3, 44, 2),
    _megatron(GPT_1T, 3072, 8, 64, 0, 163, 1),
    _deepseek(),
    *SELECTIVE_RUNS,
)
"""Every published row the planner is held against (module docstring)."""


def best_published_mfu_6n(job: Requirements) -> float:
    """The highest 6N MFU any published run of ``job``'s model (its parameters) reached on
    ``job``'s GPU: what a winner the planner proposes for ``job`` is held to. For the 2021 1T
    job that is Korthikanti et al. 2022's 55.5 % on the same model and cluster, not the 2021
    run's own 38.7 % — the plan the planner prefers for that job given 2022's software (TP 8,
    a deep pipeline, selective recomputation) is the one that paper ran."""
    return max(
        r.mfu_6n for r in PUBLISHED_RUNS if r.job.params == job.params and r.job.gpu == job.gpu
    )


__all__ = [
    "PUBLISHED_RUNS",
    "PlannerVsPublished",
    "PublishedRun",
    "SELECTIVE_RUNS",
    "best_published_mfu_6n",
    "causal_flops_per_step",
    "compare",
    "megatron_flops_per_step",
    "implied_zero3_bandwidth",
    "zero3_bytes_per_gpu",
]
