"""Graders for lab 11 (composing parallelism and planning a run).

``system_design.reduction_groups`` — ``fn(name, degrees, data_parallel, sequence_parallel) ->
set of dimension names``: the mesh dimensions over which parameter ``name`` of the lab GPT has
its gradient reduced (averaged or summed) before the optimizer step. Graded on real ranks: the
cluster (4 or 8 ranks: dp doubles on 8) composes the tiny GPT with :func:`~dtlab.parallel.compose.compose_gpt` for several
layouts, and on every rank the answer for every parameter that rank holds must equal what the
composed model does (:attr:`ComposedGPT.placements`). Calling ``place_parameters`` or
``compose_gpt`` is refused: the skill is knowing which groups hold copies.

``system_design.pick_layout`` — ``fn(req) -> (ParallelPlan, claims)``: a plan for the job
``req`` (:class:`dtlab.plan.Requirements`) and the numbers that justify it, ``claims`` a dict
with ``"gb_per_gpu"`` (model state plus activations per GPU, GB) and ``"bubble"`` (pipeline
bubble fraction). Graded by the planner on two jobs: the plan must pass every check of
:func:`dtlab.plan.plan_problems`, and each claim must be within 5 % of the planner's own number
(:mod:`dtlab.plan.layout_cost`). Calling the planner's search is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.watch import noticing_calls

LAYOUTS = (
    ({"dp": 2, "tp": 2}, "ddp", True),
    ({"dp": 2, "tp": 2}, "fsdp", False),
    ({"pp": 2, "tp": 2}, "ddp", False),
    ({"dp": 2, "cp": 2}, "ddp", False),
)
CLAIM_TOLERANCE = 0.05


def _placement_answers() -> dict[Callable, str]:
    from dtlab.parallel.compose import apply, placement

    return {
        placement.place_parameters: "dtlab.parallel.compose.place_parameters",
        apply.compose_gpt: "dtlab.parallel.compose.compose_gpt",
    }


def _groups_on_rank(fn: Callable) -> dict:
    import torch.distributed as dist

    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.pipeline import one_f_one_b

    config = GPTConfig.tiny(seq_len=16, d_model=32, vocab_size=64, dropout=0.0)
    problems, used, checked = [], [], 0
    for base, data_parallel, sp in LAYOUTS:
        degrees = {**base, "dp": base.get("dp", 1) * dist.get_world_size() // 4}
        degrees = {d: n for d, n in degrees.items() if n > 1}
        mesh = Mesh(**degrees)
        schedule = one_f_one_b(mesh.pp_size, 2) if mesh.pp_size > 1 else None
        composed = compose_gpt(
            GPT(config, seed=0), mesh, data_parallel=data_parallel, sequence_parallel=sp,
            schedule=schedule,
        )  # fmt: skip
        for name, placement in composed.placements.items():
            with noticing_calls(_placement_answers()) as noticed:
                try:
                    got = fn(name, dict(degrees), data_parallel, sp)
                except NotImplementedError:
                    raise
                except Exception as error:  # noqa: BLE001 - reported to the learner
                    problems.append(f"{name} on {degrees}: your function raised {error!r}")
                    break
            used += noticed
            checked += 1
            want = set(placement.reduced_over)
            if not isinstance(got, set | frozenset | list | tuple) or set(got) != want:
                problems.append(
                    f"{name} on mesh {degrees} ({data_parallel}, sequence_parallel={sp}): you "
                    f"said {got!r}; its gradient is reduced over {sorted(want) or 'no group'}"
                )
                break
    return {"problems": problems, "used": used, "checked": checked, "rank": dist.get_rank()}


@exercise("system_design.reduction_groups", title="Which groups reduce each gradient", world_size=4)
def grade_reduction_groups(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(name, degrees, data_parallel, sequence_parallel) -> set[str]`` (see module doc)."""
    if cluster.world_size % 4:
        raise ValueError(
            f"this exercise composes meshes of 4 ranks (dp scaled up on bigger clusters); pass "
            f"a cluster of 4 or 8 ranks (this one has {cluster.world_size})"
        )
    results = cluster.run(_groups_on_rank, fn)
    for r in results:
        if r["used"]:
            raise NotTheSkill(
                f"your function calls {r['used'][0]}, which computes the answer for you. Reason "
                "it out: a gradient is reduced over every dimension whose ranks hold a copy of "
                "the same tensor and saw different data (dp, cp), plus tp for a replicated "
                "parameter whose gradient is partial under sequence parallelism"
            )
    for r in results:
        if r["problems"]:
            raise AssertionError(f"on rank {r['rank']}: {r['problems'][0]}")
    total = sum(r["checked"] for r in results)
    return GradeResult(
        True,
        f"Right for all {total} (rank, parameter) pairs across {len(LAYOUTS)} composed layouts "
        f"(DDP×TP with SP, FSDP×TP, PP×TP, DP×CP) on {cluster.world_size} ranks.",
    )


def _plan_answers() -> dict[Callable, str]:
    from dtlab.plan import search

    return {
        search.first_plan_that_fits: "dtlab.plan.first_plan_that_fits",
        search.candidate_plans: "dtlab.plan.candidate_plans",
    }


@exercise("system_design.pick_layout", title="Pick and justify a layout", world_size=2)
def grade_pick_layout(fn: Callable, cluster: Any = None) -> GradeResult:
    """``fn(req) -> (ParallelPlan, {"gb_per_gpu": float, "bubble": float})`` (module doc)."""
    from dtlab.plan import LLAMA_13B, LLAMA_70B, ParallelPlan, plan_problems
    from dtlab.plan.layout_cost import (
        activation_bytes_per_gpu,
        pipeline_bubble,
        state_bytes_per_gpu,
    )

    lines = []
    for req in (LLAMA_13B, LLAMA_70B):
        with noticing_calls(_plan_answers()) as noticed:
            answer = fn(req)
        if noticed:
            raise NotTheSkill(
                f"your function calls {noticed[0]}, the planner's search. Choose the layout "
                "yourself: the smallest TP inside a node, the fewest stages, the lowest ZeRO "
                "stage that fits"
            )
        if not (isinstance(answer, tuple) and len(answer) == 2):
            raise AssertionError("return a pair (ParallelPlan, claims dict)")
        plan, claims = answer
        if not isinstance(plan, ParallelPlan) or not isinstance(claims, dict):
            raise AssertionError("return (ParallelPlan(...), {'gb_per_gpu': ..., 'bubble': ...})")
        problems = plan_problems(req, plan)
        if problems:
            raise AssertionError(f"{req.name}: {plan} does not work — {problems[0]}")
        gb = (state_bytes_per_gpu(req.params, plan) + activation_bytes_per_gpu(req, plan)) / 1e9
        bubble = pipeline_bubble(req, plan)
        for key, want in (("gb_per_gpu", gb), ("bubble", bubble)):
            got = claims.get(key)
            if not isinstance(got, int | float):
                raise AssertionError(f"claims[{key!r}] must be a number; got {got!r}")
            if abs(got - want) > CLAIM_TOLERANCE * max(abs(want), 1e-3):
                raise AssertionError(
                    f"{req.name}: you claim {key} = {got:.3g}; for {plan} the planner computes "
                    f"{want:.3g} — recheck that number"
                )
        lines.append(f"{req.name}: dp={plan.dp} tp={plan.tp} pp={plan.pp}, {gb:.1f} GB/GPU")
    return GradeResult(
        True,
        "Both plans pass every check and your numbers match the planner's: " + "; ".join(lines),
    )
