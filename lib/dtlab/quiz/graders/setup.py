"""Graders for lab 00 (setup and tour): the first collective a learner writes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtlab.quiz.exercises import GradeResult, assert_all_ranks_close, exercise


def expected_rank_sum(world_size: int) -> int:
    """What every rank holds after all-reducing (SUM) its own rank: 0 + 1 + ... + (N-1) = N(N-1)/2."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    return world_size * (world_size - 1) // 2


def _as_number(value: Any) -> Any:
    """A one-element tensor (any shape) as a Python number; anything else unchanged."""
    if hasattr(value, "numel") and value.numel() == 1:
        return value.reshape(()).item()
    return value


@exercise("setup.rank_sum", title="All-reduce your rank", world_size=2)
def grade_rank_sum(fn: Callable[[], Any], cluster: Any) -> GradeResult:
    """Run ``fn()`` on every rank; each must return N(N-1)/2 (a number or a one-element tensor)."""
    world_size = cluster.world_size
    results = [_as_number(value) for value in cluster.run(fn)]
    want = expected_rank_sum(world_size)
    assert_all_ranks_close(results, [want] * world_size, "the all-reduced rank sum")
    terms = " + ".join(str(r) for r in range(world_size))
    return GradeResult(
        True,
        f"All {world_size} ranks hold {want} = {terms} = N(N-1)/2: one all-reduce, every rank the same sum.",
        {"per-rank results": results},
    )
