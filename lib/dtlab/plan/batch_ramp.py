"""A global batch that grows during training: each stage of the ramp runs the same layout.

Large runs start with a smaller batch and grow it: GPT-3's batch ramped up over its first
4–12B tokens (Brown et al. 2020, "Language Models are Few-Shot Learners", Appendix B), Llama 3
grew 4M → 8M → 16M tokens per step for training stability, lengthening its sequences 4,096 →
8,192 too (Dubey et al. 2024, Sec. 3.4.1; this module does not express a sequence change: the
sequence length stays the job's), DeepSeek-V3 3,072 → 15,360 sequences over its first 469B
tokens (DeepSeek-AI 2024, Sec. 4.2). Megatron-LM takes
``--rampup-batch-size start increment samples`` — its GPT-3 175B example script, merged in
January 2021, ramps 16 → 1,536 sequences in 95 steps of 16 over 5,859,375 samples.

:attr:`dtlab.plan.job.Requirements.batch_ramp` lists the stages before the final batch as
``(tokens trained at this batch, global batch in tokens)``; the job's ``global_batch_tokens``
is the last stage and takes the tokens left. The layout does not change along the ramp (a real
run does not reshard mid-training), only the micro-batches per pipeline, ``m = B/(dp·b)``: at
every stage a whole number (Megatron-LM's ``microbatches.py`` and ``training.py`` assert it),
and what the schedule needs (:func:`dtlab.plan.layout_cost.micro_batch_rule`: a multiple of
``pp`` interleaved, ``pp`` for ZB-H1, ``2·pp`` for DualPipe; plain 1F1B runs with fewer
micro-batches than stages, its bubble then most of the step) — :func:`ramp_problems`, which
:func:`dtlab.plan.plan_problems` adds for a ramped job. The planner still ranks a ramped job's
plans by their step at the final batch (:func:`dtlab.plan.step_time.fastest_plans`);
:func:`time_to_train_s` is the whole run's. Memory never grows (fewer micro-batches hold fewer activations), and the bubble
policy is held at the final batch, the one a job spends most of its tokens at. A smaller batch
costs time per token — fewer micro-batches to fill the pipeline, the once-a-step DP sync spread
over fewer tokens: :func:`ramp_step_times` prices each stage, :func:`time_to_train_s` adds the
stages up.
"""

from __future__ import annotations

from dataclasses import replace

from dtlab.plan.job import Requirements
from dtlab.plan.layout_cost import micro_batch_rule
from dtlab.plan.parallel_plan import ParallelPlan


def ramp_stages(req: Requirements) -> list[tuple[float, Requirements]]:
    """``(tokens, the job at that stage's batch)`` for each ramp stage, then the final batch
    with the tokens left (raises ``ValueError`` when the ramp is not a valid one)."""
    problems = ramp_shape_problems(req)
    if problems:
        raise ValueError("; ".join(problems))
    stages = [
        (tokens, replace(req, global_batch_tokens=batch, batch_ramp=()))
        for tokens, batch in req.batch_ramp
    ]
    left = req.tokens - sum(tokens for tokens, _ in req.batch_ramp)
    return [*stages, (left, replace(req, batch_ramp=()))]


def ramp_shape_problems(req: Requirements) -> list[str]:
    """What is wrong with the ramp itself ([] when nothing): batches of whole sequences,
    smaller than the final one, over a positive share of the job's tokens."""
    problems = []
    for tokens, batch in req.batch_ramp:
        if batch % req.seq_len or not 0 < batch < req.global_batch_tokens:
            problems.append(
                f"batch_ramp stage of {batch:,} tokens: use whole sequences of {req.seq_len} "
                f"tokens, fewer than the final batch of {req.global_batch_tokens:,}"
            )
        if tokens <= 0:
            problems.append(
                f"batch_ramp stage at batch {batch:,} trains {tokens:g} tokens; give > 0"
            )
    if sum(t for t, _ in req.batch_ramp) >= req.tokens:
        problems.append(
            f"the batch ramp's stages take {sum(t for t, _ in req.batch_ramp):.3g} of the job's "
            f"{req.tokens:.3g} tokens; leave some for the final batch"
        )
    return problems


def ramp_problems(req: Requirements, plan: ParallelPlan) -> list[str]:
    """Every ramp stage where ``plan``'s layout cannot split the batch into its micro-batches."""
    problems = ramp_shape_problems(req)
    if problems:
        return problems
    fewest, multiple, why = micro_batch_rule(plan, filled=False)
    for _, batch in req.batch_ramp:
        sequences = batch // req.seq_len
        m = sequences / (plan.dp * plan.micro_batch_size)
        where = f"during the batch ramp at {sequences:,} sequences per step"
        if m != int(m) or m < 1:
            problems.append(
                f"{where}, dp {plan.dp} × micro-batch {plan.micro_batch_size} gives {m:g} "
                "micro-batches; need a whole number >= 1 at every stage (change the ramp's "
                "batches, dp or the micro-batch size)"
            )
        elif m < fewest or int(m) % multiple:
            problems.append(
                f"{where}, {m:g} micro-batches per pipeline: {why} (need >= {fewest}, a "
                f"multiple of {multiple}; ramp in larger steps, or use plain 1F1B, which runs "
                "fewer micro-batches than stages)"
            )
    return problems


def ramp_step_times(req: Requirements, plan: ParallelPlan) -> list[tuple[float, float]]:
    """``(tokens, seconds per step)`` of each stage, the final batch last."""
    from dtlab.plan.step_time import step_time  # step_time imports the checks that import us

    problems = ramp_problems(req, plan)
    if problems:
        raise ValueError("the plan cannot run the batch ramp: " + "; ".join(problems))
    return [(tokens, step_time(job, plan).step_s) for tokens, job in ramp_stages(req)]


def time_to_train_s(req: Requirements, plan: ParallelPlan) -> float:
    """Seconds to train all of the job's tokens with ``plan``: each stage's steps
    (``tokens / batch``) at that stage's step time, the ramp included."""
    return sum(
        tokens / job.global_batch_tokens * step
        for (tokens, job), (_, step) in zip(
            ramp_stages(req), ramp_step_times(req, plan), strict=True
        )
    )


def ramp_overhead(req: Requirements, plan: ParallelPlan) -> float:
    """:func:`time_to_train_s` over the same tokens all at the final batch (1.0: free)."""
    steady = replace(req, batch_ramp=())
    return time_to_train_s(req, plan) / time_to_train_s(steady, plan)
