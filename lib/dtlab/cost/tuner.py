"""The α-β model as a tuner: price every schedule of a collective, run the cheapest.

For a call of ``M`` bytes on ``N`` ranks over a :class:`~dtlab.cost.alpha_beta.Link`, each
algorithm's predicted time is :func:`~dtlab.cost.collectives.collective_time` (``a·α + b·M·β``);
the tuner picks the smallest, ties going to the algorithm listed first. Small buffers go to the
schedules with the fewest latencies (recursive doubling, the trees), large ones to the fewest
bytes (the ring; Rabenseifner when ``N`` is a power of two, where it moves the ring's bytes in
``2 log2 N`` instead of ``2 (N-1)`` steps); the size where the choice flips is where two
algorithms' lines cross, :func:`~dtlab.cost.collectives.crossover_bytes`.

NCCL's tuner does the same at every call, with its own model: ``ncclTopoTuneModel``
(``src/graph/tuning.cc``) fills a latency and a bandwidth for every (algorithm, protocol) —
ring or tree, LL/LL128/Simple — from built-in base latencies per hop and the bandwidth its
topology search found; at launch each candidate is priced ``latency + bytes / bandwidth`` and
the cheapest runs (``NCCL_ALGO``/``NCCL_PROTO`` or a tuner plugin override it). Here the two
numbers are fitted on this machine instead (:func:`dtlab.cost.fit.fit_alpha_beta`,
:func:`dtlab.collectives.fit_link_model`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dtlab.cost.alpha_beta import Link
from dtlab.cost.collectives import collective_time
from dtlab.cost.trees import MAX_TREE_SEGMENTS

PIPELINED = {("all_reduce", "double_binary_tree"): MAX_TREE_SEGMENTS}
"""Schedules whose segment count the tuner chooses too, with the most segments it considers."""


def best_segments(op: str, algorithm: str, nbytes: float, n: int, link: Link) -> int | None:
    """The segment count (per half, for the double tree) with the smallest predicted time, the
    fewest among equals; ``None`` for a schedule that is not pipelined. The time
    ``(h + S - 1)(α + M β / S)`` is convex in ``S`` (least near ``sqrt((h-1) · M β / α)``, see
    :data:`dtlab.cost.trees.TREE_SEGMENT_BYTES`), so a binary search for the first ``S`` where one
    more segment stops paying finds it."""
    most = PIPELINED.get((op, algorithm))
    if most is None:
        return None

    def time(s: int) -> float:
        return collective_time(op, algorithm, nbytes, n, link, segments=s)

    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi) // 2
        if time(mid + 1) < time(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def predicted_times(
    op: str, nbytes: float, n: int, link: Link, algorithms: Sequence[str]
) -> dict[str, float]:
    """Predicted seconds of each of ``algorithms`` for ``op`` on ``nbytes`` over ``n`` ranks,
    each pipelined schedule in its :func:`best_segments`."""
    if not algorithms:
        raise ValueError(f"no algorithms to choose from for {op!r}; pass at least one")
    return {
        a: collective_time(op, a, nbytes, n, link, segments=best_segments(op, a, nbytes, n, link))
        for a in algorithms
    }


def fastest_algorithm(op: str, nbytes: float, n: int, link: Link, algorithms: Sequence[str]) -> str:
    """The algorithm with the smallest predicted time (the first listed among equals)."""
    times = predicted_times(op, nbytes, n, link, algorithms)
    return min(algorithms, key=lambda a: (times[a], list(algorithms).index(a)))


def choice_switches(
    op: str,
    n: int,
    link: Link,
    algorithms: Sequence[str],
    smallest: float = 1.0,
    largest: float = float(1 << 40),
) -> list[tuple[float, str, str]]:
    """Every size where :func:`fastest_algorithm` changes, from ``smallest`` to ``largest``
    bytes, as ``(bytes, fastest below, fastest from there)``: scanned at 8 sizes per doubling,
    then bisected to float precision (the first size at which the new choice holds)."""

    def best(m: float) -> str:
        return fastest_algorithm(op, m, n, link, algorithms)

    grid = [smallest * 2 ** (k / 8) for k in range(int(8 * math.log2(largest / smallest)) + 1)]
    switches = []
    for lo, hi in zip(grid, grid[1:], strict=False):
        below, above = best(lo), best(hi)
        if below == above:
            continue
        for _ in range(200):  # to float precision
            mid = (lo + hi) / 2
            if not lo < mid < hi:
                break
            if best(mid) == below:
                lo = mid
            else:
                hi = mid
        switches.append((hi, below, best(hi)))
    return switches
