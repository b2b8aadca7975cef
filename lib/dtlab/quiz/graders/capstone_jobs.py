"""The capstone's jobs and the interviewer's reference answers (lab 12's graders use them).

Three training jobs shaped like the Llama 2 models (70B, 13B, 7B), a :class:`ParallelPlan` to
split their GPUs, and the numbers a strong answer produces: days of compute (Kaplan et al. 2020,
``C ≈ 6ND``), model-state bytes per GPU (Rajbhandari et al. 2020, Sec. 5), activation memory and
pipeline bubble of a plan (Korthikanti et al. 2022), the checklist :func:`plan_problems`, and the
Young/Daly checkpoint interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dtlab.cost import (
    bubble_fraction_of_total,
    cluster_mtbf,
    gpu,
    interleaved_bubble_fraction_of_total,
    young_daly_interval,
)
from dtlab.cost import training_days as cost_training_days
from dtlab.memory import activation_bytes_per_layer, model_state_bytes

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
# Graded but never shown in the lab: a table of the shown jobs' answers fails on these.
UNSEEN_JOBS = (
    Requirements(
        "34B on 512 H100", 34e9, 48, 8192, 64, 4096, 1e12, 4 * 2**20, 512,
        mfu=0.38, per_gpu_mtbf_hours=40_000.0,
    ),
    Requirements(
        "7B on 32 A100-80GB", 7e9, 32, 4096, 32, 4096, 5e11, 2**20, 32,
        gpu="a100_80gb", mfu=0.5, storage_write_bytes_per_s=20e9,
    ),
)  # fmt: skip


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
