"""Search for a plan the way an expert reasons: the cheapest parallelism first.

The order of preference, and why (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", Sec. 3, "takeaways"):

1. **the smallest TP**, kept inside a node: its all-reduces sit on the critical path of every
   layer and need NVLink, and small per-GPU matmuls lose efficiency;
2. **the fewest pipeline stages**: a pipeline costs its bubble ``(p-1)/(m+p-1)``;
3. **the lowest ZeRO stage** that fits: stage 3 adds a parameter all-gather in backward, 1.5×
   the bytes of data parallelism; stage 1 costs nothing over DDP, so it is always taken;
4. **the fewest model chunks per pipeline device** (interleaved 1F1B divides the bubble by ``v``
   but sends ``v`` times the activations).

The candidates are the ``(dp, tp, pp)`` layouts of :func:`dtlab.mesh.layouts_of`, which lists
them smallest ``tp`` first, then smallest ``pp``; the first that passes
:func:`~dtlab.plan.problems.plan_problems` is the answer.
"""

from __future__ import annotations

from collections.abc import Iterator

from dtlab.mesh import layouts_of
from dtlab.plan.job import Requirements
from dtlab.plan.parallel_plan import ParallelPlan
from dtlab.plan.problems import plan_problems

ZERO_STAGES = (1, 2, 3)
VIRTUAL_STAGES = (1, 2, 4)


def candidate_plans(req: Requirements) -> Iterator[ParallelPlan]:
    """Every plan worth checking for ``req``, in the expert's order of preference (above)."""
    for layout in layouts_of(req.n_gpus, dims=("tp", "pp", "dp")):
        if layout.tp > req.gpus_per_node:
            continue
        for zero_stage in ZERO_STAGES:
            for virtual_stages in VIRTUAL_STAGES if layout.pp > 1 else (1,):
                yield ParallelPlan.from_layout(layout, zero_stage, 1, virtual_stages)


def first_plan_that_fits(req: Requirements) -> ParallelPlan:
    """The first of :func:`candidate_plans` with no :func:`plan_problems`."""
    for plan in candidate_plans(req):
        if not plan_problems(req, plan):
            return plan
    raise ValueError(
        f"no plan fits {req.name}: even TP within a node, a pipeline and ZeRO-3 leave too little "
        "memory or too large a bubble; add GPUs, raise the global batch or shorten the sequence"
    )
