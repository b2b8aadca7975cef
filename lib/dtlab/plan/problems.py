"""The interviewer's checklist: every reason a parallel plan does not work for a job.

In the order an interviewer checks them: the plan uses exactly the job's GPUs; TP stays inside
a node, where its per-layer all-reduces ride NVLink (Shoeybi et al. 2019, Sec. 3); TP divides
the heads and the hidden size, ``pp·v`` the layers; the ZeRO stage exists; the global batch
splits into a whole number of micro-batches, at least one per pipeline stage (and a multiple of
``pp`` when interleaved, Narayanan et al. 2021, Sec. 2.2). Only a plan that passes all of those
is priced (:mod:`dtlab.plan.layout_cost`): model state plus activations within the usable share
of the GPU's memory, and a pipeline bubble within the job's limit.
"""

from __future__ import annotations

from dtlab.cost import gpu
from dtlab.plan.job import Requirements
from dtlab.plan.layout_cost import (
    activation_bytes_per_gpu,
    micro_batches,
    pipeline_bubble,
    state_bytes_per_gpu,
)
from dtlab.plan.parallel_plan import ParallelPlan


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
    state = state_bytes_per_gpu(req.params, plan)
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
