"""Bytes and messages each rank sends equal the algorithm's formula exactly.

Lengths that divide evenly are checked against :func:`dtlab.cost.bytes_sent_per_rank` for every
algorithm; lengths that do not are checked against the tensor_split convention: ring and pairwise
reduce-scatter send ``M - |chunk r|``, ring all-gather ``M - |chunk r+1|``, so a ring all-reduce
sends ``2M - |chunk r| - |chunk r+1|``. Real ranks at 3 and 4, simulated ranks at 5 and 6.
"""

from __future__ import annotations

import pytest
import torch

from dtlab import collectives as C
from dtlab.collectives.simulated import rank_of_simulation, simulate
from dtlab.cost import bytes_sent_per_rank
from dtlab.cost.collectives import hierarchical_bytes_sent_per_rank

EVEN_LENGTH = 960  # divisible by 1..6 and by every power of two up to 64: all formulas exact
ODD_LENGTH = 1001


def _bytes_sent_by_every_algorithm(rank_of=None) -> dict:
    """{(op, algorithm, length): (bytes_sent, messages_sent)} for this rank."""
    import dtlab

    rank = rank_of() if rank_of else dtlab.rank()
    sent = {}
    for length in (EVEN_LENGTH, ODD_LENGTH):
        x = torch.ones(length)
        for op, algorithms in C.ALGORITHMS.items():
            for name, fn in algorithms.items():
                with C.counting() as moved:
                    if op in ("broadcast", "reduce", "all_reduce", "reduce_scatter"):
                        fn(x.clone())
                    elif op == "all_gather":
                        n = C.peers_of().size
                        fn(
                            x[slice(*C.chunk_bounds(length, n)[rank])].clone(),
                            sizes=C.chunk_sizes(length, n),
                        )
                    elif op == "all_to_all":
                        n = C.peers_of().size
                        fn(torch.ones(length // n * n), out=torch.empty(length // n * n))
                    elif op == "gather":
                        fn(torch.ones(length // C.peers_of().size))
                    elif op == "scatter":
                        n = C.peers_of().size
                        out = torch.empty(length // n)
                        fn(out, [torch.ones(length // n)] * n if rank == 0 else None)
                    else:
                        fn()
                sent[(op, name, length)] = (moved.bytes_sent, moved.messages_sent)
    with C.counting() as moved:
        C.all_reduce(torch.ones(EVEN_LENGTH), algorithm="ring")
    with C.counting() as split:
        C.all_gather(C.reduce_scatter(torch.ones(EVEN_LENGTH)))
    sent["identity"] = (moved.bytes_sent, split.bytes_sent)
    return sent


def _check(per_rank: list[dict], n: int) -> None:
    m = EVEN_LENGTH * 4
    for op, algorithms in C.ALGORITHMS.items():
        for name in algorithms:
            want = bytes_sent_per_rank(op, name, m, n)
            got = [per_rank[r][(op, name, EVEN_LENGTH)][0] for r in range(n)]
            assert got == pytest.approx(want, abs=0), f"{op} {name} on {n} ranks"
    sizes = C.chunk_sizes(ODD_LENGTH, n)
    for r in range(n):
        mine, right = sizes[r] * 4, sizes[(r + 1) % n] * 4
        total = ODD_LENGTH * 4
        assert per_rank[r][("reduce_scatter", "ring", ODD_LENGTH)][0] == total - mine
        assert per_rank[r][("reduce_scatter", "pairwise", ODD_LENGTH)][0] == total - mine
        assert per_rank[r][("all_gather", "ring", ODD_LENGTH)][0] == total - right
        assert per_rank[r][("all_reduce", "ring", ODD_LENGTH)][0] == 2 * total - mine - right
        assert per_rank[r][("all_reduce", "ring", ODD_LENGTH)][1] == 2 * (n - 1)
        ring_all_reduce, reduce_scatter_then_all_gather = per_rank[r]["identity"]
        assert ring_all_reduce == reduce_scatter_then_all_gather == 2 * (n - 1) * m // n


@pytest.mark.parametrize("world", ["cluster3", "cluster4"])
def test_bytes_sent_per_rank_match_the_formulas_on_real_ranks(world, request):
    cluster = request.getfixturevalue(world)
    _check(cluster.run(_bytes_sent_by_every_algorithm), cluster.world_size)


@pytest.mark.parametrize("n", [5, 6])
def test_bytes_sent_per_rank_match_the_formulas_on_simulated_ranks(n):
    _check(simulate(n, _bytes_sent_by_every_algorithm, rank_of_simulation), n)


def test_ring_all_reduce_sends_two_n_minus_one_over_n_of_the_buffer(cluster4):
    def moved():
        with C.counting() as stats:
            C.all_reduce(torch.ones(1 << 12), algorithm="ring")
        return stats

    for stats in cluster4.run(moved):
        assert stats.bytes_sent == stats.bytes_received == 2 * 3 * (4 << 12) // 4
        assert stats.messages_sent == stats.messages_received == 2 * 3


@pytest.mark.parametrize("n,ranks_per_node", [(4, 2), (6, 3), (6, 2)])
def test_hierarchical_all_reduce_bytes_and_result(n, ranks_per_node):
    def body():
        x = torch.full((EVEN_LENGTH,), float(rank_of_simulation()))
        with C.counting() as moved:
            C.hierarchical_all_reduce(x, ranks_per_node, "avg")
        return moved.bytes_sent, x

    for sent, x in simulate(n, body):
        assert sent == hierarchical_bytes_sent_per_rank(EVEN_LENGTH * 4, n, ranks_per_node)
        assert torch.equal(x, torch.full((EVEN_LENGTH,), (n - 1) / 2))


def test_comm_stats_reset_and_snapshot():
    stats = C.CommStats(1, 10, 2, 20)
    frozen = stats.snapshot()
    stats.reset()
    assert stats == C.CommStats() and frozen == C.CommStats(1, 10, 2, 20)
    assert (frozen - C.CommStats(1, 5, 0, 0)).as_dict() == {
        "messages_sent": 0,
        "bytes_sent": 5,
        "messages_received": 2,
        "bytes_received": 20,
    }
