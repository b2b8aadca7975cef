"""The bubble of the pipeline step the ranks actually ran: on a logical clock, and on the wall
clock.

:class:`~dtlab.parallel.pipeline.execute.PipelineExecutor` records one span per action it runs,
named like the action (``"1F3"`` compute, ``"1RECV_F3"`` / ``"0SEND_B2"`` comm), on each rank's
timeline. :func:`executed_schedule` reads back, per pipeline rank, the order in which its
forwards, backwards, sends and receives really ran — the receives named by the message they
consumed — into a :class:`~dtlab.parallel.pipeline.actions.Schedule`, checking it is one whole
step (every stage's forward and backward of every micro-batch, once). :func:`executed_bubble`
replays that order with the real cross-rank dependencies — a send and its receive meet
(blocking point to point, as the executor's messages are) and messages between two ranks match in
the order they were posted — on a **logical clock**: forward 1, backward 2 (``Costs()``; the usual
rule of thumb, and the bubble formula holds for any ratio when stages cost the same), messages 0.
The idle share is ``1 − busy / (p · makespan)``, the convention of
:func:`dtlab.cost.bubble.bubble_fraction_of_total` = ``(p−1)/(m+p−1)`` for GPipe and 1F1B
(Huang et al. 2019; Narayanan et al. 2021, §2.2).

Why a logical clock: tests never assert timings (a loaded machine stretches any span), but the
*order* the ranks ran is a fact of the run, and replaying it says whether the executed schedule
has the bubble the planner predicts. :func:`wall_clock_bubble` gives the same share from the
spans' timestamps — a benchmark's figure, to print beside it, never to assert.
"""

from __future__ import annotations

from collections.abc import Sequence

from dtlab.parallel.pipeline.actions import Action, Schedule, build, loop_stage_ranks
from dtlab.parallel.pipeline.replay import Costs, replay
from dtlab.parallel.pipeline.simulate import Simulation, measured_bubble
from dtlab.trace import Trace


def _action(name: str) -> Action | None:
    try:
        return Action.parse(name)
    except ValueError:
        return None  # another span (a TP all-reduce, a wait): not a pipeline action


def executed_schedule(trace: Trace, ranks: Sequence[int], n_micro: int) -> Schedule:
    """The order one pipeline ran, from ``trace``: ``ranks`` are its global ranks in pipeline
    order (stage ``k`` on ``ranks[k]``: one stage per rank). Raises if the trace is not one
    whole step of ``len(ranks)`` stages and ``n_micro`` micro-batches."""
    per_rank: list[list[Action]] = []
    for pp_rank, rank in enumerate(ranks):
        spans = sorted(trace.filter(rank=rank).spans, key=lambda s: (s.start_ns, s.end_ns))
        actions = [a for a in (_action(s.name) for s in spans) if a is not None]
        computed = sorted((a.micro_batch, a.kind) for a in actions if a.is_compute)
        expected = sorted((mb, kind) for mb in range(n_micro) for kind in ("F", "B"))
        if computed != expected or any(a.stage != pp_rank for a in actions):
            raise ValueError(
                f"rank {rank} (pipeline rank {pp_rank}) ran {[str(a) for a in actions]}: not one "
                f"forward and one backward of each of m={n_micro} micro-batches on stage "
                f"{pp_rank}; pass the ranks of one pipeline in stage order and one step's trace"
            )
        per_rank.append(actions)
    return build("executed", n_micro, loop_stage_ranks(len(ranks)), per_rank)


def executed_bubble(
    trace: Trace, ranks: Sequence[int], n_micro: int, costs: Costs | None = None
) -> Simulation:
    """Replay the executed order (:func:`executed_schedule`) on the logical clock ``costs``
    (default forward 1, backward 2, messages 0); ``.bubble_fraction_of_total`` is the idle share
    ``1 − busy/(p·makespan)``. A deadlock or a mismatched message raises ``ScheduleError``."""
    schedule = executed_schedule(trace, ranks, n_micro)
    costs = costs or Costs()
    timeline = replay(schedule, costs)
    return Simulation(schedule, costs, tuple(tuple(rank) for rank in timeline))


def wall_clock_bubble(trace: Trace, ranks: Sequence[int]) -> float:
    """The idle share measured from the spans' timestamps (first compute start to last compute
    end, minus each rank's compute time): information for a report, never a test's assertion."""
    return measured_bubble(trace.filter(rank=list(ranks)))["bubble_fraction_of_total"]
