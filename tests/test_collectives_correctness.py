"""Every from-scratch collective equals torch.distributed's, for every algorithm, at world sizes
2, 3 and 4, odd lengths, fp32/fp16/bf16 and sum/avg/max.

Inputs are small integers (0..16), so every partial sum is exact in every dtype (bf16 holds
integers up to 256 exactly) and results must match *bitwise* whatever the order of additions.
``avg`` is compared with "exact sum, then one division in the dtype", which is what every
algorithm here does, so it is bitwise too. Each world size runs its whole matrix inside ONE
``cluster.run`` (a call has fixed overhead) and returns the list of mismatches, which must be empty.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

from dtlab import collectives as C

LENGTHS = (1, 7, 1001)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
OPS = ("sum", "avg", "max")
TORCH_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def _input(length: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    return ((torch.arange(length) * 5 + rank * 11) % 17).to(dtype)


def _reference(length: int, dtype: torch.dtype, op: str) -> torch.Tensor:
    """torch.distributed's all-reduce of the same inputs, computed exactly in float64."""
    exact = _input(length, dist.get_rank(), torch.float64)
    dist.all_reduce(exact, op=TORCH_OPS[op])
    result = exact.to(dtype)
    return result.div_(dist.get_world_size()) if op == "avg" else result


def _mismatches_of_every_collective() -> list[str]:
    rank, n = dist.get_rank(), dist.get_world_size()
    bad: list[str] = []

    def expect(label: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            bad.append(f"rank {rank}: {label}")

    for length in LENGTHS:
        bounds = C.chunk_bounds(length, n)
        for dtype in DTYPES:
            mine = _input(length, rank, dtype)
            for op in OPS:
                want = _reference(length, dtype, op)
                for name, fn in C.ALGORITHMS["all_reduce"].items():
                    x = mine.clone()
                    fn(x, op)
                    expect(f"all_reduce {name} {op} {dtype} L={length}", x, want)
                for name, fn in C.ALGORITHMS["reduce_scatter"].items():
                    got = fn(mine.clone(), op)
                    expect(
                        f"reduce_scatter {name} {op} {dtype} L={length}",
                        got,
                        want[slice(*bounds[rank])],
                    )
                for name, fn in C.ALGORITHMS["reduce"].items():
                    root = length % n
                    x = mine.clone()
                    fn(x, root, op)
                    expect(
                        f"reduce {name} {op} {dtype} L={length}", x, want if rank == root else mine
                    )
            everyone = [torch.empty_like(mine) for _ in range(n)]
            dist.all_gather(everyone, mine)
            mine_chunk = mine[slice(*bounds[rank])]
            gathered = torch.cat([everyone[r][slice(*bounds[r])] for r in range(n)])
            for name, fn in C.ALGORITHMS["all_gather"].items():
                got = fn(mine_chunk.clone(), sizes=C.chunk_sizes(length, n))
                expect(f"all_gather {name} {dtype} L={length}", got, gathered)
            for root in range(n):
                want = mine.clone()
                dist.broadcast(want, src=root)
                for name, fn in C.ALGORITHMS["broadcast"].items():
                    x = mine.clone()
                    fn(x, root)
                    expect(f"broadcast {name} root={root} {dtype} L={length}", x, want)
        # all-to-all with uneven splits: rank i sends (i + j) % 3 rows of width 3 to rank j
        send = [(rank + j) % 3 for j in range(n)]
        recv = [(i + rank) % 3 for i in range(n)]
        x = _input(sum(send) * 3, rank, torch.float32).view(-1, 3)
        want = torch.empty(sum(recv), 3)
        dist.all_to_all_single(want, x, recv, send)
        expect(f"all_to_all uneven L={length}", C.all_to_all(x, send, recv), want)
        expect(f"all_to_all counts exchanged L={length}", C.all_to_all(x, send), want)
    C.barrier()
    return bad


@pytest.mark.parametrize("world", ["cluster2", "cluster3", "cluster4"])
def test_every_algorithm_matches_torch_distributed(world, request):
    cluster = request.getfixturevalue(world)
    mismatches = [m for per_rank in cluster.run(_mismatches_of_every_collective) for m in per_rank]
    assert mismatches == []


def _gather_scatter_subgroup_and_out_of_place() -> dict:
    rank, n = dist.get_rank(), dist.get_world_size()
    out = {}
    blocks = C.gather(torch.tensor([rank, rank * 2]), root=n - 1)
    out["gather"] = None if blocks is None else [b.tolist() for b in blocks]
    received = torch.empty(2, dtype=torch.int64)
    C.scatter(received, [torch.tensor([r, -r]) for r in range(n)] if rank == 0 else None)
    out["scatter"] = received.tolist()
    odd = [r for r in range(n) if r % 2 == 1]
    x = torch.full((5,), float(rank))
    if rank in odd:
        C.all_reduce(x, group=odd)
    out["odd_ranks_sum"] = x.tolist()
    pg = dist.new_group([0, 1])
    y = torch.full((3,), float(rank + 1))
    if rank in (0, 1):
        C.all_reduce(y, "max", algorithm="rabenseifner", group=pg)
    out["process_group_max"] = y.tolist()
    src = torch.arange(6.0).view(2, 3) + rank
    result = torch.empty(2, 3)
    C.all_reduce(src, out=result, algorithm="recursive_doubling")
    out["out_of_place_input_untouched"] = torch.equal(src, torch.arange(6.0).view(2, 3) + rank)
    out["out_of_place_result"] = result.flatten().tolist()
    strided = torch.ones(4, 4).t()  # non-contiguous input: worked on a copy, copied back
    C.all_reduce(strided, algorithm="ring")
    out["non_contiguous"] = strided.flatten().tolist()
    gathered = torch.full((n, n), -1.0)  # a reused output, as all_gather_into_tensor takes
    returned = C.all_gather(torch.full((n,), float(rank)), out=gathered)
    out["gathered_into_out"] = returned.data_ptr() == gathered.data_ptr()
    out["gathered"] = gathered.flatten().tolist()
    try:
        C.all_gather(torch.ones(2), out=torch.empty(3))
    except ValueError as error:
        out["wrong_out"] = str(error)
    return out


def test_gather_scatter_subgroups_and_out_of_place(cluster4):
    results = cluster4.run(_gather_scatter_subgroup_and_out_of_place)
    assert results[3]["gather"] == [[r, 2 * r] for r in range(4)]
    assert all(results[r]["gather"] is None for r in range(3))
    assert [r["scatter"] for r in results] == [[r, -r] for r in range(4)]
    assert [r["odd_ranks_sum"] for r in results] == [[0.0] * 5, [4.0] * 5, [2.0] * 5, [4.0] * 5]
    assert [r["process_group_max"] for r in results[:2]] == [[2.0] * 3, [2.0] * 3]
    assert all(r["out_of_place_input_untouched"] for r in results)
    want = [4 * v + 6 for v in range(6)]
    assert all(r["out_of_place_result"] == want for r in results)
    assert all(r["non_contiguous"] == [4.0] * 16 for r in results)
    assert all(r["gathered_into_out"] for r in results)
    assert all(r["gathered"] == [float(r_) for r_ in range(4) for _ in range(4)] for r in results)
    assert "of 8 elements (the sum of sizes)" in results[0]["wrong_out"]


def test_a_rank_outside_the_group_gets_a_clear_error(cluster2):
    def call_on_a_group_without_me():
        if dist.get_rank() == 0:
            C.all_reduce(torch.ones(2), group=[1])

    with pytest.raises(Exception, match="rank 0 is not in group"):
        cluster2.run(call_on_a_group_without_me)


def test_unknown_algorithm_lists_the_choices():
    with pytest.raises(ValueError, match="choose one of"):
        C.all_reduce(torch.ones(2), algorithm="butterfly")


def _pipelined_ring_mismatches() -> list[str]:
    """Many segments per chunk, windows of 1..4 receives ahead, both executors, on real gloo."""
    from dtlab.collectives import p2p
    from dtlab.collectives.ring_pipeline import pipelined_ring_all_reduce_

    bad, the_property = [], p2p.TorchTransport.streams
    for streams in (True, False):
        p2p.TorchTransport.streams = streams  # this rank's process only; restored below
        try:
            for length, segment_bytes, window in [
                (1001, 64, 1),
                (1001, 40, 4),
                (1001, 24, 8),
                (5, 4, 2),
            ]:
                for dtype in (torch.float32, torch.bfloat16):
                    for op in ("sum", "avg"):
                        x = _input(length, dist.get_rank(), dtype)
                        pipelined_ring_all_reduce_(
                            x, op, C.peers_of(), segment_bytes=segment_bytes, window=window
                        )
                        if not torch.equal(x, _reference(length, dtype, op)):
                            bad.append(f"streams={streams} L={length} {dtype} {op} W={window}")
        finally:
            p2p.TorchTransport.streams = the_property
    return bad


def test_the_pipelined_ring_matches_torch_with_many_segments_in_flight(cluster3):
    assert cluster3.run(_pipelined_ring_mismatches) == [[]] * 3


def test_the_pipelined_ring_draws_two_n_minus_one_steps_to_the_right_neighbour(cluster3):
    """Ten segments per chunk: every step starts before the previous one ends (its first
    segment leaves as soon as it is folded); one segment per chunk: none does."""

    def ring_in_segments(segment_bytes: int):
        from dtlab.collectives.ring_pipeline import pipelined_ring_all_reduce_

        x = torch.ones(3 * 1000)
        pipelined_ring_all_reduce_(x, "sum", C.peers_of(), segment_bytes=segment_bytes)

    for segment_bytes, overlaps in [(400, True), (4000, False)]:
        trace = cluster3.run(ring_in_segments, segment_bytes).trace
        for rank in range(3):
            steps = [s for s in trace.spans if s.rank == rank and s.kind == "comm"]
            assert [s.labels["comm_step"] for s in steps] == [0, 1, 2, 3]
            phases = [s.name.split()[-1] for s in steps]
            assert phases == ["reduce-scatter"] * 2 + ["all-gather"] * 2
            assert sum(s.nbytes for s in steps) == 2 * 2 * 1000 * 4  # 2(N-1)/N · M
            assert [b.start_ns < a.end_ns for a, b in itertools.pairwise(steps)] == [overlaps] * 3
        assert C.traffic_matrix(trace.spans, 3) == [[0, 16000, 0], [0, 0, 16000], [16000, 0, 0]]
