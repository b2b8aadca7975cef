"""``algorithm="auto"`` picks what the α-β model predicts fastest, at exactly the model's crossover
sizes; runs that schedule (its bytes, its spans labelled with the choice); fits a link model on
first use that every rank shares; and refuses ranks whose models differ. Timing is never asserted:
a fitted model is only checked for being shared and positive."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dtlab import collectives as C
from dtlab.collectives.auto import FIT_REPEATS, FIT_SIZES
from dtlab.collectives.simulated import rank_of_simulation, simulate
from dtlab.cost import Link, bytes_sent_per_rank, collective_time, crossover_bytes
from dtlab.cost.tuner import choice_switches, predicted_times

LINK = Link(alpha_s=20e-6, bandwidth_bytes_per_s=10e9)


@pytest.fixture(autouse=True)
def _no_link_model_in_this_process():
    C.set_link_model(None)
    yield
    C.set_link_model(None)


def _switches(op: str, n: int) -> list[tuple[str, str]]:
    return [(below, above) for _, below, above in choice_switches(op, n, LINK, _every(op))]


def _every(op: str) -> list[str]:
    return list(C.ALGORITHMS[op])


def test_small_messages_choose_recursive_doubling_large_the_ring_at_the_models_crossover():
    """5 ranks: recursive doubling (fold, 2 steps, unfold) ``4 α + 4 M β`` against the ring
    ``8 α + 8/5 M β``: they cross at ``M = 4 α / (2.4 β)``."""
    (size, below, above), *rest = choice_switches("all_reduce", 5, LINK, _every("all_reduce"))
    assert (below, above, rest) == ("recursive_doubling", "ring", [])
    assert size == pytest.approx(crossover_bytes("all_reduce", below, above, 5, LINK), rel=1e-9)
    assert size == pytest.approx(4 * LINK.alpha_s / (2.4 / LINK.bandwidth_bytes_per_s), rel=1e-9)
    assert C.choose_algorithm("all_reduce", int(size * 0.99), 5, LINK) == "recursive_doubling"
    assert C.choose_algorithm("all_reduce", int(size * 1.01), 5, LINK) == "ring"


def test_every_switch_is_where_the_two_predicted_times_meet():
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        for n in (3, 6, 7, 12, 48):
            for size, below, above in choice_switches(op, n, LINK, _every(op)):
                times = predicted_times(op, size, n, LINK, [below, above])
                assert times[below] == pytest.approx(times[above], rel=1e-9), (op, n, size)


def test_the_choice_is_the_smallest_predicted_time_at_every_size_and_group():
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        for n in (2, 3, 4, 5, 6, 7, 8, 24):
            for nbytes in (64, 4 << 10, 256 << 10, 4 << 20, 256 << 20):
                chosen = C.choose_algorithm(op, nbytes, n, LINK)
                times = predicted_times(op, nbytes, n, LINK, _every(op))
                assert times[chosen] == min(times.values()), (op, n, nbytes)
                for a in _every(op):  # the double tree is priced at its best segment count
                    assert times[a] <= collective_time(op, a, nbytes, n, LINK)


def test_the_menu_by_group_size():
    """Three ranks: the double tree's two latencies win small buffers. Six: it wins mid sizes
    between recursive doubling and the ring. Powers of two: Rabenseifner moves the ring's bytes in
    fewer steps, so it takes over from recursive doubling. Many ranks: the double tree's pipeline
    beats the ring's ``2 (N-1)`` latencies up to tens of MB."""
    assert _switches("all_reduce", 3) == [("double_binary_tree", "ring")]
    assert _switches("all_reduce", 6) == [
        ("recursive_doubling", "double_binary_tree"),
        ("double_binary_tree", "ring"),
    ]
    assert _switches("all_reduce", 8) == [("recursive_doubling", "rabenseifner")]
    assert _switches("all_reduce", 48) == [
        ("recursive_doubling", "rabenseifner"),
        ("rabenseifner", "double_binary_tree"),
        ("double_binary_tree", "ring"),
    ]
    assert _switches("reduce_scatter", 8) == [] and _switches("all_gather", 8) == []
    assert C.choose_algorithm("reduce_scatter", 1 << 30, 8, LINK) == "recursive_halving"
    for op, small in [
        ("reduce_scatter", "recursive_halving"),
        ("all_gather", "recursive_doubling"),
    ]:
        ((size, below, above),) = choice_switches(op, 6, LINK, _every(op))
        assert (below, above) == (small, "ring")  # the fold's extra bytes lose to the ring
        assert size == pytest.approx(crossover_bytes(op, small, "ring", 6, LINK), rel=1e-9)


def test_without_a_link_model_the_error_says_how_to_get_one():
    with pytest.raises(ValueError, match="set_link_model"):
        C.choose_algorithm("all_reduce", 1024, 4)
    with pytest.raises(ValueError, match="bandwidth too"):
        C.set_link_model(20e-6)
    with pytest.raises(ValueError, match="'auto'"):
        C.all_reduce(torch.ones(2), algorithm="fastest")


