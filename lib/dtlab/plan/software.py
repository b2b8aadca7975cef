"""What the job's training software can do: a policy the planner searches inside.

A published run is judged against the plans its own software could have launched, the way an
interviewer who says "you have Megatron-LM of 2021" expects: a 2021 layout with full
recomputation is not a poor choice because a 2022 paper later made selective recomputation
possible. :class:`Software` names the techniques a framework offers;
:attr:`dtlab.plan.job.Requirements.software` picks one of :data:`SOFTWARE` (default
``"current"``: everything this planner prices). :func:`dtlab.plan.search.candidate_plans`
proposes only what the software offers, and :func:`dtlab.plan.plan_problems` refuses a plan
that uses anything else, naming the technique and the software.

The presets, and the sources that date them:

* ``"current"`` — every technique: sequence parallelism, selective recomputation, context
  parallelism, ZB-H1 and DualPipe schedules, asynchronous TP, per-layer (FSDP-style) ZeRO-3.
* ``"megatron-lm-2022"`` — Megatron-LM as Korthikanti et al. 2022 ("Reducing Activation
  Recomputation in Large Transformer Models") ran it: sequence parallelism and selective
  recomputation (``--sequence-parallel``, ``--recompute-granularity``, merged May 2022), the
  backward TP all-reduce asynchronous under the weight-gradient GEMM (September 2021); plain
  data parallelism reduced after the backward (the distributed optimizer merged in June 2022,
  after the paper; overlapped gradient reduction in 2023), every pipeline exchange waited on
  (``_communicate`` waits on its requests and calls ``torch.cuda.synchronize()``; overlapped
  only from 2023's ``--overlap-p2p-comm``), every stage and chunk as many layers,
  interleaving on 3 stages or more; no ZeRO-3, no context parallelism (Megatron-Core, 2023), no
  zero-bubble schedules (Qi et al. 2023), no DualPipe (DeepSeek-AI 2024), no collective
  matmul (``async_tp``).
* ``"megatron-lm-2021"`` — the two systems Narayanan et al. 2021 ("Efficient Large-Scale
  Language Model Training on GPU Clusters Using Megatron-LM") ran, as of April 2021: Megatron-LM's
  PTD-P — TP without sequence parallelism (every TP rank keeps the LayerNorm and dropout
  activations of the whole sequence) and with backward's all-reduces waiting, recomputation of
  whole layers or none (Sec. 3.5), 1F1B and interleaved 1F1B (3 stages or more, layers divided
  evenly), plain data parallelism reduced after the backward (``--DDP-impl local``; no
  distributed optimizer) and 20 B of model state per parameter with FP16 gradients (its FP16
  optimizer gave each FP32 master weight an FP32 copy of its gradient and never freed it; 18 B
  when gradients accumulate in FP32, where the copy is the gradient itself:
  :func:`dtlab.plan.memory_by_category.state_by_category`), each in-flight micro-batch's stage
  output kept until its backward (freed after the send from December 2021:
  :func:`dtlab.plan.layout_cost.held_stage_outputs_by_device`), every pipeline exchange waited
  on, as in 2022 (:func:`dtlab.plan.exposed.pp_exposed_s`), and apex's two-pass LayerNorm
  backward (the persistent one-pass kernel came to Megatron-LM in October 2021, commit
  ``a2fdcdf``: :data:`dtlab.plan.constants.TWO_PASS_LAYER_NORM_EXTRA_BYTES`) — and, as its
  Table 2's baseline, DeepSpeed's ZeRO-3 of that year: one list collective per parameter tensor
  (:mod:`dtlab.plan.zero3_per_parameter`, v0.3.13), without a pipeline (DeepSpeed's pipeline
  engine refuses ZeRO-2 and 3 from v0.3.16, April 2021). Left out on purpose: DeepSpeed's
  ZeRO-1/2 (they existed, but not in the systems this paper compared), and Megatron-LM's
  ``--distribute-checkpointed-activations`` (full recomputation's checkpoints split over the TP
  ranks; the published runs did not use it, and the planner's 2021 plans are priced without
  it — their full recomputation keeps ``2·s·b·h`` per layer whole).

The dates are those of the commits merged into NVIDIA/Megatron-LM's main branch and into
microsoft/DeepSpeed. Flash attention is not part of a preset: it is the job's
``flash_attention`` (Megatron-LM's GPTs ran without it until January 2023), so "current"
software for a 2021 job keeps that job's attention kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.plan.job import Requirements
from dtlab.plan.parallel_plan import RECOMPUTE, SCHEDULES, ZERO3_COLLECTIVES, ParallelPlan


@dataclass(frozen=True)
class Software:
    """The techniques a training framework offers the planner, and what its runtime overlaps."""

    name: str
    sequence_parallel: bool = True
    recompute: tuple[str, ...] = ("selective", "full", "none")  # the search's order
    context_parallel: bool = True
    schedules: tuple[str, ...] = SCHEDULES
    zero3_collectives: tuple[str, ...] = ZERO3_COLLECTIVES  # the first is the one proposed
    async_tp: bool = True
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    pipeline_zero_stages: tuple[int, ...] = (0, 1, 2, 3)  # the stages it runs with pp > 1
    uneven_stages: bool = True  # False: every stage and chunk holds as many layers
    min_pp_interleaved: int = 2  # the fewest stages interleaving runs on
    keeps_stage_outputs: bool = False  # each in-flight micro-batch's stage output held
    tp_backward_overlap: bool = True  # backward's TP all-reduce under the wgrad GEMM
    overlaps_grad_sync: bool = True  # DP's once-a-step sync under the last backward
    blocking_p2p: bool = False  # every pipeline exchange waited on (and the device synced)
    fp32_main_grads: bool = False  # its optimizer keeps an FP32 copy of each 16-bit gradient
    persistent_layer_norm: bool = True  # one-pass LayerNorm backward (else dY and X read twice)

    def problems(self, plan: ParallelPlan, job: Requirements) -> list[str]:
        """Each technique ``plan`` uses for ``job`` that this software lacks ([] when none; a
        choice that exists nowhere is :func:`dtlab.plan.plan_problems`' to name)."""
        lacks = []
        if plan.sequence_parallel and plan.tp > 1 and not self.sequence_parallel:
            lacks.append(("sequence parallelism", "set sequence_parallel=False"))
        if plan.recompute in RECOMPUTE and plan.recompute not in self.recompute:
            lacks.append((f"recompute={plan.recompute!r}", f"choose one of {self.recompute}"))
        if plan.cp > 1 and not self.context_parallel:
            lacks.append((f"context parallelism (cp={plan.cp})", "set cp=1"))
        if plan.schedule in SCHEDULES and plan.schedule not in self.schedules:
            lacks.append((f"the {plan.schedule!r} schedule", f"choose one of {self.schedules}"))
        flavour = plan.zero3_collectives
        offered = self.zero3_collectives
        if plan.zero_stage == 3 and flavour in ZERO3_COLLECTIVES and flavour not in offered:
            lacks.append((f"zero3_collectives={flavour!r}", f"choose one of {offered}"))
        if plan.zero_stage in (0, 1, 2, 3) and plan.zero_stage not in self.zero_stages:
            lacks.append((f"ZeRO-{plan.zero_stage}", f"choose zero_stage from {self.zero_stages}"))
        elif plan.pp > 1 and plan.zero_stage not in self.pipeline_zero_stages:
            lacks.append(
                (
                    f"ZeRO-{plan.zero_stage} with a pipeline",
                    f"set pp=1 or zero_stage from {self.pipeline_zero_stages}",
                )
            )
        chunks = plan.pp * plan.virtual_stages
        if not self.uneven_stages and plan.pp > 1 and job.pipeline_end_trim:
            lacks.append(("trimmed first and last stages", "set pipeline_end_trim=0"))
        elif not self.uneven_stages and plan.pp > 1 and job.n_layers % chunks:
            lacks.append(
                (
                    f"uneven pipeline stages ({job.n_layers} layers over {chunks} chunks)",
                    "choose pp · virtual_stages dividing the layers",
                )
            )
        if 1 < plan.pp < self.min_pp_interleaved and plan.virtual_stages > 1:
            lacks.append(
                (
                    f"interleaving on {plan.pp} stages",
                    f"use pp >= {self.min_pp_interleaved} or virtual_stages=1",
                )
            )
        if plan.async_tp and not self.async_tp:
            lacks.append(("asynchronous TP", "set async_tp=False"))
        return [
            f"the job's software ({self.name!r}) has no {what}: {fix}, or give the job newer "
            f"software (Requirements.software, one of {tuple(SOFTWARE)})"
            for what, fix in lacks
        ]


MEGATRON_2022 = Software(
    "megatron-lm-2022",
    context_parallel=False,
    schedules=("1f1b",),
    async_tp=False,
    zero_stages=(0,),
    pipeline_zero_stages=(0,),
    uneven_stages=False,
    min_pp_interleaved=3,
    overlaps_grad_sync=False,
    blocking_p2p=True,
)
MEGATRON_2021 = Software(
    "megatron-lm-2021",
    sequence_parallel=False,
    recompute=("full", "none"),
    context_parallel=False,
    schedules=("1f1b",),
    zero3_collectives=("per_parameter",),
    async_tp=False,
    zero_stages=(0, 3),
    pipeline_zero_stages=(0,),
    uneven_stages=False,
    min_pp_interleaved=3,
    keeps_stage_outputs=True,
    tp_backward_overlap=False,
    overlaps_grad_sync=False,
    blocking_p2p=True,
    fp32_main_grads=True,
    persistent_layer_norm=False,
)
SOFTWARE: dict[str, Software] = {
    "current": Software("current"),
    "megatron-lm-2022": MEGATRON_2022,
    "megatron-lm-2021": MEGATRON_2021,
}
"""The presets (module docstring), by the name :attr:`Requirements.software` takes."""


def software_problems(name: str) -> list[str]:
    """[] when ``name`` is a preset of :data:`SOFTWARE`, else the message that lists them."""
    if name in SOFTWARE:
        return []
    return [f"software={name!r} is not a preset; use one of {tuple(SOFTWARE)}"]


def software_of(job) -> Software:
    """The :class:`Software` of ``job`` (a :class:`~dtlab.plan.job.Requirements`)."""
    problems = software_problems(job.software)
    if problems:
        raise ValueError(problems[0])
    return SOFTWARE[job.software]
