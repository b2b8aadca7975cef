"""NCCL's double binary tree all-reduce: the two trees have the promised shape, the schedule
equals torch's all-reduce on real ranks (2, 3, 4) and on simulated ranks (5 to 8) for every
dtype and op, pipelined in one or many segments, and every rank sends exactly the bytes and
messages :mod:`dtlab.cost` says."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dtlab import collectives as C
from dtlab.collectives.double_tree import all_reduce_double_binary_tree_
from dtlab.collectives.simulated import rank_of_simulation, simulate
from dtlab.cost import Link, bytes_sent_per_rank, collective_time
from dtlab.cost.collectives import terms
from dtlab.cost.trees import double_binary_trees, in_order_tree, tree_segments

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32)
OPS = ("sum", "avg", "max", "min")
LENGTHS = (1, 2, 7, 1001)
SEGMENTS = (None, 3, 64)  # None: the size rule, one segment for these small buffers
SEGMENTS_ON_REAL_RANKS = (None, 5)  # every step a real message costs: fewer, shorter pipelines


def test_every_rank_is_interior_in_at_most_one_tree_and_both_trees_span_the_ranks():
    for n in range(1, 130):
        first, second = double_binary_trees(n)
        for tree in (first, second):
            assert tree.parent.count(-1) == 1
            for r in range(n):
                assert len(tree.children[r]) <= 2
                for child in tree.children[r]:
                    assert tree.parent[child] == r and tree.depth[child] == tree.depth[r] + 1
            assert sum(len(c) for c in tree.children) == n - 1  # n - 1 edges: a spanning tree
            assert tree.height == n.bit_length() - 1  # floor(log2 n)
        assert not [r for r in range(n) if first.is_interior(r) and second.is_interior(r)]
        assert [r for r in range(n) if not first.is_interior(r)] == list(range(0, n, 2)) or n == 1


def test_the_second_tree_is_the_first_mirrored_for_even_and_shifted_for_odd_sizes():
    for n in (6, 7):
        first, second = in_order_tree(n), double_binary_trees(n)[1]
        rename = [n - 1 - r if n % 2 == 0 else (r + 1) % n for r in range(n)]
        for r in range(n):
            parent = first.parent[r]
            assert second.parent[rename[r]] == (-1 if parent < 0 else rename[parent])
    assert in_order_tree(6).parent == (1, 3, 1, -1, 5, 3)  # labels 1..6: root 4, then 2 and 6


def _input(length: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    return ((torch.arange(length) * 5 + rank * 11) % 17).to(dtype)


def _want(inputs: list[torch.Tensor], op: str) -> torch.Tensor:
    """The exact reduction (small integers: exact in every dtype), avg as the library does."""
    stacked = torch.stack([t.double() for t in inputs])
    exact = {"max": stacked.amax(0), "min": stacked.amin(0)}.get(op, stacked.sum(0))
    result = exact.to(inputs[0].dtype)
    if op == "avg":
        n = len(inputs)
        return result.div_(n) if result.is_floating_point() else result.floor_divide_(n)
    return result


def _double_tree_mismatches(n: int, rank: int, segment_counts=SEGMENTS) -> list[str]:
    bad = []
    for length in LENGTHS:
        for dtype in DTYPES:
            inputs = [_input(length, r, dtype) for r in range(n)]
            for op in OPS:
                want = _want(inputs, op)
                for segments in segment_counts:
                    x = inputs[rank].clone()
                    if segments is None:
                        C.all_reduce(x, op, algorithm="double_binary_tree")
                    else:
                        all_reduce_double_binary_tree_(x, op, C.peers_of(), segments=segments)
                    if not torch.equal(x, want):
                        bad.append(f"rank {rank} L={length} {dtype} {op} S={segments}")
    return bad


def _real_rank_mismatches() -> list[str]:
    rank, n = dist.get_rank(), dist.get_world_size()
    bad = _double_tree_mismatches(n, rank, SEGMENTS_ON_REAL_RANKS)
    for dtype, op in [(torch.float32, "sum"), (torch.bfloat16, "min"), (torch.int32, "max")]:
        builtin = _input(1001, rank, dtype)  # and against torch's own all-reduce, directly
        dist.all_reduce(builtin, op=getattr(dist.ReduceOp, op.upper()))
        ours = C.all_reduce(_input(1001, rank, dtype), op, algorithm="double_binary_tree")
        if not torch.equal(ours, builtin):
            bad.append(f"rank {rank}: differs from dist.all_reduce {dtype} {op}")
    return bad


@pytest.mark.parametrize("world", ["cluster2", "cluster3", "cluster4"])
def test_double_tree_matches_torch_on_real_ranks(world, request):
    cluster = request.getfixturevalue(world)
    assert [m for per_rank in cluster.run(_real_rank_mismatches) for m in per_rank] == []


@pytest.mark.parametrize("n", [5, 6, 7, 8])
def test_double_tree_is_exact_on_simulated_ranks(n):
    results = simulate(n, lambda: _double_tree_mismatches(n, rank_of_simulation()), timeout=60)
    assert results == [[]] * n


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("segments", [1, 4])
def test_double_tree_bytes_and_messages_per_rank_match_the_formula(n, segments):
    """Half the buffer up and down each tree: ``M/2 · (1 if not the root + children)`` bytes per
    tree, in ``S`` messages per edge."""
    length = 840 * 4  # divisible by 2 · S · n for every n and S here

    def body():
        with C.counting() as moved:
            x = torch.ones(length)
            all_reduce_double_binary_tree_(x, "sum", C.peers_of(), segments=segments)
        return moved.bytes_sent, moved.messages_sent, moved.bytes_received, x

    trees = double_binary_trees(n)
    want_bytes = bytes_sent_per_rank("all_reduce", "double_binary_tree", length * 4, n)
    for r, (sent, messages, received, x) in enumerate(simulate(n, body)):
        edges = sum((t.parent[r] >= 0) + len(t.children[r]) for t in trees)
        assert sent == received == want_bytes[r] == edges * length * 4 // 2
        assert messages == edges * segments
        assert torch.equal(x, torch.full((length,), float(n)))


def test_double_tree_sends_at_most_twice_the_buffer_where_one_tree_sends_three_times():
    m = 1 << 20
    for n in range(
        5, 65
    ):  # from 5 ranks on, rank 1 of the single tree has a parent and two children
        double = bytes_sent_per_rank("all_reduce", "double_binary_tree", m, n)
        single = bytes_sent_per_rank("all_reduce", "binary_tree", m, n)
        assert max(double) <= 2 * m and max(single) == 3 * m
        assert sum(double) == sum(single) == 2 * (n - 1) * m  # every edge, up and down


def test_double_tree_time_is_two_pipelines_of_height_plus_segments():
    link, m = Link(20e-6, 10e9), 32 << 20
    s, h = tree_segments(m), 3  # 32 MiB: 16 segments of 1 MiB per half; 8 ranks: height 3
    assert s == 16
    assert terms("all_reduce", "double_binary_tree", m, 8) == terms(
        "all_reduce", "double_binary_tree", m, 8, segments=16
    )
    expected = 2 * (h + s - 1) * (link.alpha_s + m / s / link.bandwidth_bytes_per_s)
    assert collective_time("all_reduce", "double_binary_tree", m, 8, link) == pytest.approx(
        expected
    )
    # two ranks: each step a rank sends one segment (it is the root of the other tree)
    assert terms("all_reduce", "double_binary_tree", m, 2, segments=1).bandwidth_bytes == m
