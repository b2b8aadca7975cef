"""A BF16 all-reduce is not exact: the ring rounds hop by hop, FP32 accumulation rounds once."""

from __future__ import annotations

import pytest
import torch

from dtlab import collectives as C
from dtlab.collectives.reduction_precision import (
    gradient_like,
    measure_reduction_errors,
    reduction_error_table,
    relative_error,
    simulated_ring_sum,
    simulated_tree_sum,
)
from dtlab.collectives.simulated import simulate


def test_real_ranks_reproduce_the_one_process_replay_bit_for_bit(cluster4):
    results = cluster4.run(measure_reduction_errors, 1001, 3)
    for r in results:
        assert r["ring_matches_simulation"] == 1.0 and r["tree_matches_simulation"] == 1.0
        assert r["ring_bf16"] > r["ring_fp32"]
        assert r["ring_fp32"] == pytest.approx(r["rounding_floor"], rel=1e-9)


def test_eight_simulated_ranks_match_the_replay_too():
    results = simulate(8, measure_reduction_errors, 777, 1, timeout=60)
    assert all(r["ring_matches_simulation"] == 1.0 for r in results)
    assert all(r["tree_matches_simulation"] == 1.0 for r in results)


def test_ring_error_grows_with_ranks_tree_and_fp32_do_not():
    rows = {row["ranks"]: row for row in reduction_error_table([4, 64], numel=2048)}
    assert rows[64]["ring_bf16"] > 2 * rows[4]["ring_bf16"]
    assert rows[64]["tree_bf16"] < 1.5 * rows[4]["tree_bf16"]
    for row in rows.values():
        assert row["ring_fp32"] < 1.05 * row["rounding_floor"]
        assert row["ring_bf16"] > row["tree_bf16"] >= row["rounding_floor"] * 0.99


def test_replays_follow_the_ring_and_pair_orders():
    xs = [torch.tensor([1.0, 2.0], dtype=torch.bfloat16) * (r + 1) for r in range(4)]
    assert torch.equal(simulated_ring_sum(xs), sum(xs))  # small integers: exact in any order
    x = [torch.tensor([256.0], dtype=torch.bfloat16)] + [
        torch.tensor([1.0], dtype=torch.bfloat16)
    ] * 3
    # ring from rank 1: 1 + 1 + 1 = 3, + 256 = 259 -> 260 in BF16; pairs: 257 -> 256, 2, 258
    assert simulated_ring_sum(x).item() == 260.0
    assert simulated_tree_sum(x).item() == 258.0
    with pytest.raises(ValueError, match="power-of-two"):
        simulated_tree_sum(x[:3])


def test_inputs_and_errors_are_well_formed():
    assert gradient_like(0, 10).dtype == torch.bfloat16
    assert not torch.equal(gradient_like(0, 10), gradient_like(1, 10))
    assert relative_error(torch.ones(3), torch.ones(3)) == 0.0
    with pytest.raises(ValueError, match="numel"):
        gradient_like(0, 0)
    assert C.peers_of(None).size == 1
