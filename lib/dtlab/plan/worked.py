"""The capstone's jobs planned end to end: 7B, 70B, 405B and a 671B mixture of experts.

For each job of :data:`~dtlab.plan.large_jobs.CAPSTONE_JOBS`, the first plan that fits (the
expert's order, :mod:`dtlab.plan.search`) and the fastest (:func:`~dtlab.plan.step_time.
fastest_plans`), with memory per GPU by category, bytes per GPU per step along each dimension,
the step time and MFU. Lab 11 prints it::

    from dtlab.plan.worked import print_worked_jobs
    print_worked_jobs()

Every number is the planner's model (its assumptions are in each module's docstring), not a
measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.plan.job import Requirements
from dtlab.plan.large_jobs import CAPSTONE_JOBS
from dtlab.plan.layout_cost import StepTraffic, traffic_per_gpu
from dtlab.plan.memory_by_category import MemoryPerGPU, memory_per_gpu
from dtlab.plan.parallel_plan import ParallelPlan
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
        f"    step {w.step_s:.2f} s = (compute {w.compute_s:.2f} + recompute {w.recompute_s:.2f} "
        f"+ tp {w.tp_s:.2f} + pp {w.pp_s:.2f} + cp exposed {w.cp_exposed_s:.2f} + ep "
        f"{w.ep_s:.2f}) / (1 − bubble {w.bubble:.1%}) + dp exposed {w.dp_exposed_s:.2f}; "
        f"MFU {w.mfu:.1%}"
    )


def print_worked_jobs(jobs: tuple[Requirements, ...] = CAPSTONE_JOBS) -> None:
    """Print :func:`worked_jobs` as :func:`format_worked` lines."""
    for row in worked_jobs(jobs):
        print(format_worked(row))


if __name__ == "__main__":
    print_worked_jobs()
