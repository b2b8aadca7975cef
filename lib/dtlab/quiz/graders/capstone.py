"""Graders for lab 14 (interview capstone): the system design of a large training job, in numbers.

The learner answers the four stages of the design interview as four small functions:

1. ``training_days(req)`` — requirements → compute: ``6·N·D / (GPUs · peak · MFU)``
   (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Sec. 2.1, for ``C ≈ 6ND``).
2. ``memory_per_gpu(params, plan)`` — model-state bytes on one GPU: TP × PP split the model,
   ZeRO shards its state over DP (Rajbhandari et al. 2020, Sec. 5).
3. ``choose_plan(req)`` — a ``ParallelPlan`` that fits, checked by ``plan_problems``.
4. ``checkpoint_interval_s(req)`` — Young/Daly for this job's *asynchronous* checkpoints: the
   cost term is the blocking stall (each GPU's 12 B/param share copied to host over PCIe), and
   the interval is never shorter than one background write (:mod:`dtlab.cost.checkpoint_cost`).

and one more for the numbers behind the plan: ``dp_min_tokens(peak, bus, ranks, grad_bytes)``,
the data-parallel crossover — the fewest tokens per replica for backward to hide the gradient
all-reduce (:mod:`dtlab.cost.crossover`; Austin et al. 2025, "How to Scale Your Model").

The jobs, the plan and every reference answer are the planner's, :mod:`dtlab.plan`; this module
holds only the grading: which cases run, what counts as the library's answer, and two jobs the
lab never shows (:data:`UNSEEN_JOBS`).

Each grader runs the learner's function **on every rank** of the cluster over the lab's jobs
(70B, 13B, 7B) and the two unseen ones, so a hard-coded answer — or a table of the shown jobs'
answers — fails, and requires every rank to agree: in a real job every
rank derives the plan from the same config, and two ranks that disagree build mismatched groups.
A function that calls the library's own answer — ``dtlab.cost.training_days``,
``dtlab.memory.model_state_bytes``, ``dtlab.cost.young_daly_interval``,
:mod:`dtlab.cost.checkpoint_cost`, or the planner's
``dtlab.plan`` functions — fails too, under whatever name it was imported
(:func:`~dtlab.quiz.graders.watch.noticing_calls`): the formula is the skill. ``plan_problems``,
the interviewer's checklist, stays allowed in ``choose_plan``: the skill there is the search order
(so the planner's own search, ``dtlab.plan.first_plan_that_fits``, is refused).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dtlab.cost import gpu, young_daly_interval
from dtlab.cost import training_days as cost_training_days
from dtlab.cost.checkpoint_cost import (
    async_checkpoint_interval_s,
    async_checkpoint_stall_s,
    sync_checkpoint_cost_s,
)
from dtlab.cost.crossover import critical_intensity, dp_min_tokens_for, dp_min_tokens_per_gpu
from dtlab.memory import fsdp2_state_bytes, model_state_bytes
from dtlab.plan import (
    JOBS,
    ParallelPlan,
    Requirements,
    activation_bytes_per_gpu,
    candidate_plans,
    checkpoint_interval_s,
    days_to_train,
    first_plan_that_fits,
    pipeline_bubble,
    plan_problems,
    state_bytes_per_gpu,
)
from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.watch import noticing_calls

# Graded but never shown in the lab: a table of the shown jobs' answers fails on these.
UNSEEN_JOBS = (
    Requirements(
        "34B on 512 H100", 34e9, 48, 8192, 64, 4096, 1e12, 4 * 2**20, 512,
        mfu=0.38, per_gpu_mtbf_hours=40_000.0,
    ),
    Requirements(
        "7B on 32 A100-80GB", 7e9, 32, 4096, 32, 4096, 5e11, 2**20, 32,
        gpu="a100_80gb", mfu=0.5, storage_write_bytes_per_s=20e9,
    ),
)  # fmt: skip
GRADED_JOBS = JOBS + UNSEEN_JOBS  # the lab's three jobs, and two it never shows
# Checkpoint cadence only: storage so slow that one background write outlasts sqrt(2·S·MTBF).
SLOW_STORAGE_JOB = replace(
    JOBS[0], name="70B on 2048 H100, 2 GB/s storage", storage_write_bytes_per_s=2e9
)


# -- graders ------------------------------------------------------------------------------


def _answers_on_rank(fn: Callable, cases: list[tuple], answers_of: dict) -> tuple[list, list]:
    with noticing_calls(answers_of) as used:
        answers = [fn(*case) for case in cases]
    return answers, used


def _run_on_every_rank(
    fn: Callable, cases: list[tuple], cluster: Any, answers_of: dict | None = None, write: str = ""
) -> list:
    """The learner's answers (rank 0's), after checking every rank gave the same ones and none
    called a function of ``answers_of`` (the library's answer; ``write`` says what to write)."""
    replies = list(cluster.run(_answers_on_rank, fn, cases, answers_of or {}))
    for used in (u for _, u in replies if u):
        raise NotTheSkill(
            f"your function calls {used[0]}, which computes this answer for you; {write}"
        )
    per_rank = [answers for answers, _ in replies]
    for rank, answers in enumerate(per_rank[1:], start=1):
        if answers != per_rank[0]:
            raise AssertionError(
                f"rank {rank} answered {answers!r} but rank 0 answered {per_rank[0]!r}: every rank "
                "must derive the same answer from the same config (no randomness, no rank-dependence)"
            )
    return per_rank[0]


def _compare_numbers(
    what: str, labels: list[str], got: list, want: list[float], rel: float
) -> dict:
    for label, g, w in zip(labels, got, want, strict=True):
        if not isinstance(g, int | float) or not math.isclose(float(g), w, rel_tol=rel):
            raise AssertionError(f"{label}: {what} is {g!r}, expected {w:.6g} (within {rel:.0%})")
    return {label: f"{w:.4g}" for label, w in zip(labels, want, strict=True)}


@exercise("capstone.training_days", title="Requirements: days of training", world_size=2)
def grade_training_days(fn: Callable, cluster: Any) -> GradeResult:
    answers_of = {
        cost_training_days: "dtlab.cost.training_days",
        days_to_train: "dtlab.plan.days_to_train",
    }
    write = "write 6·N·D / (GPUs · peak FLOP/s · MFU), in days, yourself"
    got = _run_on_every_rank(fn, [(job,) for job in GRADED_JOBS], cluster, answers_of, write)
    want = [days_to_train(job) for job in GRADED_JOBS]
    details = _compare_numbers("training days", [j.name for j in GRADED_JOBS], got, want, 0.01)
    return GradeResult(
        True, "6·N·D / (GPUs · peak · MFU), converted to days, for every job.", details
    )


MEMORY_CASES = [
    (70e9, ParallelPlan(dp=2048, tp=1, pp=1, zero_stage=0)),
    (70e9, ParallelPlan(dp=2048, tp=1, pp=1, zero_stage=3)),
    (70e9, ParallelPlan(dp=32, tp=8, pp=8, zero_stage=1)),
    (70e9, ParallelPlan(dp=64, tp=8, pp=4, zero_stage=2)),
    (13e9, ParallelPlan(dp=32, tp=4, pp=2, zero_stage=1)),
    (34e9, ParallelPlan(dp=16, tp=4, pp=8, zero_stage=2)),  # not shown in the lab
    (7e9, ParallelPlan(dp=8, tp=2, pp=2, zero_stage=3)),  # not shown in the lab
]


@exercise("capstone.memory_per_gpu", title="Back of the envelope: memory per GPU", world_size=2)
def grade_memory_per_gpu(fn: Callable, cluster: Any) -> GradeResult:
    answers_of = {
        model_state_bytes: "dtlab.memory.model_state_bytes",
        fsdp2_state_bytes: "dtlab.memory.fsdp2_state_bytes",
        state_bytes_per_gpu: "dtlab.plan.state_bytes_per_gpu",
    }
    write = (
        "add up 2 + 2 + 12 bytes per parameter of the TP·PP shard, dividing what ZeRO shards by dp"
    )
    got = _run_on_every_rank(fn, MEMORY_CASES, cluster, answers_of, write)
    labels = [f"{p / 1e9:g}B {plan}" for p, plan in MEMORY_CASES]
    want = [state_bytes_per_gpu(p, plan) for p, plan in MEMORY_CASES]
    _compare_numbers("memory per GPU (bytes)", labels, got, want, 0.001)
    return GradeResult(
        True,
        "TP·PP split the 16 B/param of state; ZeRO then shards it over DP — right for every plan.",
        {label: f"{w / 1e9:.1f} GB" for label, w in zip(labels, want, strict=True)},
    )


@exercise("capstone.choose_plan", title="Parallelism plan that fits", world_size=2)
def grade_choose_plan(fn: Callable, cluster: Any) -> GradeResult:
    answers_of = {
        first_plan_that_fits: "dtlab.plan.first_plan_that_fits",
        candidate_plans: "dtlab.plan.candidate_plans",
    }
    write = "loop over tp, pp, ZeRO stage and interleaving yourself, in the expert's order"
    plans = _run_on_every_rank(fn, [(job,) for job in GRADED_JOBS], cluster, answers_of, write)
    details, wrong = {}, []
    for job, plan in zip(GRADED_JOBS, plans, strict=True):
        if not isinstance(plan, ParallelPlan):
            wrong.append(f"{job.name}: return a ParallelPlan, not {type(plan).__name__}")
            continue
        problems = plan_problems(job, plan)
        wrong += [f"{job.name}: {p}" for p in problems]
        if not problems:
            details[job.name] = (
                f"{plan} — {(state_bytes_per_gpu(job.params, plan) + activation_bytes_per_gpu(job, plan)) / 1e9:.1f}"
                f" GB/GPU, bubble {pipeline_bubble(job, plan):.1%}"
            )
    if wrong:
        raise AssertionError("\n".join(wrong))
    return GradeResult(
        True, "Every plan uses all GPUs, fits in memory and keeps the bubble small.", details
    )


def async_checkpoint_interval_for(req: Requirements) -> float:
    """The reference answer: ``max(sqrt(2·S·MTBF), W)`` with the stall ``S`` of every GPU copying
    its 12 B/param share to host memory over its PCIe link, ``W`` the background write."""
    stall = async_checkpoint_stall_s(
        req.params, req.n_gpus, gpu(req.gpu).host_link.bandwidth_bytes_per_s
    )
    write = sync_checkpoint_cost_s(req.params, req.storage_write_bytes_per_s)
    return async_checkpoint_interval_s(stall, write, req.per_gpu_mtbf_hours * 3600 / req.n_gpus)


@exercise(
    "capstone.checkpoint_interval", title="Failure handling: checkpoint interval", world_size=2
)
def grade_checkpoint_interval(fn: Callable, cluster: Any) -> GradeResult:
    answers_of = {
        young_daly_interval: "dtlab.cost.young_daly_interval",
        checkpoint_interval_s: "dtlab.plan.checkpoint_interval_s",
        async_checkpoint_interval_s: "dtlab.cost.checkpoint_cost.async_checkpoint_interval_s",
        async_checkpoint_stall_s: "dtlab.cost.checkpoint_cost.async_checkpoint_stall_s",
        async_checkpoint_interval_for: "dtlab.quiz.graders.capstone.async_checkpoint_interval_for",
    }
    write = "write max(sqrt(2 · stall seconds · cluster MTBF seconds), write seconds) yourself"
    jobs = (*GRADED_JOBS, SLOW_STORAGE_JOB)
    got = _run_on_every_rank(fn, [(job,) for job in jobs], cluster, answers_of, write)
    want = [async_checkpoint_interval_for(job) for job in jobs]
    synchronous = [checkpoint_interval_s(job) for job in jobs]
    if got and all(
        isinstance(g, (int, float)) and math.isclose(g, s, rel_tol=0.2)
        for g, s in zip(got, synchronous, strict=False)
    ):
        raise AssertionError(
            "these are synchronous intervals: with asynchronous saves training only stops for the "
            "copy to host memory, so the cost in Young/Daly is that stall, not the full write"
        )
    details = _compare_numbers("checkpoint interval (s)", [j.name for j in jobs], got, want, 0.01)
    return GradeResult(
        True, "max(sqrt(2 · stall · cluster MTBF), write time) for every job.", details
    )


# Crossover cases: (peak FLOP/s, bus bandwidth B/s, ranks, gradient bytes). The last two are
# never shown in the lab: an A100 node, and a two-rank FP32 reduction over one NIC.
CROSSOVER_CASES = (
    (989.4e12, 400e9, 128, 2),  # H100, 16 rail-optimised nodes, BF16 reduction
    (989.4e12, 50e9, 128, 2),  # the same with one NIC per node
    (989.4e12, 400e9, 128, 4),  # FP32 reduction
    (312e12, 300e9, 8, 2),  # A100 node, NVLink 3
    (989.4e12, 50e9, 2, 4),  # two ranks, FP32, one NIC
)


@exercise("capstone.dp_crossover", title="Compute vs communication: the DP crossover", world_size=2)
def grade_dp_crossover(fn: Callable, cluster: Any) -> GradeResult:
    answers_of = {
        dp_min_tokens_for: "dtlab.cost.crossover.dp_min_tokens_for",
        dp_min_tokens_per_gpu: "dtlab.cost.crossover.dp_min_tokens_per_gpu",
        critical_intensity: "dtlab.cost.crossover.critical_intensity",
    }
    write = "set backward's 4·P·T FLOPs against the ring's 2(N-1)/N·b·P bytes yourself"
    got = _run_on_every_rank(fn, list(CROSSOVER_CASES), cluster, answers_of, write)
    want = [dp_min_tokens_for(*case) for case in CROSSOVER_CASES]
    labels = [
        f"{c / 1e12:.0f} TFLOP/s, {b / 1e9:.0f} GB/s, {n} ranks, {g} B/grad"
        for c, b, n, g in CROSSOVER_CASES
    ]
    for label, g, w in zip(labels, got, want, strict=True):
        if isinstance(g, int | float) and math.isclose(float(g), w * 4 / 6, rel_tol=0.01):
            raise AssertionError(
                f"{label}: {g:.6g} is 2/3 of the threshold — the all-reduce overlaps *backward* "
                "(4·P·T FLOPs), not the whole step (6·P·T)"
            )
    details = _compare_numbers("minimum tokens per replica", labels, got, want, 0.01)
    return GradeResult(True, "2(N-1)/N · b · C / (4·B) for every case.", details)
