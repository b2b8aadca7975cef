"""The interviewer's checklist: every reason a parallel plan does not work for a job.

First, the plan uses only what the job's software offers (:mod:`dtlab.plan.software`: no
sequence parallelism or selective recomputation in Megatron-LM of 2021, …). Then, in the order
an interviewer checks them: the plan uses exactly the job's GPUs; TP stays inside a node — no
larger than one, and dividing it, so no TP group straddles two — where its per-layer
all-reduces ride NVLink (Shoeybi et al. 2019, Sec. 3); TP divides
the heads (and so the hidden size); the pipeline can cut the layers into its chunks — any
layer count, uneven stages allowed, every chunk at least one slot
(:func:`dtlab.plan.stages.stage_problems`); CP splits the sequence into
``2·cp`` equal chunks (the zig-zag split that balances causal attention over the ring, Llama 3
Sec. 3.3.2); EP only for a mixture of experts, dividing its experts and ``dp``; the ZeRO stage
and the recomputation exist; the global batch splits into a whole number of micro-batches, at
least one per pipeline stage (and a multiple of ``pp`` when interleaved, Narayanan et al. 2021,
Sec. 2.2). The layout rules among those come from :mod:`dtlab.mesh.layout_rules`, their one
home, shared with the executor's checks (it says where the planner asks differently, and why);
the ZeRO, recomputation and micro-batch rules are the planner's own. Only a plan that passes all
of those is priced: memory by category (:func:`~dtlab.plan.memory_by_category.memory_per_gpu`,
the worst pipeline device) within the usable share of the GPU's memory, and a pipeline bubble
within the job's limit. Both limits are the job's **policy** (``usable_memory_fraction``,
``max_bubble``; defaults in :mod:`dtlab.plan.constants`), and a rejection names the policy it
breaks and by how much.
"""

from __future__ import annotations

from dtlab.cost import gpu
from dtlab.mesh.layout_rules import (
    context_parallel_problems,
    expert_parallel_problems,
    node_problems,
    tensor_parallel_problems,
)
from dtlab.plan.batch_ramp import ramp_problems
from dtlab.plan.job import Requirements
from dtlab.plan.layout_cost import micro_batch_rule, micro_batches, pipeline_bubble
from dtlab.plan.memory_by_category import memory_per_gpu
from dtlab.plan.parallel_plan import CP_KINDS, RECOMPUTE, SCHEDULES, ZERO3_COLLECTIVES, ParallelPlan
from dtlab.plan.software import software_of, software_problems
from dtlab.plan.stages import stage_problems


def shape_problems(req: Requirements, plan: ParallelPlan) -> list[str]:
    """What is wrong with the plan's degrees, before any pricing."""
    problems = list(software_problems(req.software))
    if problems:
        return problems
    problems += software_of(req).problems(plan, req)
    if req.is_moe and plan.tp > 1 and not plan.sequence_parallel:
        problems.append(
            "a mixture of experts with tp > 1 needs sequence_parallel=True: Megatron-Core's "
            "token dispatcher routes each TP rank's sequence shard (it refuses MoE with TP and "
            "no SP)"
        )
    if plan.world_size != req.n_gpus:
        dims = "dp·tp·pp" if plan.cp == 1 else "dp·tp·pp·cp"
        problems.append(f"{dims} = {plan.world_size}, but the job has {req.n_gpus} GPUs")
    problems += node_problems(plan.tp, req.gpus_per_node, unit="GPUs")
    # Megatron-LM replicates KV heads when tp exceeds them: the planner asks about query heads.
    problems += tensor_parallel_problems(plan.tp, req.n_heads)
    if plan.schedule not in SCHEDULES:
        problems.append(f"schedule={plan.schedule!r} is not a choice; use one of {SCHEDULES}")
        return problems
    if plan.zero3_collectives not in ZERO3_COLLECTIVES:
        problems.append(
            f"zero3_collectives={plan.zero3_collectives!r} is not a choice; use one of "
            f"{ZERO3_COLLECTIVES}"
        )
    elif plan.zero3_collectives != "per_layer" and plan.zero_stage != 3:
        problems.append(
            f"zero3_collectives={plan.zero3_collectives!r} describes a ZeRO-3 implementation, "
            f"but zero_stage={plan.zero_stage}; set zero_stage=3 or leave it 'per_layer'"
        )
    if plan.cp_kind not in CP_KINDS:
        problems.append(f"cp_kind={plan.cp_kind!r} is not a choice; use one of {CP_KINDS}")
    problems += stage_problems(req, plan)
    if plan.cp > 1:  # the planner plans zig-zag context parallelism (Llama 3)
        problems += context_parallel_problems(plan.cp, req.seq_len, "zigzag")
    experts = req.n_experts if req.is_moe else 0
    problems += expert_parallel_problems(plan.ep, experts, plan.dp, model=req.name)
    if plan.zero_stage not in (0, 1, 2, 3):
        problems.append(f"ZeRO stage {plan.zero_stage} does not exist; choose 0, 1, 2 or 3")
    if plan.recompute not in RECOMPUTE:
        problems.append(f"recompute={plan.recompute!r} is not a choice; use one of {RECOMPUTE}")
    m = micro_batches(req, plan)
    fewest, multiple, why = micro_batch_rule(plan)
    if m != int(m) or m < plan.pp:
        problems.append(
            f"{req.global_batch_sequences} sequences per step over dp {plan.dp} × micro-batch "
            f"{plan.micro_batch_size} gives {m:g} micro-batches; need a whole number >= pp {plan.pp}"
        )
    elif m < fewest or int(m) % multiple:
        problems.append(f"{why} (need >= {fewest}, a multiple of {multiple}): {m:g} per pipeline")
    if req.batch_ramp:
        problems += ramp_problems(req, plan)
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
        over = memory.total - usable
        problems.append(
            f"needs {memory.total / 1e9:.1f} GB per GPU on its worst pipeline stage (model state "
            f"{memory.model_state / 1e9:.1f} + activations {memory.activations / 1e9:.1f}; "
            f"{memory.summary()}) but the memory policy leaves {usable / 1e9:.1f} GB usable "
            f"(usable_memory_fraction={req.usable_memory_fraction:g} of "
            f"{gpu(req.gpu).hbm_bytes / 2**30:.1f} GiB = {gpu(req.gpu).hbm_bytes / 1e9:.1f} GB): "
            f"{over / 1e9:.1f} GB ({over / usable:.0%}) "
            "over; shard more (tp, pp, ep, ZeRO), cut activations (cp, recompute) or relax the "
            "policy"
        )
    if problems:
        return problems  # the bubble of a plan that does not fit is not worth pricing
    bubble = pipeline_bubble(req, plan)
    if bubble > req.max_bubble:
        problems.append(
            f"bubble policy (max_bubble={req.max_bubble:g}): pipeline bubble {bubble:.1%} "
            f"exceeds {req.max_bubble:.0%} by {(bubble - req.max_bubble) * 100:.1f} points: "
            "more micro-batches, interleaving or a zero-bubble schedule, or relax the policy"
        )
    return problems
