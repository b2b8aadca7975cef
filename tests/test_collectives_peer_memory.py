"""One-shot and two-shot all-reduce (dtlab.collectives.peer_memory): the ring's result, the table's
bytes, counted on real and simulated ranks, and the α-β crossovers where the times meet."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dtlab import collectives as C
from dtlab.collectives.simulated import rank_of_simulation, simulate
from dtlab.cost import Link
from dtlab.cost.collectives import bytes_sent_per_rank, collective_time, crossover_bytes

EVEN, ODD = 1200, 1001


def _one_and_two_shot(rank_of=dist.get_rank) -> dict:
    rank = rank_of()
    n = C.peers_of().size
    seen = {}
    for length in (EVEN, ODD):
        x = (torch.arange(float(length)) % 7) * (rank + 1)  # whole numbers: every order is exact
        ring = C.all_reduce(x.clone(), algorithm="ring")
        for schedule in ("one_shot", "two_shot"):
            with C.counting() as moved:
                got = C.peer_all_reduce(x.clone(), algorithm=schedule)
            seen[(schedule, length)] = (
                torch.equal(got, ring),
                moved.bytes_sent,
                moved.messages_sent,
            )
    noisy = torch.randn(257, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
    seen["avg"] = C.peer_all_reduce(noisy.clone(), "avg", algorithm="two_shot")
    seen["max"] = C.peer_all_reduce(noisy.clone(), "max", algorithm="one_shot")
    seen["noisy"] = C.peer_all_reduce(noisy.clone(), algorithm="one_shot")
    seen["n"] = n
    return seen


def _check(per_rank: list[dict]) -> None:
    n = per_rank[0]["n"]
    m = EVEN * 4
    for r, seen in enumerate(per_rank):
        for schedule, messages in (("one_shot", n - 1), ("two_shot", 2 * (n - 1))):
            equal, sent, count = seen[(schedule, EVEN)]
            assert equal, f"rank {r}: {schedule} differs from the ring"
            assert sent == bytes_sent_per_rank("all_reduce", schedule, m, n)[r]
            assert count == messages
            assert seen[(schedule, ODD)][0], f"rank {r}: {schedule} at an odd length"
        sizes = C.chunk_sizes(ODD, n)
        assert seen[("one_shot", ODD)][1] == (n - 1) * ODD * 4
        assert seen[("two_shot", ODD)][1] == (ODD - sizes[r] + (n - 1) * sizes[r]) * 4
    noise = [
        torch.randn(257, generator=torch.Generator().manual_seed(r), dtype=torch.float64)
        for r in range(n)
    ]
    total = sum(noise[1:], noise[0].clone())
    for seen in per_rank:
        assert torch.allclose(seen["avg"], total / n)
        assert torch.equal(seen["max"], torch.stack(noise).amax(0))
        assert torch.equal(seen["noisy"], per_rank[0]["noisy"]), "bitwise the same on every rank"
        assert torch.allclose(seen["noisy"], total)


@pytest.mark.parametrize("world", ["cluster3", "cluster4"])
def test_one_and_two_shot_equal_the_ring_and_send_the_tables_bytes(world, request):
    _check(request.getfixturevalue(world).run(_one_and_two_shot))


def test_one_and_two_shot_on_five_simulated_ranks():
    _check(simulate(5, _one_and_two_shot, rank_of_simulation))


def test_ranks_that_pick_different_schedules_all_raise():
    def body():
        odd = rank_of_simulation() == 1
        try:
            C.peer_all_reduce(torch.ones(8), algorithm="two_shot" if odd else "one_shot")
        except C.CollectiveMismatch as error:
            return str(error)
        return "no error"

    for message in simulate(3, body):
        assert "algorithm — ranks [0, 2]: one_shot; rank 1: two_shot" in message


def test_two_shot_moves_the_rings_bytes_one_shot_n_over_two_times_them():
    for n in (2, 4, 8):
        ring = bytes_sent_per_rank("all_reduce", "ring", 1 << 20, n)
        assert bytes_sent_per_rank("all_reduce", "two_shot", 1 << 20, n) == ring
        one = bytes_sent_per_rank("all_reduce", "one_shot", 1 << 20, n)
        assert one[0] == pytest.approx(ring[0] * n / 2)


def test_one_shot_beats_the_ring_below_the_crossover_and_loses_above():
    link = Link(alpha_s=2e-6, bandwidth_bytes_per_s=450e9)
    n = 8
    size = crossover_bytes("all_reduce", "one_shot", "ring", n, link)
    # α + 7 M β = 14 α + 7/4 M β  →  M = 13 α / (5.25 β)
    assert size == pytest.approx(13 * 2e-6 * 450e9 / 5.25, rel=1e-6)
    t = lambda a, m: collective_time("all_reduce", a, m, n, link)  # noqa: E731
    assert t("one_shot", size / 2) < t("ring", size / 2)
    assert t("one_shot", size * 2) > t("ring", size * 2)
    assert crossover_bytes("all_reduce", "two_shot", "ring", n, link) is None  # never loses


def test_an_unknown_schedule_names_the_two():
    with pytest.raises(ValueError, match="choose 'one_shot' or 'two_shot'"):
        C.peer_all_reduce(torch.ones(2), algorithm="ring")


# -- in-network reduction: one rank plays the switch -------------------------------------------
def _through_the_switch(rank_of=dist.get_rank) -> dict:
    rank, size = rank_of(), C.peers_of().size
    switch = size - 1
    seen = {}
    for length in (EVEN, ODD):
        x = (torch.arange(float(length)) % 5) * (rank + 1)
        with C.counting() as moved:
            got = C.switch_all_reduce(x.clone(), switch=switch)
        seen[length] = (got, moved.bytes_sent, moved.bytes_received)
    return seen


@pytest.mark.parametrize("world", ["cluster3", "cluster4"])
def test_each_gpu_sends_and_receives_one_plus_one_over_n_of_the_buffer(world, request):
    per_rank = request.getfixturevalue(world).run(_through_the_switch)
    gpus = len(per_rank) - 1
    for length in (EVEN, ODD):
        want = (torch.arange(float(length)) % 5) * sum(range(1, gpus + 1))
        sizes = C.chunk_sizes(length, gpus)
        for j in range(gpus):
            got, sent, received = per_rank[j][length]
            assert torch.equal(got, want), f"GPU {j} at length {length}"
            assert sent == received == (length + sizes[j]) * 4
    m = EVEN * 4
    assert per_rank[0][EVEN][1] == pytest.approx((1 + 1 / gpus) * m)
    ring = bytes_sent_per_rank("all_reduce", "ring", m, gpus)[0]
    # (1 + 1/N) against 2(N-1)/N: more than the ring at N = 2, equal at 3, less from 4 on
    assert (per_rank[0][EVEN][1] > ring, per_rank[0][EVEN][1] == ring) == (gpus == 2, gpus == 3)


def test_the_switch_must_be_a_member_of_a_big_enough_group():
    def body():
        C.switch_all_reduce(torch.ones(4), switch=5)

    with pytest.raises(RuntimeError, match="switch=5 must index a member"):
        simulate(3, body)


# -- the lab 01 exercise: two-shot from messages ------------------------------------------------
def _lab_solution(exercise_id: str):
    from pathlib import Path

    from dtlab.workshop.exercises import list_exercises, load_exercise_function
    from dtlab.workshop.source import read_lab_source

    source = read_lab_source(Path(__file__).resolve().parents[1] / "solutions/01_collectives.py")
    exercise = next(e for e in list_exercises(source) if e.exercise_id == exercise_id)
    return load_exercise_function(exercise, "solution")


def test_the_two_shot_exercise_passes_two_shot_and_fails_a_ring_and_a_one_shot(cluster3):
    from dtlab.quiz import check_exercise

    two_shot = _lab_solution("collectives.two_shot_all_reduce")
    ring = _lab_solution("collectives.ring_all_reduce")

    def one_shot(tensor: torch.Tensor) -> torch.Tensor:
        rank, n = dist.get_rank(), dist.get_world_size()
        inbox = [torch.empty_like(tensor) for _ in range(n)]
        ops = [dist.P2POp(dist.isend, tensor, p) for p in range(n) if p != rank]
        ops += [dist.P2POp(dist.irecv, inbox[p], p) for p in range(n) if p != rank]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        for p in range(n):
            if p != rank:
                tensor.add_(inbox[p])
        return tensor

    assert check_exercise("collectives.two_shot_all_reduce", two_shot, cluster3, record=False)
    for wrong, words in ((ring, "sent 0 B to rank"), (one_shot, "two-shot sends each peer")):
        result = check_exercise("collectives.two_shot_all_reduce", wrong, cluster3, record=False)
        assert not result and words in result.message, result.message
