"""Graders for lab 12 (interview capstone): the system design of a large training job, in numbers.

The learner answers the four stages of the design interview as four small functions:

1. ``training_days(req)`` — requirements → compute: ``6·N·D / (GPUs · peak · MFU)``
   (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Sec. 2.1, for ``C ≈ 6ND``).
2. ``memory_per_gpu(params, plan)`` — model-state bytes on one GPU: TP × PP split the model,
   ZeRO shards its state over DP (Rajbhandari et al. 2020, Sec. 5).
3. ``choose_plan(req)`` — a :class:`ParallelPlan` that fits, checked by :func:`plan_problems`.
4. ``checkpoint_interval_s(req)`` — Young/Daly ``sqrt(2·C·MTBF)`` for this job.

Each grader runs the learner's function **on every rank** of the cluster over several jobs
(70B, 13B, 7B) so a hard-coded answer fails, and requires every rank to agree: in a real job every
rank derives the plan from the same config, and two ranks that disagree build mismatched groups.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dtlab.cost import (
    bubble_fraction_of_total,
    cluster_mtbf,
    gpu,
    interleaved_bubble_fraction_of_total,
    young_daly_interval,
)
from dtlab.cost import training_days as cost_training_days
from dtlab.memory import activation_bytes_per_layer, model_state_bytes
from dtlab.quiz.exercises import GradeResult, exercise

# A checkpoint holds bf16 weights (2 B), the fp32 master copy (4 B) and Adam's m and v (8 B).
CHECKPOINT_BYTES_PER_PARAM = 14


@dataclass(frozen=True)
class Requirements:
    """What the job must do and what it runs on (sizes as in the Llama 2 paper's models)."""

    name: str
    params: float
    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    tokens: float  # training tokens
    global_batch_tokens: int  # tokens per optimizer step
    n_gpus: int
    gpu: str = "h100_sxm"  # a preset of dtlab.cost.GPUS
    gpus_per_node: int = 8
    mfu: float = 0.4
    per_gpu_mtbf_hours: float = 50_000.0  # ~Llama 3's 16k-GPU run: a failure every ~3 hours
    storage_write_bytes_per_s: float = 100e9  # aggregate checkpoint write bandwidth
    usable_memory_fraction: float = 0.9  # leave 10% for buffers, fragmentation, NCCL
    max_bubble: float = 0.15  # at most 15% of a step idle in the pipeline

    @property
    def global_batch_sequences(self) -> int:
        return self.global_batch_tokens // self.seq_len


@dataclass(frozen=True)
class ParallelPlan:
    """How the GPUs are split: ``dp · tp · pp`` must equal the GPU count."""

    dp: int
    tp: int
    pp: int
    zero_stage: int = 1
    micro_batch_size: int = 1
    virtual_stages: int = 1  # > 1: interleaved 1F1B

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp


LLAMA_70B = Requirements("70B on 2048 H100", 70e9, 80, 8192, 64, 4096, 2e12, 4 * 2**20, 2048)
LLAMA_13B = Requirements(
    "13B on 256 A100-80GB",
    13e9,
    40,
    5120,
    40,
    4096,
    1e12,
    4 * 2**20,
    256,
    gpu="a100_80gb",
    mfu=0.45,
)
LLAMA_7B = Requirements("7B on 64 H100", 7e9, 32, 4096, 32, 4096, 1e12, 2 * 2**20, 64)
JOBS = (LLAMA_70B, LLAMA_13B, LLAMA_7B)


# -- reference answers ----------------------------------------------------------------------


def reference_training_days(req: Requirements) -> float:
    """Wall-clock days: ``6·params·tokens / (n_gpus · peak bf16 FLOP/s · MFU) / 86400``."""
    return cost_training_days(
        req.tokens, req.params, req.n_gpus, gpu(req.gpu).bf16_dense_flops, req.mfu
    )


def reference_memory_per_gpu(params: float, plan: ParallelPlan) -> float:
    """Model-state bytes per GPU: ``params/(tp·pp)`` per model shard, 16 B/param, ZeRO over dp."""
    shard = math.ceil(params / (plan.tp * plan.pp))
    return float(model_state_bytes(shard, plan.dp, plan.zero_stage, "mixed_adam").total)


def micro_batches(req: Requirements, plan: ParallelPlan) -> float:
    """Micro-batches per step per pipeline: global batch / (dp · micro-batch size)."""
    return req.global_batch_sequences / (plan.dp * plan.micro_batch_size)


def activation_bytes_per_gpu(req: Requirements, plan: ParallelPlan) -> float:
    """Peak activations on the first pipeline stage: TP + SP, selective recomputation.

    1F1B keeps ``pp`` micro-batches in flight on stage 0, each holding its ``L/pp`` layers, so
    the total is ``L`` layers' worth whatever ``pp`` is; interleaving multiplies it by
    ``1 + (pp-1)/(pp·v)`` (Korthikanti et al. 2022, Sec. 4.2.3).
    """
    per_layer = activation_bytes_per_layer(
        req.seq_len, plan.micro_batch_size, req.d_model, req.n_heads, plan.tp, True, "selective"
    )
    interleave = (
        1 + (plan.pp - 1) / (plan.pp * plan.virtual_stages) if plan.virtual_stages > 1 else 1
    )
    return req.n_layers * per_layer * interleave


def pipeline_bubble(req: Requirements, plan: ParallelPlan) -> float:
    """Idle share of a step: ``(p-1)/(m+p-1)``, or ``(p-1)/(v·m+p-1)`` interleaved."""
    m = int(micro_batches(req, plan))
    if plan.virtual_stages > 1:
        return interleaved_bubble_fraction_of_total(plan.pp, m, plan.virtual_stages)
    return bubble_fraction_of_total(plan.pp, m)


def plan_problems(req: Requirements, plan: ParallelPlan) -> list[str]:
    """Every reason ``plan`` does not work for ``req`` ([] when it does), phrased for a learner."""
    problems = []
    if min(plan.dp, plan.tp, plan.pp, plan.micro_batch_size, plan.virtual_stages) < 1:
        return [f"every degree must be >= 1: {plan}"]
    if plan.world_size != req.n_gpus:
        problems.append(f"dp·tp·pp = {plan.world_size}, but the job has {req.n_gpus} GPUs")
    if plan.tp > req.gpus_per_node:
        problems.append(
            f"TP {plan.tp} spans nodes: keep TP within one node ({req.gpus_per_node} GPUs) on NVLink"
        )
    if req.n_heads % plan.tp or req.d_model % plan.tp:
        problems.append(f"TP {plan.tp} does not divide {req.n_heads} heads / d_model {req.d_model}")
    if req.n_layers % (plan.pp * plan.virtual_stages):
        problems.append(
            f"pp·v = {plan.pp * plan.virtual_stages} does not divide {req.n_layers} layers"
        )
    if plan.virtual_stages > 1 and plan.pp == 1:
        problems.append("interleaving (virtual_stages > 1) needs a pipeline: pp >= 2")
    if plan.zero_stage not in (0, 1, 2, 3):
        problems.append(f"ZeRO stage {plan.zero_stage} does not exist; choose 0, 1, 2 or 3")
    m = micro_batches(req, plan)
    if m != int(m) or m < plan.pp:
        problems.append(
            f"{req.global_batch_sequences} sequences per step over dp {plan.dp} × micro-batch "
            f"{plan.micro_batch_size} gives {m:g} micro-batches; need a whole number >= pp {plan.pp}"
        )
    elif plan.virtual_stages > 1 and int(m) % plan.pp:
        problems.append(f"interleaving needs micro-batches ({m:g}) divisible by pp {plan.pp}")
    if problems:
        return problems
    usable = gpu(req.gpu).hbm_bytes * req.usable_memory_fraction
    state = reference_memory_per_gpu(req.params, plan)
    activations = activation_bytes_per_gpu(req, plan)
    if state + activations > usable:
        problems.append(
            f"needs {(state + activations) / 1e9:.1f} GB per GPU (model state {state / 1e9:.1f} + "
            f"activations {activations / 1e9:.1f}) but only {usable / 1e9:.0f} GB is usable"
        )
    bubble = pipeline_bubble(req, plan)
    if bubble > req.max_bubble:
        problems.append(f"pipeline bubble {bubble:.1%} exceeds {req.max_bubble:.0%}")
    return problems


def reference_checkpoint_interval_s(req: Requirements) -> float:
    """Young/Daly: ``sqrt(2·C·MTBF)``, C = 14 B/param ÷ write bandwidth, MTBF = per-GPU MTBF / n."""
    cost_s = req.params * CHECKPOINT_BYTES_PER_PARAM / req.storage_write_bytes_per_s
    return young_daly_interval(cost_s, cluster_mtbf(req.per_gpu_mtbf_hours * 3600, req.n_gpus))


# -- graders ------------------------------------------------------------------------------


def _answers_on_rank(fn: Callable, cases: list[tuple]) -> list:
    return [fn(*case) for case in cases]


def _run_on_every_rank(fn: Callable, cases: list[tuple], cluster: Any) -> list:
    """The learner's answers (rank 0's), after checking every rank gave the same ones."""
    per_rank = list(cluster.run(_answers_on_rank, fn, cases))
    for rank, answers in enumerate(per_rank[1:], start=1):
        if answers != per_rank[0]:
            raise AssertionError(
                f"rank {rank} answered {answers!r} but rank 0 answered {per_rank[0]!r}: every rank "
                "must derive the same answer from the same config (no randomness, no rank-dependence)"
            )
    return per_rank[0]


def _compare_numbers(
    what: str, labels: list[str], got: list, want: list[float], rel: float
) -> dict:
    for label, g, w in zip(labels, got, want, strict=True):
        if not isinstance(g, int | float) or not math.isclose(float(g), w, rel_tol=rel):
            raise AssertionError(f"{label}: {what} is {g!r}, expected {w:.6g} (within {rel:.0%})")
    return {label: f"{w:.4g}" for label, w in zip(labels, want, strict=True)}


@exercise("capstone.training_days", title="Requirements: days of training", world_size=2)
def grade_training_days(fn: Callable, cluster: Any) -> GradeResult:
    got = _run_on_every_rank(fn, [(job,) for job in JOBS], cluster)
    want = [reference_training_days(job) for job in JOBS]
    details = _compare_numbers("training days", [j.name for j in JOBS], got, want, 0.01)
    return GradeResult(
        True, "6·N·D / (GPUs · peak · MFU), converted to days, for every job.", details
    )


MEMORY_CASES = [
    (70e9, ParallelPlan(dp=2048, tp=1, pp=1, zero_stage=0)),
    (70e9, ParallelPlan(dp=2048, tp=1, pp=1, zero_stage=3)),
    (70e9, ParallelPlan(dp=32, tp=8, pp=8, zero_stage=1)),
    (70e9, ParallelPlan(dp=64, tp=8, pp=4, zero_stage=2)),
    (13e9, ParallelPlan(dp=32, tp=4, pp=2, zero_stage=1)),
]


@exercise("capstone.memory_per_gpu", title="Back of the envelope: memory per GPU", world_size=2)
def grade_memory_per_gpu(fn: Callable, cluster: Any) -> GradeResult:
    got = _run_on_every_rank(fn, MEMORY_CASES, cluster)
    labels = [f"{p / 1e9:g}B {plan}" for p, plan in MEMORY_CASES]
    want = [reference_memory_per_gpu(p, plan) for p, plan in MEMORY_CASES]
    _compare_numbers("memory per GPU (bytes)", labels, got, want, 0.001)
    return GradeResult(
        True,
        "TP·PP split the 16 B/param of state; ZeRO then shards it over DP — right for every plan.",
        {label: f"{w / 1e9:.1f} GB" for label, w in zip(labels, want, strict=True)},
    )


@exercise("capstone.choose_plan", title="Parallelism plan that fits", world_size=2)
def grade_choose_plan(fn: Callable, cluster: Any) -> GradeResult:
    plans = _run_on_every_rank(fn, [(job,) for job in JOBS], cluster)
    details, wrong = {}, []
    for job, plan in zip(JOBS, plans, strict=True):
        if not isinstance(plan, ParallelPlan):
            wrong.append(f"{job.name}: return a ParallelPlan, not {type(plan).__name__}")
            continue
        problems = plan_problems(job, plan)
        wrong += [f"{job.name}: {p}" for p in problems]
        if not problems:
            details[job.name] = (
                f"{plan} — {(reference_memory_per_gpu(job.params, plan) + activation_bytes_per_gpu(job, plan)) / 1e9:.1f}"
                f" GB/GPU, bubble {pipeline_bubble(job, plan):.1%}"
            )
    if wrong:
        raise AssertionError("\n".join(wrong))
    return GradeResult(
        True, "Every plan uses all GPUs, fits in memory and keeps the bubble small.", details
    )


@exercise(
    "capstone.checkpoint_interval", title="Failure handling: checkpoint interval", world_size=2
)
def grade_checkpoint_interval(fn: Callable, cluster: Any) -> GradeResult:
    got = _run_on_every_rank(fn, [(job,) for job in JOBS], cluster)
    want = [reference_checkpoint_interval_s(job) for job in JOBS]
    details = _compare_numbers("checkpoint interval (s)", [j.name for j in JOBS], got, want, 0.01)
    return GradeResult(True, "sqrt(2 · checkpoint cost · cluster MTBF) for every job.", details)
