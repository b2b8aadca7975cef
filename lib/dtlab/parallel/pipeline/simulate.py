"""Predict a schedule's timeline, bubble and activation memory from per-action costs.

``simulate(schedule, Costs(forward=1, backward_input=1, backward_weight=1, p2p=0))`` places every
action in time (:mod:`~dtlab.parallel.pipeline.replay`) and reports:

* the per-rank **timeline**, as dtlab trace spans (``simulation.trace()``), so
  ``dtlab.viz.timeline`` draws the prediction exactly as it draws a run on the cluster;
* the **bubble** — time a rank is not computing — in both conventions, named as in
  :mod:`dtlab.cost.bubble`:

  - ``bubble_fraction_of_total`` = idle / (idle + busy): ``(p-1)/(m+p-1)`` for GPipe and 1F1B;
  - ``bubble_ratio_to_ideal`` = idle / busy: ``(p-1)/m`` (Megatron-LM's convention);

  both summed over ranks, so they equal the formulas when every stage costs the same;
* **activations in flight** per stage over time: a micro-batch's activations are held from the
  start of its forward until its last backward action ends (B, or W when split) — GPipe's first
  stage holds all ``m``, 1F1B's at most ``p``.

A schedule with written-out sends and receives is simulated as blocking rendezvous messages,
which is how :class:`~dtlab.parallel.pipeline.execute.PipelineExecutor` runs it on real ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.parallel.pipeline.actions import Schedule
from dtlab.parallel.pipeline.replay import Costs, Timed, replay
from dtlab.parallel.pipeline.validate import validate
from dtlab.trace import Span, Trace

NS_PER_UNIT = 1_000_000  # one cost unit is drawn as one millisecond


@dataclass(frozen=True)
class Simulation:
    """A simulated pipeline step (see the module docstring)."""

    schedule: Schedule
    costs: Costs
    timeline: tuple[tuple[Timed, ...], ...]  # per rank, in order

    @property
    def makespan(self) -> float:
        """Time from the first action's start to the last one's end."""
        return max((t.end for rank in self.timeline for t in rank), default=0.0)

    def busy(self, rank: int) -> float:
        """Time ``rank`` spends computing (F, B, I, W)."""
        return sum(t.end - t.start for t in self.timeline[rank] if t.action.is_compute)

    def idle(self, rank: int) -> float:
        """Time ``rank`` does not compute during the step: waiting, or sending and receiving."""
        return self.makespan - self.busy(rank)

    @property
    def bubble_fraction_of_total(self) -> float:
        """idle / total: the share of the ranks' time spent not computing."""
        idle = sum(self.idle(r) for r in range(self.schedule.n_ranks))
        return idle / (self.makespan * self.schedule.n_ranks)

    @property
    def bubble_ratio_to_ideal(self) -> float:
        """idle / ideal: how much longer than a bubble-free step the step takes."""
        idle = sum(self.idle(r) for r in range(self.schedule.n_ranks))
        return idle / sum(self.busy(r) for r in range(self.schedule.n_ranks))

    def in_flight(self, stage: int) -> list[tuple[float, int]]:
        """``[(time, micro-batches whose activations stage holds from then on), ...]``."""
        return self._held(self.schedule.stage_ranks[stage], {stage})

    def rank_in_flight(self, rank: int) -> list[tuple[float, int]]:
        """``[(time, (stage, micro-batch) pairs whose activations rank holds), ...]``, over all
        the stages it holds at once: with ``v`` chunks per rank each pair is ``1/v`` of the
        rank's layers, so ``peak / v`` is the peak in whole-stage micro-batches."""
        return self._held(rank, set(self.schedule.stages_of(rank)))

    def peak_rank_in_flight(self, rank: int) -> int:
        """The most (stage, micro-batch) activation sets ``rank`` holds at one time."""
        return max((held for _, held in self.rank_in_flight(rank)), default=0)

    def _held(self, rank: int, stages: set[int]) -> list[tuple[float, int]]:
        events: list[tuple[float, int]] = []
        last_backward: dict[tuple[int, int], float] = {}
        for t in self.timeline[rank]:
            if t.action.stage not in stages:
                continue
            if t.action.kind == "F":
                events.append((t.start, +1))
            elif t.action.kind in ("B", "W"):
                last_backward[(t.action.stage, t.action.micro_batch)] = t.end
        events += [(end, -1) for end in last_backward.values()]
        curve, held = [], 0
        for time, change in sorted(events, key=lambda e: (e[0], e[1])):  # frees before holds
            held += change
            if curve and curve[-1][0] == time:  # a backward ends as the next forward starts
                curve.pop()
            if not curve or curve[-1][1] != held:
                curve.append((time, held))
        return curve

    def peak_in_flight(self, stage: int) -> int:
        """The most micro-batches whose activations ``stage`` holds at once."""
        return max((held for _, held in self.in_flight(stage)), default=0)

    def spans(self, origin_ns: int = 0) -> list[Span]:
        """The timeline as trace spans: compute for F/B/I/W, comm for messages; labelled with
        ``micro_batch``, ``phase`` and ``stage`` as the executor's spans are."""
        spans = []
        for rank in self.timeline:
            for t in rank:
                a = t.action
                phase = a.kind if a.is_compute else a.kind[-1]
                spans.append(
                    Span(
                        t.rank,
                        str(a),
                        "compute" if a.is_compute else "comm",
                        origin_ns + round(t.start * NS_PER_UNIT),
                        origin_ns + round(t.end * NS_PER_UNIT),
                        labels={"micro_batch": a.micro_batch, "phase": phase, "stage": a.stage},
                    )
                )
        return spans

    def trace(self) -> Trace:
        """A :class:`~dtlab.trace.Trace` of the prediction (one cost unit = one millisecond)."""
        return Trace(self.spans(), start_ns=0, end_ns=round(self.makespan * NS_PER_UNIT))

    def summary(self) -> str:
        s = self.schedule
        return (
            f"{s.name}: p={s.n_ranks}, m={s.n_micro}; step {self.makespan:g}; bubble "
            f"{self.bubble_fraction_of_total:.1%} of total (idle/total), "
            f"{self.bubble_ratio_to_ideal:.1%} of ideal (idle/ideal); stage 0 holds at most "
            f"{self.peak_in_flight(0)} micro-batches"
        )


def simulate(schedule: Schedule, costs: Costs | None = None) -> Simulation:
    """Validate ``schedule`` and play it with ``costs`` (default F=1, I=1, W=1, p2p=0)."""
    costs = costs or Costs()
    validate(schedule)
    timeline = replay(schedule, costs)
    return Simulation(schedule, costs, tuple(tuple(rank) for rank in timeline))


def measured_bubble(trace: Trace) -> dict[str, float]:
    """The same two bubble numbers for a run on real ranks: each rank's idle time is the step's
    span (first start to last end over all ranks) minus the union of its compute spans."""
    compute = trace.filter(kind="compute")
    if not compute.spans:
        raise ValueError("the trace has no compute spans: record a pipeline step first")
    start = min(s.start_ns for s in compute.spans)
    end = max(s.end_ns for s in compute.spans)
    busy = compute.total_seconds()
    total = (end - start) / 1e9 * len(compute.ranks)
    return {
        "bubble_fraction_of_total": (total - busy) / total,
        "bubble_ratio_to_ideal": (total - busy) / busy,
    }
