"""Recursive-halving reduce-scatter (Thakur, Rabenseifner & Gropp 2005): equal to torch's
reduce-scatter on real ranks (2, 3, 4) and exact on simulated ranks (5 to 8, folding in when the
group is not a power of two) for every dtype and op and uneven lengths; each rank sends exactly
the bytes of :func:`dtlab.cost.bytes_sent_per_rank` in ``log2 N`` (+2) messages."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dtlab import collectives as C
from dtlab.collectives.simulated import rank_of_simulation, simulate
from dtlab.cost import bytes_sent_per_rank
from dtlab.cost.collectives import AlphaBetaTerms, terms

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32)
OPS = ("sum", "avg", "max", "min")
LENGTHS = (1, 5, 13, 1001)


def _input(length: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    return ((torch.arange(length) * 5 + rank * 11) % 17).to(dtype)


def _want(inputs: list[torch.Tensor], op: str) -> torch.Tensor:
    stacked = torch.stack([t.double() for t in inputs])
    exact = {"max": stacked.amax(0), "min": stacked.amin(0)}.get(op, stacked.sum(0))
    result = exact.to(inputs[0].dtype)
    if op == "avg":
        n = len(inputs)
        return result.div_(n) if result.is_floating_point() else result.floor_divide_(n)
    return result


def _mismatches(n: int, rank: int) -> list[str]:
    bad = []
    for length in LENGTHS:
        mine = C.chunk_bounds(length, n)[rank]
        for dtype in DTYPES:
            inputs = [_input(length, r, dtype) for r in range(n)]
            for op in OPS:
                got = C.reduce_scatter(inputs[rank].clone(), op, algorithm="recursive_halving")
                if not torch.equal(got, _want(inputs, op)[slice(*mine)]):
                    bad.append(f"rank {rank} L={length} {dtype} {op}")
    return bad


def _real_rank_mismatches() -> list[str]:
    rank, n = dist.get_rank(), dist.get_world_size()
    bad = _mismatches(n, rank)
    length = 12 * n  # torch's reduce_scatter_tensor needs equal chunks
    for dtype, op in [(torch.float32, "sum"), (torch.bfloat16, "max"), (torch.int32, "min")]:
        x = _input(length, rank, dtype)
        builtin = torch.empty(length // n, dtype=dtype)
        dist.reduce_scatter_tensor(builtin, x, op=getattr(dist.ReduceOp, op.upper()))
        if not torch.equal(C.reduce_scatter(x, op, algorithm="recursive_halving"), builtin):
            bad.append(f"rank {rank}: differs from dist.reduce_scatter_tensor {dtype} {op}")
    return bad


@pytest.mark.parametrize("world", ["cluster2", "cluster3", "cluster4"])
def test_recursive_halving_matches_torch_on_real_ranks(world, request):
    cluster = request.getfixturevalue(world)
    assert [m for per_rank in cluster.run(_real_rank_mismatches) for m in per_rank] == []


@pytest.mark.parametrize("n", [5, 6, 7, 8])
def test_recursive_halving_is_exact_on_simulated_ranks(n):
    assert simulate(n, lambda: _mismatches(n, rank_of_simulation()), timeout=60) == [[]] * n


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 12])
def test_recursive_halving_bytes_and_messages_per_rank_match_the_formula(n):
    """Power of two: ``(N-1)/N · M`` in ``log2 N`` messages, like the ring in fewer steps. Else
    the even ranks of the first ``2 (N-p)`` send ``M`` once; their partners one chunk more."""
    length = 27720  # divisible by 1..12

    def body():
        with C.counting() as moved:
            C.reduce_scatter(torch.ones(length), algorithm="recursive_halving")
        return moved.bytes_sent, moved.messages_sent

    p = 1 << (n.bit_length() - 1)
    extra, rounds = n - p, p.bit_length() - 1
    want = bytes_sent_per_rank("reduce_scatter", "recursive_halving", length * 4, n)
    for r, (sent, messages) in enumerate(simulate(n, body)):
        assert sent == want[r]
        folded_away = r < 2 * extra and r % 2 == 0
        assert messages == (1 if folded_away else rounds + (r < 2 * extra))
    if n == p:
        assert want == bytes_sent_per_rank("reduce_scatter", "ring", length * 4, n)


def test_recursive_halving_time_is_log_latencies_with_the_rings_bytes():
    m = 1e6
    assert terms("reduce_scatter", "recursive_halving", m, 8) == AlphaBetaTerms(3, 7 / 8 * m)
    assert terms("reduce_scatter", "ring", m, 8) == AlphaBetaTerms(7, 7 / 8 * m)
    # 6 ranks: fold M; halve over 4 ranks speaking for 2, 2, 1, 1 chunks, so the largest halves
    # sent are 2+2 and then 2 chunks; unfold one chunk
    assert terms("reduce_scatter", "recursive_halving", m, 6) == AlphaBetaTerms(
        4, pytest.approx(m + 4 * m / 6 + 2 * m / 6 + m / 6)
    )
