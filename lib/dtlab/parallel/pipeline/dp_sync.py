"""Data-parallel gradient sync under pipelining: how much of it each stage can hide, from a schedule.

With pipeline × data parallelism every stage's weight gradients are all-reduced over its
data-parallel group once per step. A stage's gradients are final after its **last** gradient
action — its last B, or its last W when the backward is split — and the step ends when the
pipeline's last action ends (on the first stage, for 1F1B). The time between the two is the
stage's **slack**: a reduction started then hides under the backwards the other stages still
run. What is left sticks out past the pipeline and is **exposed**:

* **1F1B / GPipe** (one stage per rank, F/B costs equal across stages, free messages): the last
  micro-batch's backward walks from stage ``p-1`` down to stage 0, so stage ``s`` finishes
  ``s`` backward slots before the end: slack ``s·t_B``. Stage 0 has none and exposes its whole
  reduction; the last stage hides up to ``(p-1)·t_B``. (This follows from the schedule alone;
  :func:`dp_slack` reads it off the simulated timeline rather than assuming it.)
* **interleaved 1F1B** (``v`` chunks per rank, each ``1/v`` of a stage): stage ``s`` finishes
  ``s`` chunk-backwards before the end (slack ``s·t_B/v``), so rank ``r``'s later chunks finish
  early — chunk ``v-1`` long before chunk 0. Starting each chunk's reduction **per stage**, as
  soon as that stage is done (``per_stage=True``; where torch's ``REDUCE_GRAD`` action runs),
  hides those; starting all of them after the rank's last backward hides only ``r·t_B/v``.
  Megatron's ``overlap_grad_reduce`` starts earlier still: it syncs only on each chunk's last
  micro-batch and launches bucket by bucket inside that backward, so a stage's last backward
  also hides part of its own reduction (not modelled here).
* **zero-bubble schedules** move W's into the drain, where 1F1B left the bubble: under ZB-H1
  every stage's last W ends with the step (slack 0 everywhere), and under interleaved zero
  bubble every chunk-0 stage's does — the bubble they remove was time that hid the sync.
  ZB-V turns the staircase around: the last rank's up-chunk W ends the step, so rank ``p-1``
  exposes the most and rank 0 the least (its stages' last W's end at least ``p-1`` chunk
  actions before the step does; ``tests/test_overlap_dp_sync.py``).

On one rank the reductions share one link: they run one after another, in the order their
stages finish, each starting at ``max(its stage's end, the previous reduction's end)``.
:func:`exposed_dp_sync` returns, per rank, how far its last reduction ends past the pipeline's
last action (never negative). ``tests/test_overlap_dp_sync.py`` holds these against runs on a
PP × DP cluster (:mod:`~dtlab.parallel.pipeline.dp_sync_run`).
"""

from __future__ import annotations

from collections.abc import Mapping

from dtlab.parallel.pipeline.actions import Schedule
from dtlab.parallel.pipeline.replay import Costs
from dtlab.parallel.pipeline.simulate import Simulation, simulate


def gradients_done(sim: Simulation) -> dict[int, float]:
    """``{stage: time its last B or W ends}``: when the stage's weight gradients are final."""
    done: dict[int, float] = {}
    for rank in sim.timeline:
        for t in rank:
            if t.action.kind in ("B", "W"):
                done[t.action.stage] = max(done.get(t.action.stage, 0.0), t.end)
    return done


def dp_slack(schedule: Schedule, costs: Costs | None = None) -> dict[int, float]:
    """``{stage: time from its gradients being final to the end of the pipeline step}``."""
    sim = simulate(schedule, costs)
    end = sim.makespan
    return {stage: end - t for stage, t in sorted(gradients_done(sim).items())}


def exposed_dp_sync(
    schedule: Schedule,
    costs: Costs | None,
    reduce_time: float | Mapping[int, float],
    *,
    per_stage: bool = True,
) -> dict[int, float]:
    """``{rank: time its data-parallel reductions run past the pipeline's last action}``.

    ``reduce_time`` is one stage's all-reduce time (or ``{stage: time}``). ``per_stage=True``
    starts each stage's reduction when that stage's gradients are final; ``False`` starts them
    all when the rank's last gradient action ends (``pipe.step()`` then reduce: a plain loop)."""
    sim = simulate(schedule, costs)
    done, end = gradients_done(sim), sim.makespan
    exposed = {}
    for rank in range(schedule.n_ranks):
        stages = sorted(schedule.stages_of(rank), key=lambda s: done[s])
        last = max(done[s] for s in stages)
        link_free = 0.0
        for stage in stages:
            took = reduce_time[stage] if isinstance(reduce_time, Mapping) else reduce_time
            start = max(done[stage] if per_stage else last, link_free)
            link_free = start + took
        exposed[rank] = max(0.0, link_free - end)
    return exposed


def slack_in_backward_slots(schedule: Schedule, costs: Costs | None = None) -> dict[int, float]:
    """:func:`dp_slack` per stage in units of one full backward of one stage (``t_I + t_W``
    of ``costs``): 1F1B's stage ``s`` has ``s``."""
    costs = costs or Costs()
    slot = costs.backward_input + costs.backward_weight
    return {s: slack / slot for s, slack in dp_slack(schedule, costs).items()}


def exposed_per_stage(
    schedule: Schedule, costs: Costs | None, reduce_time: float
) -> dict[int, float]:
    """``{stage: max(0, reduce_time - its slack)}``: what each stage's all-reduce, started the
    moment its gradients are final, leaves exposed — each stage on a link of its own (with one
    stage per rank, as in 1F1B, that is each rank's exposed sync)."""
    return {s: max(0.0, reduce_time - slack) for s, slack in dp_slack(schedule, costs).items()}
