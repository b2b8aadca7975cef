"""The bubble of the pipeline step the ranks actually ran: on a logical clock, and on the wall
clock.

:class:`~dtlab.parallel.pipeline.execute.PipelineExecutor` records one span per action it runs,
named like the action (``"1F3"``, ``"0I2"``, ``"0W2"`` compute, ``"1RECV_F3"`` / ``"0SEND_B2"``
comm), on each rank's timeline. :func:`executed_schedule` reads back, per pipeline rank, the
order in which its forwards, backwards, sends and receives really ran — the receives named by the
message they consumed — into a :class:`~dtlab.parallel.pipeline.actions.Schedule`, and which
stages each rank held: one (GPipe, 1F1B, ZB-H1), ``v`` in a loop (interleaved 1F1B) or two in a
V (DualPipeV, whose overlapped F&B pairs the executor runs as an F span then a B span). It checks
the trace is one whole step: every stage's forward of every micro-batch once, and its backward
once — whole (B) or split (I, then W: Qi et al. 2023). :func:`executed_bubble` replays that
order with the real cross-rank dependencies — a send and its receive meet (blocking point to
point, as the executor's messages are) and messages between two ranks match in the order they
were posted — on a **logical clock**: forward 1, I 1, W 1, so a whole backward 2 (``Costs()``; the
usual rule of thumb, and the bubble formula holds for any ratio when stages cost the same),
messages 0. The idle share is ``1 − busy / (p · makespan)``, the convention of
:func:`dtlab.cost.bubble.bubble_fraction_of_total` = ``(p−1)/(m+p−1)`` for GPipe and 1F1B
(Huang et al. 2019; Narayanan et al. 2021, §2.2).

What to compare it with: :func:`~dtlab.parallel.pipeline.simulate.simulate` of the planned
schedule gives the idealised bubble (messages free and non-blocking); for GPipe, 1F1B,
interleaved 1F1B and ZB-H1 the executed order replays to the same value (p = 2, 4; m = 4, 8).
DualPipeV's does not: with blocking messages, placed by
:func:`~dtlab.parallel.pipeline.communication.with_communication`, its ranks wait for each other
in the steady state — 7.7 % against the ideal 4.0 % for p = 2, m = 4; 11.1 % against 2.0 % for
p = 2, m = 8 — and ``simulate(with_communication(schedule))`` predicts exactly what is executed.

Why a logical clock: tests never assert timings (a loaded machine stretches any span), but the
*order* the ranks ran is a fact of the run, and replaying it says whether the executed schedule
has the bubble the planner predicts. :func:`wall_clock_bubble` gives the same share from the
spans' timestamps — a benchmark's figure, to print beside it, never to assert.
"""

from __future__ import annotations

from collections.abc import Sequence

from dtlab.parallel.pipeline.actions import (
    Action,
    Schedule,
    build,
    loop_stage_ranks,
    v_stage_ranks,
)
from dtlab.parallel.pipeline.replay import Costs, replay
from dtlab.parallel.pipeline.simulate import Simulation, measured_bubble
from dtlab.trace import Trace


def _action(name: str) -> Action | None:
    try:
        return Action.parse(name)
    except ValueError:
        return None  # another span (a TP all-reduce, a wait): not a pipeline action


def executed_schedule(trace: Trace, ranks: Sequence[int], n_micro: int) -> Schedule:
    """The order one pipeline ran, from ``trace``: ``ranks[k]`` is the global rank of pipeline
    rank ``k``. Which stages each rank holds is read from the trace and must be one of the
    executor's placements: a loop (stage ``s`` on ``s % p``: 1F1B, GPipe, ZB-H1, interleaved with
    ``v`` stages per rank) or a V (stages ``r`` and ``2p-1-r``: DualPipeV). Raises if the trace is
    not one whole step: every stage's forward of every one of ``n_micro`` micro-batches once, and
    its backward once — whole (B) or split into input and weight gradients (I and W)."""
    per_rank: list[list[Action]] = []
    holder: dict[int, int] = {}  # stage -> the pipeline rank that ran it
    for pp_rank, rank in enumerate(ranks):
        spans = sorted(trace.filter(rank=rank).spans, key=lambda s: (s.start_ns, s.end_ns))
        actions = [a for a in (_action(s.name) for s in spans) if a is not None]
        for stage in sorted({a.stage for a in actions if a.is_compute}):
            if holder.setdefault(stage, pp_rank) != pp_rank:
                raise ValueError(
                    f"stage {stage} ran on pipeline ranks {holder[stage]} and {pp_rank}: pass the "
                    f"ranks of one pipeline, and one step's trace"
                )
            _check_whole_step(rank, pp_rank, stage, actions, n_micro)
        per_rank.append(actions)
    stage_ranks = tuple(holder.get(s, -1) for s in range(max(holder, default=-1) + 1))
    p, n_stages = len(ranks), len(stage_ranks)
    placements = [v_stage_ranks(p)] if n_stages == 2 * p else []
    placements += [loop_stage_ranks(p, n_stages // p)] if n_stages % p == 0 else []
    if n_stages == 0 or stage_ranks not in placements:
        ran = {r: sorted(s for s, k in holder.items() if k == r) for r in range(p)}
        raise ValueError(
            f"the pipeline ranks ran stages {ran}: not a loop (stage s on s % {p}) nor a V of "
            f"{p} ranks; pass the ranks of one pipeline in stage order and one step's trace"
        )
    return build("executed", n_micro, stage_ranks, per_rank)


def _check_whole_step(
    rank: int, pp_rank: int, stage: int, actions: list[Action], n_micro: int
) -> None:
    """Each micro-batch of ``stage`` ran F once and then B, or I and W, once."""
    ran: dict[int, list[str]] = {}
    for a in actions:
        if a.is_compute and a.stage == stage:
            ran.setdefault(a.micro_batch, []).append(a.kind)
    whole = sorted(ran) == list(range(n_micro)) and all(
        sorted(kinds) in (["B", "F"], ["F", "I", "W"]) for kinds in ran.values()
    )
    if not whole:
        shown = [str(a) for a in actions if a.is_compute and a.stage == stage]
        raise ValueError(
            f"rank {rank} (pipeline rank {pp_rank}) ran {shown} of stage {stage}: not one "
            f"forward and one backward (B, or I and W) of each of m={n_micro} micro-batches; "
            f"pass the ranks of one pipeline in stage order and one step's trace"
        )


def executed_bubble(
    trace: Trace, ranks: Sequence[int], n_micro: int, costs: Costs | None = None
) -> Simulation:
    """Replay the executed order (:func:`executed_schedule`) on the logical clock ``costs``
    (default forward 1, I 1, W 1, so a whole backward B 2; messages 0);
    ``.bubble_fraction_of_total`` is the idle share ``1 − busy/(p·makespan)`` and
    ``.idle(rank) / .makespan`` one rank's. A deadlock or a mismatched message raises
    ``ScheduleError``."""
    schedule = executed_schedule(trace, ranks, n_micro)
    costs = costs or Costs()
    timeline = replay(schedule, costs)
    return Simulation(schedule, costs, tuple(tuple(rank) for rank in timeline))


def wall_clock_bubble(trace: Trace, ranks: Sequence[int]) -> float:
    """The idle share measured from the spans' timestamps (first compute start to last compute
    end, minus each rank's compute time): information for a report, never a test's assertion."""
    return measured_bubble(trace.filter(rank=list(ranks)))["bubble_fraction_of_total"]
