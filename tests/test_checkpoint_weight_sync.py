"""RL weight sync on ranks: funnel, gather + broadcast, resharded point to point — counted bytes."""

from __future__ import annotations

import pytest
import torch

from dtlab.checkpoint.weight_sync import SyncLayout
from dtlab.cost.weight_sync import rl_step_seconds, weight_sync_bytes

LAYOUT = SyncLayout(
    trainers=(0, 1),
    engines=(2, 3),
    shapes={"qkv": (8, 6), "proj": (6, 8), "fc": (12, 6)},
    engine_dims={"qkv": 0, "proj": 1, "fc": 0},  # column-, row-, column-parallel
)


def _weights() -> dict:
    g = torch.Generator().manual_seed(3)
    return {n: torch.randn(s, generator=g) for n, s in LAYOUT.shapes.items()}


def _sync(method: str) -> dict:
    import dtlab
    from dtlab.checkpoint.weight_sync import engine_slice, sync_weights, trainer_shards

    rank = dtlab.rank()
    out = sync_weights(LAYOUT, method, trainer_shards(LAYOUT, _weights(), rank))
    right = None
    if rank in LAYOUT.engines:
        want = engine_slice(LAYOUT, _weights(), rank)
        right = all(torch.equal(out["slices"][n], want[n]) for n in want)
    return {"bytes_sent": out["bytes_sent"], "right": right}


@pytest.mark.parametrize("method", ["funnel", "broadcast", "reshard"])
def test_every_engine_rank_ends_with_its_tp_slice_and_the_counted_bytes_match_the_formula(
    cluster4, method
):
    results = cluster4.run(_sync, method)
    assert [r["right"] for r in results] == [None, None, True, True]
    sent = [r["bytes_sent"] for r in results]
    formula = weight_sync_bytes(LAYOUT.num_params, 2, 2, method, bytes_per_param=4)
    assert max(sent) == formula["busiest_sender"], sent
    assert sum(sent) == formula["total"], sent


def test_resharding_sends_each_element_once_and_the_funnel_sends_it_once_per_engine():
    p = 1e9
    assert weight_sync_bytes(p, 8, 4, "reshard")["total"] == 2e9
    assert weight_sync_bytes(p, 8, 4, "reshard")["busiest_sender"] == 2e9 / 8
    assert weight_sync_bytes(p, 8, 4, "funnel")["busiest_sender"] == 4 * 2e9
    assert weight_sync_bytes(p, 8, 4, "broadcast")["busiest_sender"] == 2e9


def test_one_step_off_policy_overlaps_generation_with_training_only_when_disaggregated():
    assert rl_step_seconds(10, 30, 2, colocated=True) == 42
    assert rl_step_seconds(10, 30, 2, colocated=False) == 42
    assert rl_step_seconds(10, 30, 2, colocated=False, off_policy_steps=1) == 32


def test_a_rank_cannot_be_both_trainer_and_engine():
    with pytest.raises(ValueError, match="disaggregated"):
        SyncLayout((0, 1), (1, 2), {"w": (4, 4)}, {"w": 0})
