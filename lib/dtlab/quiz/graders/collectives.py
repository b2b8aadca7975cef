"""Graders for lab 01 (collectives): ring all-reduce, ring all-gather, two-shot all-reduce, and a
cost-model calculation.

The two ring exercises run the learner's function on every rank of the cluster, over several
buffer lengths (including ones the world size does not divide), with integer-valued data so the
sum is exact whatever the order of additions, and compare with ``torch.distributed``'s own
collective. A right answer is not enough: the exercise is *building* the ring from messages.
While the learner's code runs (:func:`~dtlab.quiz.graders.watch.watching`):

* every built-in collective — ``dist.all_reduce``, but also ``dist.reduce`` + ``dist.broadcast``
  or ``dist.all_gather`` + a local sum — and dtlab's own collectives are refused with a message
  naming the call; only point-to-point messages (``isend``/``irecv``/``batch_isend_irecv``) pass;
* the bytes each rank sends are counted from those messages and held to the ring's: an
  all-reduce sends ``2 (N-1)/N · M`` (each phase, every chunk but one), an all-gather
  ``(N-1)/N · M``, and a ring sends only to its neighbours. Sending everything to rank 0, or
  every buffer to every rank, gets the right sum with the wrong traffic, and fails.

Chunks follow ``torch.tensor_split``, so when ``N`` does not divide the length a rank's count may
differ from ``2 (N-1)/N · M`` by the size difference of the chunks it skips; that much is allowed.

The two-shot exercise (:mod:`dtlab.collectives.peer_memory`) is held to its own traffic, peer by
peer: rank ``r`` sends peer ``p`` exactly chunk ``p`` (the direct reduce-scatter) and its own
summed chunk ``r`` (the all-gather), ``|chunk p| + |chunk r|`` bytes. A ring (neighbours only)
and a one-shot (the whole buffer to everyone) both get the sum right and fail.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtlab.cost.alpha_beta import Link, ring_allreduce_time
from dtlab.cost.collectives import collective_time, terms
from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.watch import P2P, noticing_calls, watching

LENGTHS = (1, 7, 12, 1001)
RING_WORLD_SIZE = 4  # a ring of 2 is a swap, of 3 every rank is a neighbour; 4 shows the shape
FROM_MESSAGES = (
    "this exercise builds the collective from point-to-point messages (dist.isend/dist.irecv "
    "or dist.batch_isend_irecv) — a built-in collective, or dtlab.collectives, would do the "
    "work for you"
)


def _data(length: int, rank: int):
    import torch

    return (torch.arange(length, dtype=torch.float32) * 7 + rank * 13) % 17


def _run_watched(fn: Callable, arg) -> tuple[Any, dict]:
    with watching({P2P}, FROM_MESSAGES, dtlab_collectives=False) as wire:
        returned = fn(arg)
    return returned, wire.summary()


def _ring_traffic_problems(what: str, sent_to: dict, chunks: list[int], phases: int) -> list[str]:
    """Problems with this rank's traffic for a ring of ``phases`` passes over ``chunks`` (bytes).

    Each pass a rank sends every chunk but one, to one neighbour: between ``M - largest`` and
    ``M - smallest`` bytes, ``(N-1)/N · M`` when the chunks are equal.
    """
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    neighbours = {(rank - 1) % n, (rank + 1) % n}
    problems = [
        f"{what}: rank {rank} sent {sent} B to rank {peer}; a ring sends only to its neighbours "
        f"(ranks {sorted(neighbours)})"
        for peer, sent in sorted(sent_to.items())
        if sent and peer not in neighbours
    ]
    total, m = sum(sent_to.values()), sum(chunks)
    low, high = phases * (m - max(chunks)), phases * (m - min(chunks))
    if not low <= total <= high:
        formula = f"{phases}(N-1)/N·M" if phases > 1 else "(N-1)/N·M"
        expected = f"{low} B" if low == high else f"{low}–{high} B"
        hint = (
            "some chunks never left this rank"
            if total < low
            else "a ring moves one chunk (M/N) per message, never the whole buffer"
        )
        problems.append(
            f"{what}: rank {rank} sent {total} B, but a ring sends {formula} = {expected} "
            f"(M = {m} B, N = {n}): {hint}"
        )
    return problems


def _check_all_reduce_on_rank(fn: Callable) -> tuple[list[str], list[str]]:
    """This rank's (wrong results, wrong traffic), one line per problem."""
    import torch
    import torch.distributed as dist

    problems, traffic = [], []
    n = dist.get_world_size()
    for length in LENGTHS:
        mine = _data(length, dist.get_rank())
        want = mine.clone()
        dist.all_reduce(want)
        got = mine.clone()
        returned, wire = _run_watched(fn, got)
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
            continue
        chunks = [c.numel() * 4 for c in torch.tensor_split(mine, n)]
        traffic += _ring_traffic_problems(f"length {length}", wire["sent_to"], chunks, phases=2)
    return problems, traffic


