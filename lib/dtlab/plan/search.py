"""Search for a plan the way an expert reasons: the cheapest parallelism first.

The order of preference, and why (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", Sec. 3, "takeaways"):

1. **the smallest TP**, kept inside a node: its all-reduces sit on the critical path of every
   layer and need NVLink, and small per-GPU matmuls lose efficiency;
2. **the fewest pipeline stages**: a pipeline costs its bubble ``(p-1)/(m+p-1)``;
3. **the lowest ZeRO stage** that fits: stage 3 adds a parameter all-gather in backward, 1.5×
   the bytes of data parallelism; stage 1 costs nothing over DDP, so it is always taken;
4. for a mixture of experts, **the smallest EP** that fits at that ZeRO stage — EP before a
   higher ZeRO stage, because ZeRO-3 would all-gather every expert's weights (most of the model)
   twice a step while EP moves only the routed tokens (DeepSeek-V3 runs EP 64 with ZeRO-1);
5. **the fewest model chunks per pipeline device** (interleaved 1F1B divides the bubble by ``v``
   but sends ``v`` times the activations and holds more in flight): any depth ``v`` that
   divides the layer slots per stage (``⌊slots/pp⌋``: 1, 2, 4 or 8 for Llama 3's 128 slots over
   16 stages), stages uneven where ``pp`` does not divide the layers.

Only TP degrees that divide a node are tried (a TP group of 3 on 8-GPU nodes straddles two).
Those five run first with the defaults every Megatron recipe starts from — selective
recomputation (or the first the job's software offers: whole layers in Megatron-LM 2021), no
context parallelism, micro-batch 1 — exactly the candidates (and the order)
of the classic ``(dp, tp, pp)`` search, so the Llama 2 jobs plan as before. Only then are the
levers that cut activations pulled, cheapest first (Korthikanti et al. 2022, Sec. 5; Liu et al.
2023): **context parallelism**, smallest ``cp`` first (its ring hides behind attention's compute);
then **full recomputation** (one more forward pass: 8·N instead of 6·N FLOPs), with ``cp``
again from 1; then **no recomputation** (fastest when it fits, the most memory, so last — for
a GPT-shaped job with flash attention the same as selective, which has nothing to drop);
and **micro-batches of 2** last of all (more memory and a longer bubble; they only pay
where small GEMMs lose efficiency, :mod:`dtlab.plan.compute`). Pipelines also try the
**ZB-H1** schedule (weight gradients fill the drain) and, for a mixture of experts,
**DualPipe** (all-to-alls under another micro-batch's compute). In those later tiers the
search skips degrees that cannot work (TP not dividing the heads, a sequence CP cannot split,
a batch that gives no whole number of micro-batches), which keeps the 16,384-GPU job to a few
thousand candidates. Every tier proposes only what the job's software offers
(:mod:`dtlab.plan.software`): its recomputations, CP and schedules, sequence parallelism or
not, and its ZeRO-3 flavour.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

from dtlab.cost import gpu
from dtlab.mesh import layouts_of
from dtlab.mesh.layout_rules import context_parallel_problems, divisors, tensor_parallel_problems
from dtlab.plan.job import Requirements
from dtlab.plan.parallel_plan import ParallelPlan
from dtlab.plan.problems import plan_problems
from dtlab.plan.software import software_of

ZERO_STAGES = (1, 2, 3)
CP_DEGREES = (1, 2, 4, 8, 16, 32)
MICRO_BATCH_SIZES = (1, 2)


def expert_degrees(req: Requirements, dp: int, tp: int = 1, pp: int = 1) -> list[int]:
    """EP degrees worth trying: 1 for a dense model; else the divisors of ``dp`` that divide the
    experts, from the smallest whose expert state (16 B/param of ``Ψ_e/(tp·pp·ep)``, before ZeRO)
    fits the usable HBM, and twice that (rule 4: the smallest EP that fits; one doubling more
    for when larger expert GEMMs pay for the traffic)."""
    if not req.is_moe:
        return [1]
    usable = gpu(req.gpu).hbm_bytes * req.usable_memory_fraction
    choices = divisors(math.gcd(req.n_experts, dp))
    fits = [e for e in choices if 16 * req.expert_params / (tp * pp * e) <= usable]
    if not fits:
        return choices[-1:]
    return [e for e in fits if e <= 2 * fits[0]]


def interleave_depths(req: Requirements, pp: int) -> list[int]:
    """Interleaving depths worth trying: 1 without a pipeline; else every divisor of the layer
    slots per stage, ``⌊slots/pp⌋`` (each chunk keeps at least one slot)."""
    if pp == 1:
        return [1]
    return divisors(max(1, req.pipeline_layer_slots // pp))


def schedules_for(req: Requirements, pp: int, v: int) -> tuple[str, ...]:
    """Schedules worth trying: 1F1B; with a pipeline and no interleaving also ZB-H1 — or, for a
    mixture of experts on an even number of stages, DualPipe, whose overlap of the all-to-alls
    is what such a job needs (and whose bubble is ZB-H1's order) — where the job's software has
    them."""
    if pp == 1 or v > 1:
        return ("1f1b",)
    offered = software_of(req).schedules
    second = "dualpipe" if req.is_moe and pp % 2 == 0 else "zb-h1"
    return ("1f1b", second) if second in offered else ("1f1b",)


def _plan(req: Requirements, *degrees, **choices) -> ParallelPlan:
    """A candidate carrying the job's numerics, and the software's SP and ZeRO-3 flavour."""
    software = software_of(req)
    plan = ParallelPlan(
        *degrees,
        **choices,
        fp32_grad_accum=req.fp32_grads,
        sequence_parallel=software.sequence_parallel,
    )
    if plan.zero_stage == 3:
        return replace(plan, zero3_collectives=software.zero3_collectives[0])
    return plan


def _zero_stages(req: Requirements, stages: tuple[int, ...]) -> list[int]:
    """``stages`` the job's software offers; plain data parallelism (ZeRO-0) in ZeRO-1's place
    where it has no sharded optimizer (Megatron-LM before 2022)."""
    offered = software_of(req).zero_stages
    chosen = [z for z in stages if z in offered]
    if 1 in stages and 1 not in offered and 0 in offered:
        chosen.insert(0, 0)
    return chosen


def _classic(req: Requirements) -> Iterator[ParallelPlan]:
    recompute = software_of(req).recompute[0]
    for layout in layouts_of(req.n_gpus, dims=("tp", "pp", "dp")):
        if req.gpus_per_node % layout.tp or layout.pp > req.pipeline_layer_slots:
            continue
        for zero_stage in _zero_stages(req, ZERO_STAGES):
            for ep in expert_degrees(req, layout.dp, layout.tp, layout.pp):
                for v in interleave_depths(req, layout.pp):
                    for schedule in schedules_for(req, layout.pp, v):
                        yield _plan(
                            req, layout.dp, layout.tp, layout.pp, zero_stage, 1, v, ep=ep,
                            recompute=recompute, schedule=schedule,
                        )  # fmt: skip


def _levers(req: Requirements) -> Iterator[tuple[int, str, int]]:
    """(micro-batch, recompute, cp) after the classic tier's (1, the software's first
    recomputation, 1), cheapest first — of what the job's software offers (its recomputation
    in its order, CP only where it has it)."""
    software = software_of(req)
    cps = [
        c
        for c in CP_DEGREES
        if c == 1
        or (software.context_parallel and not context_parallel_problems(c, req.seq_len, "zigzag"))
    ]
    classic = (1, software.recompute[0], 1)
    for mbs in MICRO_BATCH_SIZES:
        for recompute in software.recompute:
            for cp in cps:
                if (mbs, recompute, cp) != classic:
                    yield mbs, recompute, cp


def _widened(req: Requirements, mbs: int, recompute: str, cp: int) -> Iterator[ParallelPlan]:
    slots, sequences = req.pipeline_layer_slots, req.global_batch_sequences
    for tp in divisors(req.gpus_per_node):
        if tensor_parallel_problems(tp, req.n_heads) or req.n_gpus % (tp * cp):
            continue
        rest = req.n_gpus // (tp * cp)
        for pp in (p for p in divisors(rest) if p <= slots):
            dp = rest // pp
            if sequences % (dp * mbs) or sequences // (dp * mbs) < pp:
                continue
            m = sequences // (dp * mbs)
            chunks = [v for v in interleave_depths(req, pp) if v == 1 or m % pp == 0]
            # ZeRO-2 only in the classic tier: rarely between them
            for zero_stage in _zero_stages(req, (1, 3)):
                for ep in expert_degrees(req, dp, tp, pp):
                    for v in chunks:
                        for schedule in schedules_for(req, pp, v):
                            yield _plan(
                                req, dp, tp, pp, zero_stage, mbs, v, cp, ep, recompute, schedule,
                                req.cp_kind if cp > 1 else "ring",
                            )  # fmt: skip


def candidate_plans(req: Requirements) -> Iterator[ParallelPlan]:
    """Every plan worth checking for ``req``, in the expert's order of preference (above),
    each carrying the job's numerics and CP requirement (``fp32_grads``, ``cp_kind``), none
    using what the job's software lacks (:meth:`dtlab.plan.software.Software.problems`)."""
    software = software_of(req)
    yield from (p for p in _classic(req) if not software.problems(p, req))
    for mbs, recompute, cp in _levers(req):
        yield from (p for p in _widened(req, mbs, recompute, cp) if not software.problems(p, req))


def first_plan_that_fits(req: Requirements) -> ParallelPlan:
    """The first of :func:`candidate_plans` with no :func:`plan_problems`."""
    for plan in candidate_plans(req):
        if not plan_problems(req, plan):
            return plan
    raise ValueError(
        f"no plan fits {req.name}: even TP within a node, a pipeline, ZeRO-3, context parallelism "
        "and full recomputation leave too little memory or too large a bubble; add GPUs, raise "
        "the global batch or shorten the sequence"
    )
