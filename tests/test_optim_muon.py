"""Distributed Muon: replicated vs owner orthogonalisation — equal updates, counted bytes, FLOPs."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dtlab.optim.muon import (
    muon_bytes_per_rank,
    muon_flops_per_rank,
    muon_update,
    newton_schulz,
    newton_schulz_flops,
    plan_owners,
)

SHAPES = [(12, 8), (8, 24), (16, 16), (4, 12)]


def _momenta() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in SHAPES]


def test_newton_schulz_brings_every_singular_value_near_one():
    m = torch.randn(16, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    s = torch.linalg.svdvals(newton_schulz(m))
    assert s.min() > 0.6 and s.max() < 1.25  # the quintic's tuned band, not exact 1
    left, _, right = torch.linalg.svd(m, full_matrices=False)
    cos = (newton_schulz(m) * (left @ right)).sum() / (16**0.5 * newton_schulz(m).norm())
    assert cos > 0.95  # points along U Vᵀ


def test_newton_schulz_flops_count_the_three_matmuls_per_step():
    assert newton_schulz_flops(8, 24, steps=1) == 4 * 8 * 8 * 24 + 2 * 8**3
    assert newton_schulz_flops(24, 8) == newton_schulz_flops(8, 24)  # tall: transposed


def _sharded(strategy: str) -> dict:
    from dtlab.comm import Communicator
    from dtlab.optim.muon import sharded_muon_updates

    comm = Communicator(collectives="dtlab")
    shards = [m.reshape(-1).chunk(comm.world_size)[comm.rank].clone() for m in _momenta()]
    with FlopCounterMode(display=False) as flops:  # torch counts every matmul this rank runs
        updates = sharded_muon_updates(shards, SHAPES, comm, strategy)
    return {
        "updates": updates,
        "bytes": comm.comm_stats.bytes_sent,
        "flops": flops.get_total_flops(),
    }


@pytest.mark.parametrize("strategy", ["replicated", "owner"])
def test_each_rank_gets_its_slice_of_the_single_process_update_to_the_bit(cluster4, strategy):
    whole = [muon_update(m).reshape(-1).chunk(4) for m in _momenta()]
    results = cluster4.run(_sharded, strategy)
    for rank, result in enumerate(results):
        for got, want in zip(result["updates"], whole, strict=True):
            assert torch.equal(got, want[rank])
    assert [r["bytes"] for r in results] == muon_bytes_per_rank(SHAPES, 4, strategy, 8)


@pytest.mark.parametrize("strategy", ["replicated", "owner"])
def test_matmul_flops_counted_on_each_rank_equal_the_newton_schulz_formula(cluster4, strategy):
    """Counted by torch's FlopCounterMode on each rank: Newton–Schulz on whole matrices (a shard
    would count far fewer), every matrix on every rank when replicated, the owned ones only."""
    counted = [r["flops"] for r in cluster4.run(_sharded, strategy)]
    assert counted == muon_flops_per_rank(SHAPES, 4, strategy)


def test_owners_move_fewer_bytes_and_split_the_flops():
    replicated = muon_bytes_per_rank(SHAPES, 4, "replicated")
    owner = muon_bytes_per_rank(SHAPES, 4, "owner")
    assert sum(owner) * 4 / 2 == pytest.approx(sum(replicated))  # 2(N-1)/N vs (N-1) per matrix
    flops = muon_flops_per_rank(SHAPES, 4, "owner")
    assert sum(flops) == muon_flops_per_rank(SHAPES, 4, "replicated")[0]
    assert sorted(plan_owners(SHAPES, 4)) == [0, 1, 2, 3]  # four matrices, one per rank
