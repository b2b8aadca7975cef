"""Graders for lab 01 (collectives): ring all-reduce, ring all-gather, and a cost-model calculation.

The two ring exercises run the learner's function on every rank of the cluster, over several
buffer lengths (including ones the world size does not divide), with integer-valued data so the
sum is exact whatever the order of additions, and compare with ``torch.distributed``'s own
collective. While the learner's code runs, the built-in collective it is meant to replace raises,
so a solution cannot simply call it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from dtlab.cost.alpha_beta import Link
from dtlab.cost.collectives import collective_time
from dtlab.quiz.exercises import GradeResult, exercise

LENGTHS = (1, 7, 12, 1001)


@contextmanager
def _forbidden(*names: str):
    """Make ``torch.distributed.<name>`` raise for the duration (the learner builds it instead)."""
    import torch.distributed as dist

    saved = {name: getattr(dist, name) for name in names if hasattr(dist, name)}

    def refuse(*args, **kwargs):
        raise RuntimeError(
            "this exercise builds the collective from send/recv (dist.isend/dist.irecv, "
            "dist.batch_isend_irecv); the built-in one is switched off while it is graded"
        )

    for name in saved:
        setattr(dist, name, refuse)
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


def _data(length: int, rank: int):
    import torch

    return (torch.arange(length, dtype=torch.float32) * 7 + rank * 13) % 17


def _check_all_reduce_on_rank(fn: Callable) -> list[str]:
    import torch
    import torch.distributed as dist

    problems = []
    for length in LENGTHS:
        mine = _data(length, dist.get_rank())
        want = mine.clone()
        dist.all_reduce(want)
        got = mine.clone()
        with _forbidden("all_reduce", "reduce_scatter_tensor", "reduce_scatter", "all_gather"):
            returned = fn(got)
        got = returned if isinstance(returned, torch.Tensor) else got
        if got.shape != want.shape or not torch.equal(got, want):
            first = (
                (got != want).nonzero()[:1].flatten().tolist() if got.shape == want.shape else []
            )
            problems.append(
                f"length {length}: rank {dist.get_rank()} "
                + (
                    f"differs first at index {first[0]}: got {got[first[0]].item()}, "
                    f"expected {want[first[0]].item()}"
                    if first
                    else f"shape {tuple(got.shape)}"
                )
            )
    return problems


def _check_all_gather_on_rank(fn: Callable) -> list[str]:
    import torch
    import torch.distributed as dist

    problems = []
    n = dist.get_world_size()
    for length in LENGTHS:
        chunk = _data(length, dist.get_rank())
        want = [torch.empty_like(chunk) for _ in range(n)]
        dist.all_gather(want, chunk)
        want = torch.cat(want)
        with _forbidden("all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce"):
            got = fn(chunk.clone())
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            problems.append(
                f"chunk length {length}: expected a tensor of shape {tuple(want.shape)} (all "
                f"{n} chunks in rank order), got {getattr(got, 'shape', type(got).__name__)}"
            )
        elif not torch.equal(got, want):
            bad = sorted({int(i) // length for i in (got != want).nonzero().flatten().tolist()})
            problems.append(f"chunk length {length}: the chunks of ranks {bad} are wrong")
    return problems


def _verdict(per_rank: list[list[str]], what: str, n: int) -> GradeResult:
    problems = [p for rank_problems in per_rank for p in rank_problems]
    if problems:
        raise AssertionError("\n".join(problems[:8]))
    return GradeResult(
        True,
        f"{what} matches torch.distributed on all {n} ranks for lengths {list(LENGTHS)}.",
    )


@exercise("collectives.ring_all_reduce", title="Ring all-reduce from send/recv", world_size=3)
def grade_ring_all_reduce(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(tensor)`` sums ``tensor`` across ranks in place (or returns the sum)."""
    return _verdict(
        cluster.run(_check_all_reduce_on_rank, fn), "Your ring all-reduce", cluster.world_size
    )


@exercise("collectives.ring_all_gather", title="Ring all-gather from send/recv", world_size=3)
def grade_ring_all_gather(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(chunk)`` returns every rank's chunk concatenated in rank order."""
    return _verdict(
        cluster.run(_check_all_gather_on_rank, fn), "Your ring all-gather", cluster.world_size
    )


COST_CASES = (
    (1 << 30, 8, Link(5e-6, 50e9)),
    (1 << 20, 8, Link(5e-6, 50e9)),
    (1 << 10, 64, Link(2e-6, 450e9)),
    (256 << 20, 2, Link(50e-6, 2e9)),
)


@exercise("collectives.ring_time", title="Price a ring all-reduce", world_size=2)
def grade_ring_time(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(nbytes, n, alpha_s, bandwidth_bytes_per_s)`` returns the ring all-reduce's seconds."""
    wrong = []
    for nbytes, n, link in COST_CASES:
        want = collective_time("all_reduce", "ring", nbytes, n, link)
        got = fn(nbytes, n, link.alpha_s, link.bandwidth_bytes_per_s)
        if not isinstance(got, int | float) or abs(got - want) > 1e-6 * want:
            wrong.append(
                f"{nbytes} bytes on {n} ranks, α={link.alpha_s * 1e6:g} µs, "
                f"{link.bandwidth_bytes_per_s / 1e9:g} GB/s: got {got!r}, expected {want:.6g} s"
            )
    if wrong:
        raise AssertionError(
            "Check the step count 2(N-1) and the bytes per step M/N:\n" + "\n".join(wrong)
        )
    return GradeResult(True, "2(N-1)·α + 2(N-1)/N·M·β on every case: the ring's cost is right.")
