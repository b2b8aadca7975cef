"""World sizes the CPU cannot afford as processes (5, 6, 7) run as threads: every algorithm's
schedule still delivers exactly the reduction, for odd lengths, every root and sum/avg/max."""

from __future__ import annotations

import pytest
import torch

from dtlab import collectives as C
from dtlab.collectives.simulated import rank_of_simulation, simulate


def _mismatches(n: int, length: int, op: str) -> list[str]:
    rank = rank_of_simulation()
    inputs = [((torch.arange(length) * 3 + r * 7) % 13).to(torch.bfloat16) for r in range(n)]
    stacked = torch.stack([t.double() for t in inputs])
    want = (stacked.max(0).values if op == "max" else stacked.sum(0)).to(torch.bfloat16)
    want = want.div_(n) if op == "avg" else want
    bounds = C.chunk_bounds(length, n)
    bad = []
    for name, fn in C.ALGORITHMS["all_reduce"].items():
        x = inputs[rank].clone()
        if not torch.equal(fn(x, op), want):
            bad.append(f"all_reduce {name}")
    for name, fn in C.ALGORITHMS["reduce_scatter"].items():
        if not torch.equal(fn(inputs[rank].clone(), op), want[slice(*bounds[rank])]):
            bad.append(f"reduce_scatter {name}")
    gathered = torch.cat([inputs[r][slice(*bounds[r])] for r in range(n)])
    for name, fn in C.ALGORITHMS["all_gather"].items():
        got = fn(inputs[rank][slice(*bounds[rank])].clone(), sizes=C.chunk_sizes(length, n))
        if not torch.equal(got, gathered):
            bad.append(f"all_gather {name}")
    for root in range(n):
        for name, fn in C.ALGORITHMS["broadcast"].items():
            if not torch.equal(fn(inputs[rank].clone(), root), inputs[root]):
                bad.append(f"broadcast {name} root {root}")
        for name, fn in C.ALGORITHMS["reduce"].items():
            got = fn(inputs[rank].clone(), root, op)
            if not torch.equal(got, want if rank == root else inputs[rank]):
                bad.append(f"reduce {name} root {root}")
    C.barrier()
    return bad


@pytest.mark.parametrize("n", [5, 6, 7])
def test_every_schedule_is_correct_at_world_sizes_beyond_the_cpu(n):
    for length, op in [(1, "sum"), (13, "avg"), (101, "max")]:
        assert simulate(n, _mismatches, n, length, op) == [[]] * n


def test_a_mismatched_schedule_is_reported_not_hung():
    def only_rank_zero_receives():
        if rank_of_simulation() == 0:
            C.peers_of().recv(1, torch.empty(1), name="lonely")

    with pytest.raises(RuntimeError, match="never came"):
        simulate(2, only_rank_zero_receives, timeout=0.2)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_sliced_ring_pipeline_gives_the_same_sum_and_the_same_bytes(n):
    """Large buffers run the ring as staggered slices; force it with tiny slices."""
    from dtlab.collectives.allreduce import all_reduce_ring_

    def body(length: int, chunk_bytes: int):
        rank = rank_of_simulation()
        x = ((torch.arange(length) * 3 + rank * 5) % 11).float()
        with C.counting() as moved:
            all_reduce_ring_(x, "avg", C.peers_of(), chunk_bytes=chunk_bytes)
        return x, moved.bytes_sent, moved.messages_sent

    for length, chunk_bytes in [(13, 4), (40, 8), (960, 16)]:
        inputs = torch.stack([((torch.arange(length) * 3 + r * 5) % 11).float() for r in range(n)])
        want = inputs.sum(0) / n
        for x, sent, messages in simulate(n, body, length, chunk_bytes):
            assert torch.equal(x, want)
            if length == 960:  # 960 / (4n) slices of 4n elements each (n divides 960)
                assert sent == 2 * (n - 1) * 960 * 4 // n
                assert messages == 2 * (n - 1) * 960 // (n * 4)
