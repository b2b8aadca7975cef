"""The planner's pipeline bubble for the lab GPT's schedules, closed form.

:func:`predicted_bubble` is the idle share the planner expects, ``(p−1)/(m+p−1)`` for GPipe and
1F1B, ``(p−1)/(v·m+p−1)`` interleaved (:mod:`dtlab.cost.bubble`; Narayanan et al. 2021, §2.2).
Held against a real run by :func:`dtlab.bench.planner_vs_cluster.planner_vs_cluster` (a planner
never runs ranks).
"""

from __future__ import annotations

from dtlab.cost.bubble import bubble_fraction_of_total, interleaved_bubble_fraction_of_total


def predicted_bubble(pp: int, n_micro: int, schedule: str = "1f1b", n_virtual: int = 1) -> float:
    """Idle share of a pipeline step, ``1 − busy/(p·makespan)`` with equal stages."""
    if schedule in ("1f1b", "gpipe"):
        return bubble_fraction_of_total(pp, n_micro)
    if schedule == "interleaved_1f1b":
        return interleaved_bubble_fraction_of_total(pp, n_micro, n_virtual)
    raise ValueError(f"schedule={schedule!r}: choose '1f1b', 'gpipe' or 'interleaved_1f1b'")
