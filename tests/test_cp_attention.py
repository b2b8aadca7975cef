"""Ring, Ulysses and all-gather-K/V attention on real ranks equal one process's full attention, and move the
bytes their formulas say.

Every rank builds the same full q, k, v (B=2, S=16, fp64), takes its shard (contiguous or
zig-zag), runs the parallel attention and its backward, and compares its slice of the output and
of the q, k, v gradients with single-process :func:`math_attention` through autograd. Only the
order of floating-point sums differs, so fp64 agrees far inside :data:`TOLERANCE`.
"""

from __future__ import annotations

import pytest
import torch

TOLERANCE = 1e-10
B, S, DH = 2, 16, 8


def _full(heads: int, kv_heads: int):
    g = torch.Generator().manual_seed(0)
    q, k, v, d_out = (
        torch.randn(B, h, S, DH, generator=g, dtype=torch.float64)
        for h in (heads, kv_heads, kv_heads, heads)
    )
    return q, k, v, d_out


def _attention_on_rank(method: str, style: str, causal: bool, heads: int, kv_heads: int) -> dict:
    from dtlab.comm import Communicator
    from dtlab.models.attention import math_attention
    from dtlab.parallel.context import (
        AttentionWork,
        allgather_attention,
        ring_attention,
        shard_sequence,
        ulysses_attention,
    )

    comm = Communicator(None, collectives="dtlab", dim="cp")
    q, k, v, d_out = _full(heads, kv_heads)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out = math_attention(*ref, torch.arange(S), torch.arange(S), causal=causal)
    ref_out.backward(d_out)

    def mine(t):
        return shard_sequence(t, comm.world_size, comm.rank, style, dim=2)[0]

    pos = shard_sequence(q, comm.world_size, comm.rank, style, dim=2)[1]
    local = [mine(t).requires_grad_() for t in (q, k, v)]
    work = AttentionWork()
    before = comm.comm_stats.snapshot()
    if method == "ring":
        out = ring_attention(*local, pos, pos, comm, causal=causal, work=work)
    elif method == "allgather":
        out = allgather_attention(*local, pos, pos, comm, causal=causal)
    else:
        out = ulysses_attention(*local, pos, pos, comm, causal=causal)
    forward = (comm.comm_stats - before).bytes_by_op
    out.backward(mine(d_out))
    both = (comm.comm_stats - before).bytes_by_op
    errors = [(out - mine(ref_out)).abs().max().item()]
    errors += [(t.grad - mine(r.grad)).abs().max().item() for t, r in zip(local, ref, strict=True)]
    return {
        "error": max(errors),
        "forward": forward,
        "both": both,
        "unmasked": work.unmasked_scores,
        "skipped": work.blocks_skipped,
        "flops": work.forward_flops,
    }


@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_output_and_qkv_gradients_equal_full_attention(world, request):
    cluster = request.getfixturevalue(f"cluster{world}")
    for style in ("contiguous", "zigzag"):
        for causal in (True, False):
            for result in cluster.run(_attention_on_rank, "ring", style, causal, 4, 2):
                assert result["error"] < TOLERANCE, (style, causal, result["error"])


