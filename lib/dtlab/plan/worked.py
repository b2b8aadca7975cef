"""The capstone's jobs planned end to end: 7B, 70B, 405B and a 671B mixture of experts.

For each job of :data:`~dtlab.plan.large_jobs.CAPSTONE_JOBS`, the first plan that fits (the
expert's order, :mod:`dtlab.plan.search`) and the fastest (:func:`~dtlab.plan.step_time.
fastest_plans`), with memory per GPU by category, bytes per GPU per step along each dimension,
the step time and MFU. Lab 11 prints it::

    from dtlab.plan.worked import print_worked_jobs
    print_worked_jobs()

Every number is the planner's model (its assumptions are in each module's docstring), not a
measurement. :func:`print_published_table` holds the model against published runs
(:mod:`dtlab.plan.published`): for each, the source, whether the layout passes under the paper's
policy, the published and predicted step, both MFU bases, the ratio, where the layout ranks among
the planner's own passing plans, and what the planner's best plan claims; below it, the
recipes with no step time (:mod:`dtlab.plan.published_recipes`) and where each ranks::

    python -m dtlab.plan.worked --published
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.plan.job import Requirements
from dtlab.plan.large_jobs import CAPSTONE_JOBS
from dtlab.plan.layout_cost import StepTraffic, traffic_per_gpu
from dtlab.plan.memory_by_category import MemoryPerGPU, memory_per_gpu
from dtlab.plan.parallel_plan import ParallelPlan
from dtlab.plan.published import (
    PUBLISHED_RUNS,
    PlannerVsPublished,
    PublishedRun,
    best_published_mfu_6n,
    compare,
)
from dtlab.plan.published_recipes import PUBLISHED_RECIPES, PublishedRecipe, recipe_rank_fraction
from dtlab.plan.search import first_plan_that_fits
from dtlab.plan.step_time import StepTime, fastest_plans, step_time


@dataclass(frozen=True)
class WorkedPlan:
    """One job, one plan, and everything the planner predicts for it."""

    job: Requirements
    label: str  # "first that fits" or "fastest"
    plan: ParallelPlan
    memory: MemoryPerGPU
    traffic: StepTraffic
    time: StepTime


def work(job: Requirements, label: str, plan: ParallelPlan) -> WorkedPlan:
    """The planner's prediction for ``plan`` on ``job``."""
    return WorkedPlan(
        job,
        label,
        plan,
        memory_per_gpu(job, plan),
        traffic_per_gpu(job, plan),
        step_time(job, plan),
    )


def worked_jobs(jobs: tuple[Requirements, ...] = CAPSTONE_JOBS) -> list[WorkedPlan]:
    """For each job, its first plan that fits and its fastest plan."""
    rows = []
    for job in jobs:
        rows.append(work(job, "first that fits", first_plan_that_fits(job)))
        best, _ = fastest_plans(job, 1)[0]
        rows.append(work(job, "fastest", best))
    return rows


def format_worked(row: WorkedPlan) -> str:
    """Three lines: the plan, its memory by category, its bytes and time per step."""
    m, t, w = row.memory, row.traffic, row.time
    gb = 1e9
    return (
        f"{row.job.name} — {row.label}: {row.plan.describe()}\n"
        f"    memory/GPU: {m.summary()}\n"
        f"    GB sent/GPU/step: dp {t.dp / gb:.0f}, tp {t.tp / gb:.0f}, pp {t.pp / gb:.1f}, "
        f"cp {t.cp / gb:.0f}, ep {t.ep / gb:.0f}\n"
        f"    step {w.step_s:.2f} s ≈ (compute {w.compute_s:.2f} + recompute {w.recompute_s:.2f} "
        f"+ exposed: tp {w.tp_exposed_s:.2f} + pp {w.pp_exposed_s:.2f} + cp {w.cp_exposed_s:.2f} "
        f"+ ep {w.ep_exposed_s:.2f}) / (1 − bubble {w.bubble:.1%}) + dp exposed "
        f"{w.dp_exposed_s:.2f}; "
        f"MFU {w.mfu:.1%}"
    )


def print_worked_jobs(jobs: tuple[Requirements, ...] = CAPSTONE_JOBS) -> None:
    """Print :func:`worked_jobs` as :func:`format_worked` lines."""
    for row in worked_jobs(jobs):
        print(format_worked(row))


PUBLISHED_HEADER = (
    "| run | source | layout | accepted | step published → predicted (ratio) | "
    "MFU 6N published / predicted | MFU 6N+attn published / predicted | "
    "rank (its software; today's) | best plan |"
)


def format_published(c: PlannerVsPublished) -> str:
    """One markdown row of the planner-vs-published table."""
    r, t = c.run, c.predicted
    verdict = "yes" if not c.problems else "no: " + c.problems[0].split(":")[0]
    later = ""
    if r.job.software != "current":
        later = f"; {c.rank_fraction_with('current'):.0%} today"
    role = " (baseline)" if r.baseline else ""
    return (
        f"| {r.name} | {r.source} | {r.plan.describe()} | {verdict} | "
        f"{r.step_s:.2f} s → {t.step_s:.2f} s ({c.step_ratio:.2f}) | "
        f"{r.mfu_6n:.1%} / {t.mfu:.1%} | {r.mfu_attention:.1%} / {t.mfu_attention:.1%} | "
        f"{c.rank + 1} of {len(c.passing_steps)} ({c.rank_fraction:.0%}{later}){role} | "
        f"{c.best_plan.describe()}: {c.best.mfu:.1%} ({c.best_mfu_ratio:.2f}× this run, "
        f"{c.best.mfu / best_published_mfu_6n(r.job):.2f}× the model's best published) |"
    )


def print_published_table(runs: tuple[PublishedRun, ...] = PUBLISHED_RUNS) -> None:
    """Print the planner against every published run (a markdown table)."""
    print(PUBLISHED_HEADER)
    print("|" + "---|" * PUBLISHED_HEADER.count(" | ") + "---|")
    for run in runs:
        print(format_published(compare(run)))
    print_recipe_ranks()


def print_recipe_ranks(recipes: tuple[PublishedRecipe, ...] = PUBLISHED_RECIPES) -> None:
    """Each recommended layout without a step time, and the share of the planner's passing
    plans for its job that are faster."""
    print("\nRecipes (no published step; rank only):")
    for recipe in recipes:
        print(
            f"  {recipe.name}: {recipe.plan.describe()} — "
            f"{recipe_rank_fraction(recipe):.1%} of the planner's plans faster  [{recipe.source}]"
        )


def print_published_steps(runs: tuple[PublishedRun, ...] = PUBLISHED_RUNS) -> None:
    """The published layouts priced, without the search (fast): acceptance, the published and
    predicted step, both MFU bases and the ratio."""
    from dtlab.plan.problems import plan_problems
    from dtlab.plan.step_time import step_time

    for run in runs:
        t = step_time(run.job, run.plan)
        problems = plan_problems(run.job, run.plan)
        print(
            f"{run.name:<36} {run.plan.describe()}\n"
            f"    {'accepted' if not problems else 'refused: ' + problems[0][:60]}; step "
            f"{run.step_s:.2f} s published, {t.step_s:.2f} s predicted ({t.step_s / run.step_s:.2f}"
            f"×); MFU 6N {run.mfu_6n:.1%} / {t.mfu:.1%}, 6N+attention {run.mfu_attention:.1%} / "
            f"{t.mfu_attention:.1%}  [{run.source}]"
        )


if __name__ == "__main__":
    import sys

    print_published_table() if "--published" in sys.argv else print_worked_jobs()
