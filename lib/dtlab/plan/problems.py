"""The interviewer's checklist: every reason a parallel plan does not work for a job.

In the order an interviewer checks them: the plan uses exactly the job's GPUs; TP stays inside
a node, where its per-layer all-reduces ride NVLink (Shoeybi et al. 2019, Sec. 3); TP divides
the heads and the hidden size, ``pp·v`` the layers (counting the first and last stage's trimmed
slots, :attr:`~dtlab.plan.job.Requirements.pipeline_layer_slots`); CP splits the sequence into
``2·cp`` equal chunks (the zig-zag split that balances causal attention over the ring, Llama 3
Sec. 3.3.2); EP only for a mixture of experts, dividing its experts and ``dp``; the ZeRO stage
and the recomputation exist; the global batch splits into a whole number of micro-batches, at
least one per pipeline stage (and a multiple of ``pp`` when interleaved, Narayanan et al. 2021,
Sec. 2.2). Only a plan that passes all of those is priced: memory by category
(:func:`~dtlab.plan.memory_by_category.memory_per_gpu`) within the usable share of the GPU's memory,
and a pipeline bubble within the job's limit.
"""

from __future__ import annotations

from dtlab.cost import gpu
from dtlab.mesh import divisors
from dtlab.plan.job import Requirements
from dtlab.plan.layout_cost import micro_batches, pipeline_bubble
from dtlab.plan.memory_by_category import memory_per_gpu
from dtlab.plan.parallel_plan import RECOMPUTE, ParallelPlan


def shape_problems(req: Requirements, plan: ParallelPlan) -> list[str]:
    """What is wrong with the plan's degrees, before any pricing."""
    problems = []
    if plan.world_size != req.n_gpus:
        dims = "dp·tp·pp" if plan.cp == 1 else "dp·tp·pp·cp"
        problems.append(f"{dims} = {plan.world_size}, but the job has {req.n_gpus} GPUs")
    if plan.tp > req.gpus_per_node:
        problems.append(
            f"TP {plan.tp} spans nodes: keep TP within one node ({req.gpus_per_node} GPUs) on NVLink"
        )
    if req.n_heads % plan.tp or req.d_model % plan.tp:
        problems.append(f"TP {plan.tp} does not divide {req.n_heads} heads / d_model {req.d_model}")
    chunks = plan.pp * plan.virtual_stages
    if req.pipeline_layer_slots % chunks:
        trimmed = (
            f" (+2·{req.pipeline_end_trim} trimmed end slots)" if req.pipeline_end_trim else ""
        )
        problems.append(f"pp·v = {chunks} does not divide {req.n_layers} layers{trimmed}")
    if plan.virtual_stages > 1 and plan.pp == 1:
        problems.append("interleaving (virtual_stages > 1) needs a pipeline: pp >= 2")
    if plan.cp > 1 and req.seq_len % (2 * plan.cp):
        good = [c for c in divisors(req.seq_len // 2) if c > 1 and c <= 64]
        problems.append(
            f"CP {plan.cp} cannot split the {req.seq_len}-token sequence into 2·cp = "
            f"{2 * plan.cp} equal chunks (zig-zag balance for causal attention); "
            f"choose cp from {good}"
        )
    if plan.ep > 1 and not req.is_moe:
        problems.append(f"EP {plan.ep} needs a mixture of experts; {req.name} is dense: use ep=1")
    elif plan.ep > 1 and req.n_experts % plan.ep:
        problems.append(
            f"EP {plan.ep} does not divide {req.n_experts} experts: choose ep from "
            f"{[e for e in divisors(req.n_experts) if plan.dp % e == 0]}"
        )
    if plan.dp % plan.ep:
        problems.append(
            f"EP {plan.ep} must divide dp {plan.dp} (experts are sharded across data-parallel "
            f"ranks): choose ep from {divisors(plan.dp)}"
        )
    if plan.zero_stage not in (0, 1, 2, 3):
        problems.append(f"ZeRO stage {plan.zero_stage} does not exist; choose 0, 1, 2 or 3")
    if plan.recompute not in RECOMPUTE:
        problems.append(f"recompute={plan.recompute!r} is not a choice; use one of {RECOMPUTE}")
    m = micro_batches(req, plan)
    if m != int(m) or m < plan.pp:
        problems.append(
            f"{req.global_batch_sequences} sequences per step over dp {plan.dp} × micro-batch "
            f"{plan.micro_batch_size} gives {m:g} micro-batches; need a whole number >= pp {plan.pp}"
        )
    elif plan.virtual_stages > 1 and int(m) % plan.pp:
        problems.append(f"interleaving needs micro-batches ({m:g}) divisible by pp {plan.pp}")
    return problems


def plan_problems(req: Requirements, plan: ParallelPlan) -> list[str]:
    """Every reason ``plan`` does not work for ``req`` ([] when it does), phrased for a learner."""
    degrees = (plan.dp, plan.tp, plan.pp, plan.cp, plan.ep)
    if min(*degrees, plan.micro_batch_size, plan.virtual_stages) < 1:
        return [f"every degree and the micro-batch size must be >= 1: {plan}"]
    problems = shape_problems(req, plan)
    if problems:
        return problems
    usable = gpu(req.gpu).hbm_bytes * req.usable_memory_fraction
    memory = memory_per_gpu(req, plan)
    if memory.total > usable:
        problems.append(
            f"needs {memory.total / 1e9:.1f} GB per GPU (model state {memory.model_state / 1e9:.1f}"
            f" + activations {memory.activations / 1e9:.1f}; {memory.summary()}) but only "
            f"{usable / 1e9:.0f} GB is usable: shard more (tp, pp, ep, ZeRO) or cut activations "
            "(cp, recompute)"
        )
    bubble = pipeline_bubble(req, plan)
    if bubble > req.max_bubble:
        problems.append(f"pipeline bubble {bubble:.1%} exceeds {req.max_bubble:.0%}")
    return problems
