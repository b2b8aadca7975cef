"""The planner: what a parallel layout costs a training job at scale, and which layout to pick.

The system-design answer an interviewer expects ("train a 70B model on 2,048 H100s"), as code
that labs, quiz keys and lab 14's graders import (graders never contain it):

* :mod:`~dtlab.plan.job` — :class:`Requirements`, the job (model — dense or mixture of
  experts —, data, cluster, targets), and the Llama-2-shaped presets :data:`LLAMA_70B`,
  :data:`LLAMA_13B`, :data:`LLAMA_7B`; :mod:`~dtlab.plan.large_jobs` adds a Llama-3-405B-shaped
  :data:`LLAMA3_405B` and a DeepSeek-V3-shaped :data:`DEEPSEEK_V3` (:data:`LARGE_JOBS`);
* :mod:`~dtlab.plan.parallel_plan` — :class:`ParallelPlan`, a ``(dp, tp, pp, cp, ep)``
  :class:`dtlab.mesh.Layout` plus ZeRO stage, micro-batch size, interleaving and recomputation;
* :mod:`~dtlab.plan.layout_cost`, :mod:`~dtlab.plan.memory_by_category`, :mod:`~dtlab.plan.wire` —
  per GPU: memory by category, pipeline bubble and bytes sent per step along each dimension;
* :mod:`~dtlab.plan.problems` — :func:`plan_problems`, the checklist a plan must pass, with
  the job's policies: :mod:`~dtlab.plan.software` (what its framework offers, e.g. Megatron-LM
  of 2021) and :mod:`~dtlab.plan.batch_ramp` (a batch that grows during training);
* :mod:`~dtlab.plan.search` — :func:`first_plan_that_fits`, in the expert's order of preference;
* :mod:`~dtlab.plan.step_time` — :func:`~dtlab.plan.step_time.step_time` and
  :func:`~dtlab.plan.step_time.fastest_plans`: compute, exposed communication, bubble, MFU,
  built from :mod:`~dtlab.plan.compute` (GEMM shapes, causal attention, recomputation),
  :mod:`~dtlab.plan.exposed` (what each mechanism's communication exposes and what hides it),
  :mod:`~dtlab.plan.stages` (uneven stages, chunks per device, in-flight activations) and the
  one constants module, :mod:`~dtlab.plan.constants` (each constant with its source);
* :mod:`~dtlab.plan.published` — Llama 3 405B, Megatron-LM 2021 and DeepSeek-V3 as jobs and
  layouts, with their published throughput, held against the model
  (:func:`~dtlab.plan.published.compare`); :mod:`~dtlab.plan.case_studies` answers the case
  studies' questions from it;
* :mod:`~dtlab.plan.worked` — :func:`~dtlab.plan.worked.print_worked_jobs`, 7B to 405B and the
  MoE planned end to end, and :func:`~dtlab.plan.worked.print_published_table`, the planner
  against the published runs;
* :mod:`~dtlab.plan.wall_clock` — days of compute (``6·N·D``) and the Young/Daly checkpoint
  interval.

    from dtlab.plan import LLAMA_70B, ParallelPlan, plan_problems
    plan_problems(LLAMA_70B, ParallelPlan(dp=256, tp=8, pp=1, zero_stage=1))   # [] or reasons
"""

from dtlab.plan.job import JOBS, LLAMA_7B, LLAMA_13B, LLAMA_70B, Requirements
from dtlab.plan.large_jobs import CAPSTONE_JOBS, DEEPSEEK_V3, LARGE_JOBS, LLAMA3_405B
from dtlab.plan.layout_cost import (
    StepTraffic,
    activation_bytes_per_gpu,
    micro_batches,
    pipeline_bubble,
    state_bytes_per_gpu,
    traffic_per_gpu,
)
from dtlab.plan.memory_by_category import MemoryPerGPU, memory_per_gpu
from dtlab.plan.parallel_plan import RECOMPUTE, ParallelPlan
from dtlab.plan.problems import plan_problems
from dtlab.plan.search import candidate_plans, first_plan_that_fits
from dtlab.plan.wall_clock import (
    CHECKPOINT_BYTES_PER_PARAM,
    checkpoint_interval_s,
    days_to_train,
)

__all__ = [
    "CAPSTONE_JOBS",
    "CHECKPOINT_BYTES_PER_PARAM",
    "DEEPSEEK_V3",
    "JOBS",
    "LARGE_JOBS",
    "LLAMA3_405B",
    "LLAMA_7B",
    "LLAMA_13B",
    "LLAMA_70B",
    "RECOMPUTE",
    "MemoryPerGPU",
    "ParallelPlan",
    "Requirements",
    "StepTraffic",
    "activation_bytes_per_gpu",
    "candidate_plans",
    "checkpoint_interval_s",
    "days_to_train",
    "first_plan_that_fits",
    "memory_per_gpu",
    "micro_batches",
    "pipeline_bubble",
    "plan_problems",
    "state_bytes_per_gpu",
    "traffic_per_gpu",
]
