"""What the job's training software can do: a policy the planner searches inside.

A published run is judged against the plans its own software could have launched, the way an
interviewer who says "you have Megatron-LM of 2021" expects: a 2021 layout with full
recomputation is not a poor choice because a 2022 paper later made selective recomputation
possible. :class:`Software` names the techniques a framework offers;
:attr:`dtlab.plan.job.Requirements.software` picks one of :data:`SOFTWARE` (default
``"current"``: everything this planner prices). :func:`dtlab.plan.search.candidate_plans`
proposes only what the software offers, and :func:`dtlab.plan.plan_problems` refuses a plan
that uses anything else, naming the technique and the software.

The presets, and the sources that date them:

* ``"current"`` — every technique: sequence parallelism, selective recomputation, context
  parallelism, ZB-H1 and DualPipe schedules, asynchronous TP, per-layer (FSDP-style) ZeRO-3.
* ``"megatron-lm-2022"`` — Korthikanti et al. 2022 ("Reducing Activation Recomputation in
  Large Transformer Models"): sequence parallelism and selective recomputation join Megatron-LM
  (its ``--sequence-parallel`` and ``--recompute-granularity`` arrived in April–May 2022), and
  the distributed optimizer, ZeRO-1 (March 2022, ``megatron/optimizer/distrib_optimizer.py``);
  still no ZeRO-3, no context parallelism (Megatron-Core, 2023), no zero-bubble schedules (Qi
  et al. 2023), no DualPipe (DeepSeek-AI 2024), no asynchronous TP.
* ``"megatron-lm-2021"`` — the two systems Narayanan et al. 2021 ("Efficient Large-Scale
  Language Model Training on GPU Clusters Using Megatron-LM") ran: Megatron-LM's PTD-P — TP
  without sequence parallelism (every TP rank keeps the LayerNorm and dropout activations of
  the whole sequence), recomputation of whole layers or none (Sec. 3.5), 1F1B and interleaved
  1F1B, plain data parallelism (ZeRO-0: no distributed optimizer yet) — and, as its Table 2's
  baseline, DeepSpeed's ZeRO-3 of that year: one list collective per parameter tensor
  (:mod:`dtlab.plan.zero3_per_parameter`, DeepSpeed v0.3.x), without a pipeline (DeepSpeed's
  pipeline engine refuses ZeRO-2 and 3). Its 1F1B schedules kept every in-flight
  micro-batch's stage output until that micro-batch's backward (freed after the send from
  December 2021: :func:`dtlab.plan.layout_cost.held_stage_outputs_by_device`).

The dates are those of the commits in NVIDIA/Megatron-LM's history.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.plan.parallel_plan import RECOMPUTE, SCHEDULES, ZERO3_COLLECTIVES, ParallelPlan


@dataclass(frozen=True)
class Software:
    """The techniques a training framework offers the planner."""

    name: str
    sequence_parallel: bool
    recompute: tuple[str, ...]  # in the search's order of preference
    context_parallel: bool
    schedules: tuple[str, ...]
    zero3_collectives: tuple[str, ...]  # the first is the one the search proposes
    async_tp: bool
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    pipeline_zero_stages: tuple[int, ...] = (0, 1, 2, 3)  # the stages it runs with pp > 1
    keeps_stage_outputs: bool = False  # each in-flight micro-batch's stage output held (2021)

    def problems(self, plan: ParallelPlan) -> list[str]:
        """Each technique ``plan`` uses that this software lacks ([] when none; a choice that
        exists nowhere is :func:`dtlab.plan.plan_problems`' to name)."""
        lacks = []
        if plan.sequence_parallel and not self.sequence_parallel:
            lacks.append(("sequence parallelism", "set sequence_parallel=False"))
        if plan.recompute in RECOMPUTE and plan.recompute not in self.recompute:
            lacks.append((f"recompute={plan.recompute!r}", f"choose one of {self.recompute}"))
        if plan.cp > 1 and not self.context_parallel:
            lacks.append((f"context parallelism (cp={plan.cp})", "set cp=1"))
        if plan.schedule in SCHEDULES and plan.schedule not in self.schedules:
            lacks.append((f"the {plan.schedule!r} schedule", f"choose one of {self.schedules}"))
        flavour = plan.zero3_collectives
        if (
            plan.zero_stage == 3
            and flavour in ZERO3_COLLECTIVES
            and flavour not in self.zero3_collectives
        ):
            lacks.append(
                (
                    f"zero3_collectives={plan.zero3_collectives!r}",
                    f"choose one of {self.zero3_collectives}",
                )
            )
        if plan.zero_stage in (0, 1, 2, 3) and plan.zero_stage not in self.zero_stages:
            lacks.append((f"ZeRO-{plan.zero_stage}", f"choose zero_stage from {self.zero_stages}"))
        elif plan.pp > 1 and plan.zero_stage not in self.pipeline_zero_stages:
            lacks.append(
                (
                    f"ZeRO-{plan.zero_stage} with a pipeline",
                    f"set pp=1 or zero_stage from {self.pipeline_zero_stages}",
                )
            )
        if plan.async_tp and not self.async_tp:
            lacks.append(("asynchronous TP", "set async_tp=False"))
        return [
            f"the job's software ({self.name!r}) has no {what}: {fix}, or give the job newer "
            f"software (Requirements.software, one of {tuple(SOFTWARE)})"
            for what, fix in lacks
        ]


SOFTWARE: dict[str, Software] = {
    "current": Software("current", True, ("selective", "full", "none"), True, SCHEDULES,
                        ZERO3_COLLECTIVES, True),
    "megatron-lm-2022": Software("megatron-lm-2022", True, ("selective", "full", "none"), False,
                                 ("1f1b",), ZERO3_COLLECTIVES, False, (0, 1), (0, 1)),
    "megatron-lm-2021": Software("megatron-lm-2021", False, ("full", "none"), False, ("1f1b",),
                                 ("per_parameter",), False, (0, 3), (0,), True),
}  # fmt: skip
"""The presets (module docstring), by the name :attr:`Requirements.software` takes."""


def software_problems(name: str) -> list[str]:
    """[] when ``name`` is a preset of :data:`SOFTWARE`, else the message that lists them."""
    if name in SOFTWARE:
        return []
    return [f"software={name!r} is not a preset; use one of {tuple(SOFTWARE)}"]


def software_of(job) -> Software:
    """The :class:`Software` of ``job`` (a :class:`~dtlab.plan.job.Requirements`)."""
    problems = software_problems(job.software)
    if problems:
        raise ValueError(problems[0])
    return SOFTWARE[job.software]