def _check_all_gather_on_rank(fn: Callable) -> tuple[list[str], list[str]]:
    """This rank's (wrong results, wrong traffic), one line per problem."""
    import torch
    import torch.distributed as dist

    problems, traffic = [], []
    n = dist.get_world_size()
    for length in LENGTHS:
        chunk = _data(length, dist.get_rank())
        want = [torch.empty_like(chunk) for _ in range(n)]
        dist.all_gather(want, chunk)
        want = torch.cat(want)
        got, wire = _run_watched(fn, chunk.clone())
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            problems.append(
                f"chunk length {length}: expected a tensor of shape {tuple(want.shape)} (all "
                f"{n} chunks in rank order), got {getattr(got, 'shape', type(got).__name__)}"
            )
        elif not torch.equal(got, want):
            bad = sorted({int(i) // length for i in (got != want).nonzero().flatten().tolist()})
            problems.append(f"chunk length {length}: the chunks of ranks {bad} are wrong")
        else:
            chunks = [length * 4] * n
            traffic += _ring_traffic_problems(
                f"chunk length {length}", wire["sent_to"], chunks, phases=1
            )
    return problems, traffic


def _check_two_shot_on_rank(fn: Callable) -> tuple[list[str], list[str]]:
    """This rank's (wrong results, wrong traffic) for a two-shot all-reduce."""
    import torch
    import torch.distributed as dist

    problems, traffic = [], []
    rank, n = dist.get_rank(), dist.get_world_size()
    for length in LENGTHS:
        mine = _data(length, rank)
        want = mine.clone()
        dist.all_reduce(want)
        got = mine.clone()
        returned, wire = _run_watched(fn, got)
        got = returned if isinstance(returned, torch.Tensor) else got
        if got.shape != want.shape or not torch.equal(got, want):
            problems.append(
                f"length {length}: rank {rank} does not hold the sum of every rank's tensor"
            )
            continue
        chunks = [c.numel() * 4 for c in torch.tensor_split(mine, n)]
        for peer in range(n):
            if peer == rank:
                continue
            sent, expected = wire["sent_to"].get(peer, 0), chunks[peer] + chunks[rank]
            if sent != expected:
                traffic.append(
                    f"length {length}: rank {rank} sent {sent} B to rank {peer}; two-shot sends "
                    f"each peer its chunk ({chunks[peer]} B) and then this rank's summed chunk "
                    f"({chunks[rank]} B) = {expected} B"
                )
    return problems, traffic


def _verdict(per_rank: list[tuple], what: str, n: int, traffic: str) -> GradeResult:
    wrong = [p for problems, _ in per_rank for p in problems]
    if wrong:
        raise AssertionError("\n".join(wrong[:8]))
    not_a_ring = [p for _, problems in per_rank for p in problems]
    if not_a_ring:
        raise NotTheSkill("\n".join(not_a_ring[:8]))
    return GradeResult(
        True,
        f"{what} matches torch.distributed on all {n} ranks for lengths {list(LENGTHS)}, "
        f"built from messages alone: every rank sent {traffic}, to its ring neighbours only.",
    )


@exercise(
    "collectives.ring_all_reduce",
    title="Ring all-reduce from send/recv",
    world_size=RING_WORLD_SIZE,
)
def grade_ring_all_reduce(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(tensor)`` sums ``tensor`` across ranks in place (or returns the sum), by messages."""
    return _verdict(
        cluster.run(_check_all_reduce_on_rank, fn),
        "Your ring all-reduce",
        cluster.world_size,
        "2(N-1)/N·M bytes",
    )


@exercise(
    "collectives.ring_all_gather",
    title="Ring all-gather from send/recv",
    world_size=RING_WORLD_SIZE,
)
def grade_ring_all_gather(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(chunk)`` returns every rank's chunk concatenated in rank order, by messages."""
    return _verdict(
        cluster.run(_check_all_gather_on_rank, fn),
        "Your ring all-gather",
        cluster.world_size,
        "(N-1)/N·M bytes",
    )


@exercise(
    "collectives.two_shot_all_reduce",
    title="Two-shot all-reduce from send/recv",
    world_size=RING_WORLD_SIZE,
)
def grade_two_shot_all_reduce(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(tensor)`` sums ``tensor`` across ranks in place (or returns the sum) in two direct
    exchanges: chunk ``j`` to rank ``j``, then each rank's summed chunk to every peer."""
    per_rank = cluster.run(_check_two_shot_on_rank, fn)
    wrong = [p for problems, _ in per_rank for p in problems]
    if wrong:
        raise AssertionError("\n".join(wrong[:8]))
    not_two_shot = [p for _, problems in per_rank for p in problems]
    if not_two_shot:
        raise NotTheSkill("\n".join(not_two_shot[:8]))
    return GradeResult(
        True,
        f"Your two-shot all-reduce matches torch.distributed on all {cluster.world_size} ranks "
        f"for lengths {list(LENGTHS)}: every rank sent each peer its chunk and then its own "
        "summed chunk — the ring's 2(N-1)/N·M bytes in two steps instead of 2(N-1).",
    )


COST_CASES = (
    (1 << 30, 8, Link(5e-6, 50e9)),
    (1 << 20, 8, Link(5e-6, 50e9)),
    (1 << 10, 64, Link(2e-6, 450e9)),
    (256 << 20, 2, Link(50e-6, 2e9)),
)


ANSWER_FUNCTIONS = {
    collective_time: "dtlab.cost.collective_time",
    terms: "dtlab.cost.collectives.terms",
    ring_allreduce_time: "dtlab.cost.ring_allreduce_time",
}


@exercise("collectives.ring_time", title="Price a ring all-reduce", world_size=2)
def grade_ring_time(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(nbytes, n, alpha_s, bandwidth_bytes_per_s)`` returns the ring all-reduce's seconds."""
    wrong = []
    for nbytes, n, link in COST_CASES:
        want = collective_time("all_reduce", "ring", nbytes, n, link)
        with noticing_calls(ANSWER_FUNCTIONS) as used:
            got = fn(nbytes, n, link.alpha_s, link.bandwidth_bytes_per_s)
        if used:
            raise NotTheSkill(
                f"your function calls {used[0]}, which computes the answer for you; write the "
                "formula itself: 2(N-1) steps, each paying α plus M/N bytes at the bandwidth"
            )
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