def _auto_everything(sizes: list[int]) -> list:
    """Each size through all_reduce, reduce_scatter and all_gather with auto."""
    rank, n = rank_of_simulation(), C.peers_of().size
    out = []
    for length in sizes:
        x = torch.arange(float(length)) + rank
        want = sum(torch.arange(float(length)) + r for r in range(n))
        with C.counting() as moved:
            C.all_reduce(x, algorithm="auto")
        out.append(("all_reduce", length, C.last_choice(), moved.bytes_sent, torch.equal(x, want)))
        with C.counting() as moved:
            shard = C.reduce_scatter(torch.arange(float(length)) + rank, algorithm="auto")
        mine = want[slice(*C.chunk_bounds(length, n)[rank])]
        ok = torch.equal(shard, mine)
        out.append(("reduce_scatter", length, C.last_choice(), moved.bytes_sent, ok))
        with C.counting() as moved:
            gathered = C.all_gather(mine, algorithm="auto")
        ok = torch.equal(gathered, want)
        out.append(("all_gather", length, C.last_choice(), moved.bytes_sent, ok))
    return out


@pytest.mark.parametrize("n", [4, 6])
def test_auto_runs_the_chosen_schedule_and_sends_its_bytes(n):
    C.set_link_model(LINK.alpha_s, LINK.bandwidth_bytes_per_s)  # simulated ranks inherit it
    sizes = [240, 120_000, 240 * 1024]  # 960 B, 480 kB, 960 KiB: around the crossovers at 4 and 6
    for rank, calls in enumerate(simulate(n, _auto_everything, sizes)):
        chosen = set()
        for op, length, choice, sent, correct in calls:
            nbytes = length * 4
            assert correct, (op, length, choice.algorithm)
            assert choice.algorithm == C.choose_algorithm(op, nbytes, n, LINK)
            assert (choice.op, choice.nbytes, choice.world_size) == (op, nbytes, n)
            assert choice.predicted_s[choice.algorithm] == min(choice.predicted_s.values())
            assert sent == bytes_sent_per_rank(op, choice.algorithm, nbytes, n)[rank]
            assert (choice.segments is not None) == (choice.algorithm == "double_binary_tree")
            chosen.add((op, choice.algorithm))
        assert len({a for o, a in chosen if o == "all_reduce"}) >= 2  # small and large differ
        assert (("all_reduce", "double_binary_tree") in chosen) == (n == 6)  # 480 kB on 6 ranks


def test_ranks_with_different_link_models_are_refused_before_anything_moves():
    def body():
        C.set_link_model(20e-6 * (1 + rank_of_simulation() % 2), 10e9)
        C.all_reduce(torch.ones(4), algorithm="auto")

    with pytest.raises(RuntimeError, match="link model algorithm='auto' prices") as error:
        simulate(3, body)
    assert "fit_link_model() on every rank" in str(error.value.__cause__)


def test_fit_link_model_on_a_subgroup_gives_its_ranks_group_rank_zeros_numbers():
    def body():
        if rank_of_simulation() == 0:
            return C.link_model()
        fitted = C.fit_link_model(group=[1, 2, 3])
        assert C.link_model() == fitted  # kept for this (simulated) rank's later auto calls
        return fitted

    links = simulate(4, body)
    assert links[0] is None and links[1] == links[2] == links[3]
    assert links[1].alpha_s >= 0 and links[1].bandwidth_bytes_per_s > 0
    assert C.link_model() is None  # each simulated rank kept its own; the process has none


def _first_use_fits_then_reuses() -> dict:
    C.set_link_model(None)
    rank = dist.get_rank()
    x = torch.full((4096,), float(rank))
    C.all_reduce(x, algorithm="auto")
    first, link = C.last_choice(), C.link_model()
    y = torch.full((4096,), float(rank))
    with C.counting() as moved:
        C.all_reduce(y, algorithm="auto")
    second = C.last_choice()
    C.set_link_model(None)  # leave the shared test cluster as we found it
    n = dist.get_world_size()
    return {
        "link": (link.alpha_s, link.bandwidth_bytes_per_s),
        "algorithms": (first.algorithm, second.algorithm),
        "same_link_twice": first.link == second.link == link,
        "bytes": moved.bytes_sent,
        "want_bytes": bytes_sent_per_rank("all_reduce", second.algorithm, 4096 * 4, n)[rank],
        "correct": torch.equal(x, y) and torch.equal(x, torch.full((4096,), n * (n - 1) / 2)),
    }


def test_auto_fits_one_link_model_on_first_use_shared_by_every_rank(cluster3):
    result = cluster3.run(_first_use_fits_then_reuses)
    assert len({r["link"] for r in result}) == 1  # every rank adopted group rank 0's fit
    alpha_s, bandwidth = result[0]["link"]
    assert alpha_s >= 0 and bandwidth > 0
    assert len({r["algorithms"] for r in result}) == 1
    assert all(r["same_link_twice"] and r["correct"] for r in result)
    assert all(r["bytes"] == r["want_bytes"] for r in result)
    spans = result.trace.spans
    fits = [s for s in spans if s.name == "link model fit (control)"]
    assert all(s.kind == "other" and s.labels.get("control") for s in fits)
    measured = len(FIT_SIZES) * (FIT_REPEATS + 1)  # then one message with rank 0's α and β
    assert [sum(s.rank == r for s in fits) for r in range(3)] == [measured + 1] * 3  # fitted once
    payload = [s for s in spans if s.kind == "comm"]
    assert payload and all(s.labels.get("chosen_by") == "auto" for s in payload)
    assert {s.labels["algorithm"] for s in payload} == {result[0]["algorithms"][0]}
    assert C.traffic_matrix(spans, 3) == C.traffic_matrix(payload, 3)  # the fit is not traffic
