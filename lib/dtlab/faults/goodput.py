"""Goodput vs checkpoint interval, measured on a simulated failure trace.

A failure trace is a list of failure times drawn from an exponential distribution with the
cluster's MTBF (:func:`failure_trace`). :func:`replay` then plays a job against it, second by
second of simulated wall clock: it computes, every ``interval_s`` of progress it checkpoints —
stalling ``blocking_s`` (the whole write for a synchronous save; only the snapshot for an
asynchronous one) — and the checkpoint becomes *durable* ``write_s`` later (immediately for a
synchronous save). A failure throws away the progress since the last durable checkpoint and
costs ``restart_s``. Goodput is useful work ÷ wall clock. Sweeping ``interval_s`` gives the curve
whose peak Young/Daly predicts at ``sqrt(2·C·MTBF)`` with ``C`` the *blocking* cost
(:func:`dtlab.cost.reliability.young_daly_interval`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


def failure_trace(mtbf_s: float, horizon_s: float, seed: int = 0) -> list[float]:
    """Failure times (seconds) of a Poisson process with mean gap ``mtbf_s`` up to ``horizon_s``."""
    if mtbf_s <= 0 or horizon_s <= 0:
        raise ValueError("mtbf_s and horizon_s must be > 0 seconds")
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(1.0 / mtbf_s)
        if t > horizon_s:
            return out
        out.append(t)


@dataclass
class Replay:
    work_s: float
    wall_s: float
    failures: int
    checkpoints: int
    lost_s: float  # recomputed work

    @property
    def goodput(self) -> float:
        return self.work_s / self.wall_s


def replay(
    failures: list[float],
    work_s: float,
    interval_s: float,
    blocking_s: float,
    write_s: float = 0.0,
    restart_s: float = 0.0,
) -> Replay:
    """Play a job of ``work_s`` seconds of computing against ``failures`` (see module docstring)."""
    if interval_s <= 0 or work_s <= 0:
        raise ValueError("interval_s and work_s must be > 0 seconds")
    wall, done, durable, n_ckpt, lost = 0.0, 0.0, 0.0, 0, 0.0
    pending: tuple[float, float] | None = None  # (progress saved, wall time it becomes durable)
    upcoming = iter(sorted(failures))
    next_failure = next(upcoming, float("inf"))
    while done < work_s:
        target = min(work_s, (done // interval_s + 1) * interval_s)
        seg_end = wall + (target - done) + (blocking_s if target < work_s else 0.0)
        if pending is not None and pending[1] <= min(seg_end, next_failure):
            durable, pending = pending[0], None
        if next_failure < seg_end:  # fail mid-segment: back to the last durable checkpoint
            lost += done - durable + max(0.0, next_failure - wall)
            wall = next_failure + restart_s
            done, pending = durable, None
            next_failure = next(upcoming, float("inf"))
            while next_failure < wall:  # failures during the restart restart it again
                wall = next_failure + restart_s
                next_failure = next(upcoming, float("inf"))
            continue
        wall, done = seg_end, target
        if done < work_s:
            n_ckpt += 1
            if write_s <= 0:
                durable = done
            else:
                pending = (done, wall + write_s)
    return Replay(work_s, wall, sum(1 for f in failures if f < wall), n_ckpt, lost)


def goodput_curve(
    intervals_s: list[float], failures: list[float], work_s: float, **costs
) -> list[tuple[float, float]]:
    """``(interval, goodput)`` for each interval on the same failure trace."""
    return [(t, replay(failures, work_s, t, **costs).goodput) for t in intervals_s]
