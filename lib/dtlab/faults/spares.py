"""How many nodes are out at once: a simulated fleet, against the Poisson tail that sizes spares.

Each of ``n`` nodes fails after an exponential time with mean ``M``, stays out for ``R`` (a fixed
repair time: drain, diagnose, swap, burn-in), then rejoins and can fail again. Sampling the fleet
every ``sample_every_s`` gives the distribution of nodes out at once, which
:func:`dtlab.cost.reliability.spare_pool_size` predicts as Poisson with mean ``n·R/M`` (M/G/∞).
That is first order in ``R/M``: a node that is out cannot fail again, so here each node is out a
share ``R/(M + R)`` of the time and the exact count is binomial with mean ``n·R/(M + R)`` — 0.3 %
below the formula for a year's MTBF and a day's repair, far inside the tail a pool is sized for.
This is a simulation, not a measurement of a cluster: lab 10 prints it as such, beside the
formula, to show the tail that a spare pool must cover and what elastic shrinking loses instead.
"""

from __future__ import annotations

import random
from collections import Counter


def simulate_nodes_down(
    n_nodes: int,
    node_mtbf_s: float,
    repair_s: float,
    horizon_s: float,
    sample_every_s: float,
    seed: int = 0,
) -> Counter:
    """How often each count of nodes-out was seen, sampled every ``sample_every_s`` (after one
    repair time of warm-up, so the fleet starts in its steady state)."""
    if min(node_mtbf_s, repair_s, horizon_s, sample_every_s) <= 0 or n_nodes < 1:
        raise ValueError("need n_nodes >= 1 and positive times (seconds)")
    rng = random.Random(seed)
    start = repair_s
    events: list[tuple[float, int]] = []  # (time, +1 out / −1 back)
    for _ in range(n_nodes):
        t = rng.expovariate(1 / node_mtbf_s)
        while t < start + horizon_s:
            events += [(t, 1), (t + repair_s, -1)]
            t += repair_s + rng.expovariate(1 / node_mtbf_s)
    events.sort()
    seen: Counter = Counter()
    down, i, t = 0, 0, start
    while t < start + horizon_s:
        while i < len(events) and events[i][0] <= t:
            down += events[i][1]
            i += 1
        seen[down] += 1
        t += sample_every_s
    return seen


def share_of_time_above(seen: Counter, spares: int) -> float:
    """Share of the samples with more nodes out than ``spares``: the time a pool of that size
    would not cover."""
    total = sum(seen.values())
    return sum(c for k, c in seen.items() if k > spares) / total if total else 0.0
