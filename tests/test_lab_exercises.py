"""Every graded exercise of every lab: the solution passes its grader, the student stub fails it;
and lab 01's from-scratch graders reject right answers that skip the skill.

The exercises are read from the lab sources (``solutions/NN_*.py``) by
:mod:`dtlab.workshop.exercises`; each runs on the shared warm cluster of the world size its
grader declares.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed import all_reduce as add_up_everywhere

from dtlab.quiz import check_exercise, known_exercises
from dtlab.workshop.build import lab_sources
from dtlab.workshop.exercises import list_exercises, load_exercise_function
from dtlab.workshop.source import read_lab_source

REPO = Path(__file__).resolve().parents[1]
EXERCISES = [e for path in lab_sources(REPO) for e in list_exercises(read_lab_source(path))]


def cluster_for(exercise_id: str, request: pytest.FixtureRequest):
    registered = known_exercises().get(exercise_id)
    assert registered is not None, f"{exercise_id!r} has no grader in lib/dtlab/quiz/graders/"
    world_size = registered.world_size
    assert world_size in (1, 2, 3, 4), (
        f"{exercise_id}: no shared cluster of world size {world_size}"
    )
    return request.getfixturevalue(f"cluster{world_size}")


@pytest.mark.parametrize("exercise", EXERCISES, ids=str)
def test_lab_solution_passes_its_grader(exercise, request):
    fn = load_exercise_function(exercise, "solution")
    result = check_exercise(
        exercise.exercise_id, fn, cluster_for(exercise.exercise_id, request), record=False
    )
    assert result, (
        f"{exercise} (solutions/{exercise.lab}.py:{exercise.cell_line}): {result.message}"
    )


@pytest.mark.parametrize("exercise", EXERCISES, ids=str)
def test_lab_student_stub_fails_its_grader(exercise, request):
    fn = load_exercise_function(exercise, "student")
    result = check_exercise(
        exercise.exercise_id, fn, cluster_for(exercise.exercise_id, request), record=False
    )
    assert not result, f"{exercise}: the student stub passes its grader"
    # names what the student must write, e.g. lab 04's VocabParallelCrossEntropy.forward, not
    # the already written vocab_parallel_cross_entropy the grader calls
    unwritten = re.findall(r'raise ExerciseNotWritten\("([\w.]+)"\)', exercise.student_code)
    named = re.match(r"Not implemented yet: write the body of `([\w.]+)`", result.message)
    assert named and named[1] in unwritten, f"{exercise}: {result.message}"
    assert "ExerciseNotWritten" in result.details["traceback (tail)"], result.details


def test_every_lab_exercise_has_a_distinct_id():
    ids = [e.exercise_id for e in EXERCISES]
    assert len(ids) == len(set(ids)), f"an exercise id is graded twice: {sorted(ids)}"


# -- lab 01: a from-scratch collective is built from messages, and moves the ring's bytes -------
def reduce_then_broadcast(tensor):
    dist.reduce(tensor, 0)
    dist.broadcast(tensor, 0)
    return tensor


def all_gather_then_sum(tensor):
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return tensor.copy_(torch.stack(parts).sum(0))


def all_reduce_under_another_name(tensor):
    add_up_everywhere(tensor)  # imported at the top, before grading switched dist.all_reduce off
    return tensor


def dtlab_ring_all_reduce(tensor):
    from dtlab import collectives

    return collectives.all_reduce(tensor, algorithm="ring")


def star_through_rank_zero(tensor):
    """Messages only, but every buffer to rank 0 and back: rank 0 sends (N-1)·M, not 2(N-1)/N·M."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)
        return tensor
    for src in range(1, n):
        incoming = torch.empty_like(tensor)
        dist.recv(incoming, src)
        tensor.add_(incoming)
    for dst in range(1, n):
        dist.send(tensor, dst)
    return tensor


