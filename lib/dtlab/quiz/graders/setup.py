"""Graders for lab 00 (setup and tour): the first collective a learner writes.

``setup.rank_sum`` is right when every rank returns ``N(N-1)/2`` *and* got there by an
all-reduce: the closed form computed locally, or an all-gather and a local sum, give the same
number without the skill. While the learner's function runs the grader watches the wire
(:func:`~dtlab.quiz.graders.watch.watching`) and requires a ``dist.all_reduce`` — or messages of
the learner's own (dtlab's ring all-reduce is built from them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtlab.quiz.exercises import GradeResult, NotTheSkill, assert_all_ranks_close, exercise
from dtlab.quiz.graders.watch import EVERY_KIND, watching


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


def _run_watched(fn: Callable[[], Any]) -> tuple[Any, dict]:
    with watching(EVERY_KIND, "") as wire:
        value = fn()
    return _as_number(value), wire.summary()


@exercise("setup.rank_sum", title="All-reduce your rank", world_size=2)
def grade_rank_sum(fn: Callable[[], Any], cluster: Any) -> GradeResult:
    """Run ``fn()`` on every rank; each must return N(N-1)/2 (a number or a one-element tensor),
    computed by an all-reduce."""
    world_size = cluster.world_size
    replies = list(cluster.run(_run_watched, fn))
    results = [value for value, _ in replies]
    want = expected_rank_sum(world_size)
    assert_all_ranks_close(results, [want] * world_size, "the all-reduced rank sum")
    for rank, (_, wire) in enumerate(replies):
        kinds = [kind for _, kind, _, _ in wire["collectives"] if kind != "barrier"]
        if "all_reduce" not in kinds and not wire["p2p_bytes_sent"]:
            used = f"it called {sorted(set(kinds))}" if kinds else "it sent nothing"
            raise NotTheSkill(
                f"rank {rank} returned {want} without an all-reduce ({used}): the exercise is "
                "the collective, not the closed form — put this rank's number in a tensor and "
                "dist.all_reduce it"
            )
    terms = " + ".join(str(r) for r in range(world_size))
    return GradeResult(
        True,
        f"All {world_size} ranks hold {want} = {terms} = N(N-1)/2: one all-reduce, every rank the same sum.",
        {"per-rank results": results},
    )