@pytest.mark.parametrize("world", [2, 4])
def test_ring_bytes_per_rank_match_formula(world, request):
    """Forward: N−1 K/V blocks (with their positions) to the right neighbour. Backward: the K/V
    blocks again, plus N dK/dV accumulators (the last one lands home)."""
    cluster = request.getfixturevalue(f"cluster{world}")
    kv = 2 * B * 2 * (S // world) * DH * 8  # k and v: 2 KV heads, fp64
    positions = (S // world) * 8  # int64
    for result in cluster.run(_attention_on_rank, "ring", "zigzag", True, 4, 2):
        assert result["forward"] == {"ring_send": (world - 1) * (kv + positions)}
        assert result["both"]["ring_send"] == 2 * (world - 1) * (kv + positions) + world * kv


def test_zigzag_balances_causal_work_and_contiguous_does_not(cluster4):
    """Unmasked score elements per rank (counted as the ring computes them): zig-zag gives every
    rank the same; contiguous gives rank r (2r+1)·(S/N)²/2-ish, growing with r."""
    total = S * (S + 1) // 2  # the causal triangle, diagonal included
    zigzag = [r["unmasked"] for r in cluster4.run(_attention_on_rank, "ring", "zigzag", True, 4, 2)]
    contiguous = [r for r in cluster4.run(_attention_on_rank, "ring", "contiguous", True, 4, 2)]
    assert sum(zigzag) == total and len(set(zigzag)) == 1
    counts = [r["unmasked"] for r in contiguous]
    assert sum(counts) == total and counts == sorted(counts) and counts[-1] > 3 * counts[0]
    assert [r["skipped"] for r in contiguous] == [3, 2, 1, 0]  # fully masked blocks not computed


@pytest.mark.parametrize("world", [2, 4])
def test_zigzag_executes_the_same_matmul_flops_on_every_rank(world, request):
    """FLOPs counted from the sub-blocks each rank actually multiplies. Zig-zag: the own block
    whole (2c × 2c for chunk c = S/2N) and half of every other block (2c × c), so every rank
    executes 4·B·H·Dh·c²·(4 + 2(N−1)); contiguous ranks differ (rank 0 only its diagonal). A
    ring that computed partly masked blocks in full would execute 4·N·c² per rank instead."""
    cluster = request.getfixturevalue(f"cluster{world}")
    heads, chunk = 4, S // (2 * world)
    zigzag = [r["flops"] for r in cluster.run(_attention_on_rank, "ring", "zigzag", True, heads, 2)]
    assert zigzag == [4 * B * heads * DH * chunk**2 * (4 + 2 * (world - 1))] * world
    contiguous = [
        r["flops"] for r in cluster.run(_attention_on_rank, "ring", "contiguous", True, heads, 2)
    ]
    block = 4 * B * heads * DH * (S // world) ** 2
    assert contiguous == [block * (r + 1) for r in range(world)]


@pytest.mark.parametrize("world", [2, 4])
def test_ulysses_output_and_qkv_gradients_equal_full_attention(world, request):
    cluster = request.getfixturevalue(f"cluster{world}")
    kv_heads = world  # Ulysses needs cp to divide the KV heads
    for style, causal in (("contiguous", True), ("zigzag", True), ("contiguous", False)):
        for result in cluster.run(_attention_on_rank, "ulysses", style, causal, 4, kv_heads):
            assert result["error"] < TOLERANCE, (style, causal, result["error"])


@pytest.mark.parametrize("world", [2, 4])
def test_ulysses_all_to_all_bytes_per_rank_match_formula(world, request):
    """Each all-to-all keeps 1/N of its rows: q, k, v in, the output back; the backward mirrors
    it. Positions are all-gathered once per call."""
    cluster = request.getfixturevalue(f"cluster{world}")
    heads, kv_heads = 4, world
    per_head = B * (S // world) * DH * 8  # one head of this rank's tokens, fp64
    forward = (world - 1) * per_head * (2 * heads + 2 * kv_heads) // world
    positions = (world - 1) * (S // world) * 8
    for result in cluster.run(_attention_on_rank, "ulysses", "contiguous", True, heads, kv_heads):
        assert result["forward"] == {"all_to_all": forward, "all_gather": positions}
        assert result["both"]["all_to_all"] == 2 * forward


@pytest.mark.parametrize("world", [2, 4])
def test_allgather_kv_attention_equals_full_attention_and_moves_the_ring_volume(world, request):
    """Llama 3's variant: all-gather k and v ((N−1)·kv per rank), reduce-scatter dK, dV back."""
    cluster = request.getfixturevalue(f"cluster{world}")
    kv = 2 * B * 2 * (S // world) * DH * 8
    positions = (world - 1) * (S // world) * 8
    for style, causal in (("zigzag", True), ("contiguous", False)):
        for result in cluster.run(_attention_on_rank, "allgather", style, causal, 4, 2):
            assert result["error"] < TOLERANCE, (style, causal, result["error"])
            assert result["forward"] == {"all_gather": (world - 1) * kv + positions}
            assert result["both"]["reduce_scatter"] == (world - 1) * kv


def test_ring_traffic_goes_only_to_the_right_neighbour_and_each_step_is_drawn(cluster4):
    """The trace of one forward + backward: 2(N−1) K/V steps and N dK/dV steps per rank, each a
    ``comm`` span; every byte goes from rank r to rank r+1 (mod N)."""
    from dtlab import collectives as C

    result = cluster4.run(_attention_on_rank, "ring", "zigzag", True, 4, 2)
    spans = result.trace.spans
    sent = result[0]["both"]["ring_send"]
    expected = [[sent if dst == (src + 1) % 4 else 0 for dst in range(4)] for src in range(4)]
    assert C.traffic_matrix(spans, 4) == expected
    for rank in range(4):
        mine = [s for s in spans if s.rank == rank and s.kind == "comm"]
        assert sum(s.name == "ring_kv" for s in mine) == 2 * 3
        assert sum(s.name == "ring_dkv" for s in mine) == 4
        computed = [s for s in spans if s.rank == rank and s.name == "ring_block_forward"]
        assert len(computed) == 4  # zig-zag: no block is fully masked, so none is skipped


# S = 7 over 2 ranks: rank 0 holds 4 tokens, rank 1 holds 3 — contiguous, or zig-zag's
# head-and-tail chunks. No shard_sequence call makes this (it refuses); a hand-cut batch does.
UNEVEN = {"contiguous": ([0, 1, 2, 3], [4, 5, 6]), "zigzag": ([0, 1, 5, 6], [2, 3, 4])}


def _uneven_on_rank(method: str, layout: str, collectives: str) -> dict:
    import dtlab
    from dtlab.comm import Communicator
    from dtlab.parallel.context import allgather_attention, ring_attention, ulysses_attention

    comm = Communicator(None, collectives=collectives, dim="cp")
    g = torch.Generator().manual_seed(0)
    positions = torch.tensor(UNEVEN[layout][comm.rank])
    q, k, v = (torch.randn(B, h, 7, DH, generator=g)[:, :, positions] for h in (4, 2, 2))
    attention = {"ring": ring_attention, "ulysses": ulysses_attention}.get(
        method, allgather_attention
    )
    try:
        attention(q, k, v, positions, positions, comm)
    except dtlab.collectives.CollectiveMismatch as error:
        return {"error": str(error), "bytes": comm.comm_stats.bytes_sent}
    return {"error": None, "bytes": comm.comm_stats.bytes_sent}


def _raise_uneven(method: str, layout: str, collectives: str) -> None:
    result = _uneven_on_rank(method, layout, collectives)
    if result["error"] is not None:
        raise ValueError(result["error"])


UNEVEN_CASES = [
    ("ring", "contiguous", "torch"),
    ("ring", "zigzag", "torch"),
    ("ring", "zigzag", "dtlab"),
    ("ulysses", "contiguous", "torch"),
    ("ulysses", "contiguous", "dtlab"),
    ("allgather", "contiguous", "torch"),
]


@pytest.mark.parametrize(("method", "layout", "collectives"), UNEVEN_CASES)
def test_uneven_cp_shards_raise_on_every_rank_naming_each_length_before_anything_moves(
    cluster2, method, layout, collectives
):
    """4 + 3 tokens used to abort a rank inside gloo (SIGABRT, RankDied without a reason). Now
    both ranks compare shapes first and raise the same error; no payload byte was counted."""
    results = cluster2.run(_uneven_on_rank, method, layout, collectives)
    for result in results:
        message = result["error"]
        assert message is not None
        name = {"ring": "ring", "ulysses": "Ulysses", "allgather": "all-gather"}[method]
        assert f"{name} attention needs every cp rank to hold the same number of tokens" in message
        assert "rank 0: 4; rank 1: 3 (7 in all)" in message
        assert "pad the sequence to a multiple of 2·cp = 4 (zig-zag) or cp = 2" in message
        assert "shard_sequence(x, cp, rank, style, dim=2)" in message
        assert result["bytes"] == 0
    assert results[0]["error"] == results[1]["error"]


def test_after_an_uneven_cp_refusal_the_cluster_still_runs_cp_attention(cluster2):
    """The refusal is a plain exception on every rank (RankError), not a dead rank; the next run
    on the same ranks computes ring attention exactly."""
    from dtlab.runtime.errors import RankError

    with pytest.raises(RankError) as raised:
        cluster2.run(_raise_uneven, "ring", "contiguous", "torch")
    assert "ranks [0, 1] all raised" in str(raised.value)
    assert "rank 0: 4; rank 1: 3" in str(raised.value)
    for result in cluster2.run(_attention_on_rank, "ring", "zigzag", True, 4, 2):
        assert result["error"] < TOLERANCE


def _mismatched_batch_on_rank() -> str:
    import dtlab
    from dtlab.comm import Communicator
    from dtlab.parallel.context import ring_attention

    comm = Communicator(None, collectives="torch", dim="cp")
    rows = 2 if comm.rank == 0 else 1
    q, k, v = (torch.randn(rows, 2, 4, DH) for _ in range(3))
    positions = torch.arange(4 * comm.rank, 4 * comm.rank + 4)
    with pytest.raises(dtlab.collectives.CollectiveMismatch) as error:
        ring_attention(q, k, v, positions, positions, comm)
    return str(error.value)


def test_cp_ranks_with_different_batch_sizes_are_refused_by_name(cluster2):
    for message in cluster2.run(_mismatched_batch_on_rank):
        assert "the same batch size (B)" in message and "rank 0: 2; rank 1: 1" in message