def every_buffer_to_every_rank(tensor):
    """Messages only, each rank adds up everyone's whole buffer: (N-1)·M bytes per rank."""
    rank, n = dist.get_rank(), dist.get_world_size()
    others = [r for r in range(n) if r != rank]
    inbox = [torch.empty_like(tensor) for _ in others]
    ops = [dist.P2POp(dist.isend, tensor, r) for r in others]
    ops += [dist.P2POp(dist.irecv, buf, r) for r, buf in zip(others, inbox, strict=True)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    for buf in inbox:
        tensor.add_(buf)
    return tensor


def leftward_ring_with_isend_irecv(tensor):
    """An honest ring the other way round, with single isend/irecv instead of a batch."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    left, right = (rank - 1) % n, (rank + 1) % n

    def step(send_chunk, recv_chunk):
        handles = [dist.isend(send_chunk, left), dist.irecv(recv_chunk, right)]
        for handle in handles:
            handle.wait()

    for s in range(n - 1):
        incoming = torch.empty_like(chunks[(rank + 2 + s) % n])
        step(chunks[(rank + 1 + s) % n], incoming)
        chunks[(rank + 2 + s) % n].add_(incoming)
    for s in range(n - 1):
        step(chunks[(rank + s) % n], chunks[(rank + s + 1) % n])
    return tensor


def built_in_all_gather(chunk):
    out = chunk.new_empty(chunk.numel() * dist.get_world_size())
    dist.all_gather_into_tensor(out, chunk)
    return out


def all_gather_straight_to_everyone(chunk):
    """Right bytes ((N-1) chunks), wrong shape: rank r sends to r+2, which is not a neighbour."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out = chunk.new_empty((n, chunk.numel()))
    out[rank] = chunk
    others = [r for r in range(n) if r != rank]
    ops = [dist.P2POp(dist.isend, chunk, r) for r in others]
    ops += [dist.P2POp(dist.irecv, out[r], r) for r in others]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return out.view(-1)


@pytest.mark.parametrize(
    ("exercise_id", "cheat", "why"),
    [
        ("collectives.ring_all_reduce", reduce_then_broadcast, "dist.reduce is not allowed"),
        ("collectives.ring_all_reduce", all_gather_then_sum, "dist.all_gather is not allowed"),
        ("collectives.ring_all_reduce", all_reduce_under_another_name, "dist.all_reduce is not"),
        ("collectives.ring_all_reduce", dtlab_ring_all_reduce, "dtlab.collectives is not allowed"),
        ("collectives.ring_all_reduce", star_through_rank_zero, "a ring sends only to its"),
        ("collectives.ring_all_reduce", every_buffer_to_every_rank, "never the whole buffer"),
        ("collectives.ring_all_gather", built_in_all_gather, "all_gather_into_tensor is not"),
        ("collectives.ring_all_gather", all_gather_straight_to_everyone, "only to its neighbours"),
    ],
    ids=lambda v: getattr(v, "__name__", None) or "",
)
def test_lab01_grader_rejects_a_right_answer_that_skips_the_ring(exercise_id, cheat, why, request):
    result = check_exercise(exercise_id, cheat, cluster_for(exercise_id, request), record=False)
    assert not result, f"{cheat.__name__} passed {exercise_id}"
    assert why in result.message


def test_lab01_grader_accepts_a_ring_either_way_round(request):
    exercise_id = "collectives.ring_all_reduce"
    result = check_exercise(
        exercise_id, leftward_ring_with_isend_irecv, cluster_for(exercise_id, request), record=False
    )
    assert result, result.message
    assert "every rank sent 2(N-1)/N·M bytes, to its ring neighbours only" in result.message


def test_lab01_cost_grader_rejects_the_library_formula(request):
    from dtlab.cost import Link, collective_time

    def ring_time_from_the_library(nbytes, n, alpha_s, bandwidth):
        return collective_time("all_reduce", "ring", nbytes, n, Link(alpha_s, bandwidth))

    exercise_id = "collectives.ring_time"
    result = check_exercise(
        exercise_id, ring_time_from_the_library, cluster_for(exercise_id, request), record=False
    )
    assert not result and "calls dtlab.cost.collective_time" in result.message
