"""A published training run as the planner sees it, and the planner held against it.

A :class:`PublishedRun` is one row of a paper: the job (model shapes, batch, hardware, and the
paper's own **policy** — how much HBM it planned into and how large a bubble it accepted), the
layout it ran, and the throughput it reported, under the paper's own FLOP convention (one
function each here: :func:`causal_flops_per_step`, :func:`megatron_flops_per_step`,
:func:`korthikanti_model_flops`). :func:`compare` prices the layout and every plan the planner
would try for the same job (:class:`PlannerVsPublished`) — the plans the job's own software
offers (:mod:`dtlab.plan.software`: a 2021 layout against what Megatron-LM could run in 2021;
:meth:`PlannerVsPublished.rank_fraction_with` ranks it against later software too). A
**baseline** row is one its paper ran to be beaten (ZeRO-3 in Narayanan et al.'s Table 2, full
recomputation in Korthikanti et al.'s Table 5): its step is held to the same ±15 %, but the
rank goal (the fastest quarter) is the chosen layouts'. The rows themselves are in
:mod:`dtlab.plan.published` and :mod:`dtlab.plan.published_selective`.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, replace

from dtlab.cost import gpu
from dtlab.plan.job import Requirements
from dtlab.plan.parallel_plan import ParallelPlan
from dtlab.plan.step_time import StepTime


@dataclass(frozen=True)
class PublishedRun:
    """One published row: the job, its layout, and the throughput the paper reports."""

    name: str
    source: str
    job: Requirements
    plan: ParallelPlan
    tflops_per_gpu: float  # as the paper reports it, under its own FLOP convention
    flops_per_step: float  # the paper's FLOP convention, whole step, all GPUs
    baseline: bool = False  # a row the paper ran to be beaten, not the layout it chose

    @property
    def step_s(self) -> float:
        """Published step time: the paper's FLOPs over ``GPUs × reported FLOP/s``."""
        return self.flops_per_step / (self.job.n_gpus * self.tflops_per_gpu * 1e12)

    @property
    def mfu_6n(self) -> float:
        """Published step as MFU on ``6N`` (active parameters) and the dense BF16 peak."""
        peak = gpu(self.job.gpu).bf16_dense_flops * self.job.n_gpus
        return 6 * self.job.active_params * self.job.global_batch_tokens / (peak * self.step_s)

    @property
    def mfu_attention(self) -> float:
        """Published step as MFU on ``6N + 6·L·s·w`` (causal attention)."""
        from dtlab.plan.compute import attention_flops_per_token

        peak = gpu(self.job.gpu).bf16_dense_flops * self.job.n_gpus
        flops = (6 * self.job.active_params + attention_flops_per_token(self.job)) * (
            self.job.global_batch_tokens
        )
        return flops / (peak * self.step_s)


def causal_flops_per_step(job: Requirements) -> float:
    """``(6N + 6·L·s·w) · tokens``: the convention this module reads Llama 3's figures in."""
    from dtlab.plan.compute import attention_flops_per_token

    return (6 * job.active_params + attention_flops_per_token(job)) * job.global_batch_tokens


def _gpt_shape(job: Requirements) -> tuple[int, int, int, int, int]:
    """``(B, s, L, h, V)``: sequences per step, sequence, layers, width, vocabulary."""
    return (
        job.global_batch_sequences,
        job.seq_len,
        job.n_layers,
        job.d_model,
        job.vocab_size,
    )


def megatron_flops_per_step(job: Requirements) -> float:
    """Narayanan et al. 2021's count: ``96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))``."""
    b, s, layers, h, v = _gpt_shape(job)
    return 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def korthikanti_model_flops(job: Requirements) -> float:
    """Korthikanti et al. 2022's model FLOPs per step (Appendix A, Eq. 7):
    ``72·B·L·s·h²·(1 + s/(6h) + V/(12·h·L))`` — the whole (not causal) attention square and the logits
    counted, recomputation not (their MFU's numerator)."""
    b, s, layers, h, v = _gpt_shape(job)
    return 72 * b * layers * s * h * h * (1 + s / (6 * h) + v / (12 * h * layers))


@dataclass(frozen=True)
class PlannerVsPublished:
    """One published run against the planner: acceptance, step, rank, best plan's claim."""

    run: PublishedRun
    problems: tuple[str, ...]  # [] when the published layout passes under the paper's policy
    predicted: StepTime
    passing_steps: tuple[float, ...]  # the planner's own passing plans, fastest first
    best_plan: ParallelPlan
    best: StepTime

    @property
    def step_ratio(self) -> float:
        """Predicted over published step time (1.0 exact; within 0.85–1.15 is the goal)."""
        return self.predicted.step_s / self.run.step_s

    @property
    def rank(self) -> int:
        """How many of the planner's passing plans are faster than the published layout."""
        return bisect.bisect_left(self.passing_steps, self.predicted.step_s)

    @property
    def rank_fraction(self) -> float:
        """:attr:`rank` as a share of the passing plans (under 0.25: the fastest quarter)."""
        return share_faster(self.passing_steps, self.predicted.step_s)

    def rank_fraction_with(self, software: str) -> float:
        """:attr:`rank_fraction` among the plans ``software`` would offer the same job (e.g.
        ``"current"``: how a 2021 layout fares against what came after it)."""
        timed = passing_plans_timed(replace(self.run.job, software=software))
        return share_faster([t.step_s for t, _ in timed], self.predicted.step_s)

    @property
    def best_mfu_ratio(self) -> float:
        """The planner's best plan's 6N MFU over the published 6N MFU."""
        return self.best.mfu / self.run.mfu_6n


def share_faster(steps, step_s: float) -> float:
    """The share of ``steps`` (sorted, fastest first) faster than ``step_s``."""
    return bisect.bisect_left(steps, step_s) / max(1, len(steps))


@functools.lru_cache(maxsize=32)
def passing_plans_timed(job: Requirements) -> tuple[tuple[StepTime, ParallelPlan], ...]:
    """Every plan the planner would try for ``job`` that passes its checks, timed, fastest
    first — kept per job, since several published rows share one (a paper's layouts of the
    same job: PTD-P and ZeRO-3, full and selective recomputation)."""
    from dtlab.plan.problems import plan_problems
    from dtlab.plan.search import candidate_plans
    from dtlab.plan.step_time import step_time

    return tuple(
        sorted(
            ((step_time(job, p), p) for p in candidate_plans(job) if not plan_problems(job, p)),
            key=lambda pair: pair[0].step_s,
        )
    )


def compare(run: PublishedRun) -> PlannerVsPublished:
    """Price ``run``'s layout, and every plan the planner would try for its job."""
    from dtlab.plan.problems import plan_problems
    from dtlab.plan.step_time import step_time

    timed = passing_plans_timed(run.job)
    best, best_plan = timed[0] if timed else (step_time(run.job, run.plan), run.plan)
    return PlannerVsPublished(
        run,
        tuple(plan_problems(run.job, run.plan)),
        step_time(run.job, run.plan),
        tuple(t.step_s for t, _ in timed),
        best_plan,
        best,
    )
