"""What a parallel plan costs one GPU at a job's scale: memory, bytes on the wire, idle time.

Each function takes the job (:class:`~dtlab.plan.job.Requirements`) and a plan
(:class:`~dtlab.plan.parallel_plan.ParallelPlan`) and returns one number of the interview's
back-of-the-envelope table, built from the library's formulas:

* **model state** — ``16 B/param`` for mixed-precision Adam (bf16 weights 2 + grads 2, fp32
  master, momentum and variance 4 + 4 + 4) of the ``params/(tp·pp)`` model shard, ZeRO then
  sharding it over ``dp`` (Rajbhandari et al. 2020, "ZeRO", Sec. 5):
  :func:`dtlab.memory.model_state_bytes`;
* **activations** — TP + sequence parallel with selective recomputation keeps ``34·s·b·h/t``
  bytes per layer (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", Table 2): :func:`dtlab.memory.activation_bytes_per_layer`;
* **bubble** — ``(p-1)/(m+p-1)`` of a 1F1B step idle, ``(p-1)/(v·m+p-1)`` interleaved
  (Narayanan et al. 2021, Sec. 2.2): :mod:`dtlab.cost.bubble`;
* **communication** — the bytes one GPU sends per optimizer step along each mesh dimension
  (:mod:`dtlab.cost.volumes`): :func:`traffic_per_gpu`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dtlab.cost import bubble_fraction_of_total, interleaved_bubble_fraction_of_total
from dtlab.cost.volumes import pipeline_p2p_bytes_per_step, sp_collective_volume_per_layer
from dtlab.memory import activation_bytes_per_layer, model_state_bytes, zero_comm_bytes_per_rank
from dtlab.plan.job import Requirements
from dtlab.plan.parallel_plan import ParallelPlan


def micro_batches(req: Requirements, plan: ParallelPlan) -> float:
    """Micro-batches per step per pipeline: global batch / (dp · micro-batch size)."""
    return req.global_batch_sequences / (plan.dp * plan.micro_batch_size)


def state_bytes_per_gpu(params: float, plan: ParallelPlan) -> float:
    """Model-state bytes per GPU: ``params/(tp·pp)`` per model shard, 16 B/param, ZeRO over dp."""
    shard = math.ceil(params / (plan.tp * plan.pp))
    return float(model_state_bytes(shard, plan.dp, plan.zero_stage, "mixed_adam").total)


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


@dataclass(frozen=True)
class StepTraffic:
    """Bytes one GPU sends in one optimizer step, by mesh dimension (it receives as many)."""

    dp: float
    tp: float
    pp: float

    @property
    def total(self) -> float:
        return self.dp + self.tp + self.pp


def traffic_per_gpu(req: Requirements, plan: ParallelPlan, bytes_per_elem: int = 2) -> StepTraffic:
    """Bytes one GPU sends per optimizer step along dp, tp and pp (ring collectives, bf16).

    * ``dp``: the gradients of its ``Ψ = params/(tp·pp)`` shard, once per step (accumulation
      keeps it to one): ``2(N-1)/N·Ψ·e`` for ZeRO 0–2, ``3(N-1)/N·Ψ·e`` for ZeRO-3, whose
      parameters are all-gathered in forward and again in backward
      (:func:`dtlab.memory.zero_comm_bytes_per_rank`);
    * ``tp``: TP + SP, per layer and micro-batch 4 all-gathers and 4 reduce-scatters of
      ``s·b·h·e``, each sending ``(t-1)/t`` of it, for the ``L/pp`` layers of its stage and the
      ``m`` micro-batches (:func:`dtlab.cost.volumes.sp_collective_volume_per_layer`);
    * ``pp``: a middle stage's activations forward and gradients back, ``2·v·m·s·b·h·e``
      (:func:`dtlab.cost.volumes.pipeline_p2p_bytes_per_step`); 0 without a pipeline.
    """
    shard = math.ceil(req.params / (plan.tp * plan.pp))
    m = int(micro_batches(req, plan))
    dp = float(zero_comm_bytes_per_rank(shard, plan.dp, plan.zero_stage, bytes_per_elem))
    per_layer = sp_collective_volume_per_layer(
        req.seq_len, plan.micro_batch_size, req.d_model, plan.tp, bytes_per_elem
    ).bytes_sent_per_rank
    tp = m * (req.n_layers / plan.pp) * per_layer
    pp = 0.0
    if plan.pp > 1:
        pp = pipeline_p2p_bytes_per_step(
            req.seq_len, plan.micro_batch_size, req.d_model, m, plan.virtual_stages, bytes_per_elem
        )
    return StepTraffic(dp, tp, pp)
