"""Collective timeouts: detection cost against false positives, and the short training timeout."""

from __future__ import annotations

import math

import pytest

import dtlab
from dtlab.faults.timeouts import best_timeout, false_positive_share, lost_seconds_per_hour


def test_best_timeout_is_where_the_loss_is_smallest():
    args = dict(hangs_per_hour=0.1, restart_s=600.0, pauses_per_hour=6.0, pause_mean_s=30.0)
    best = best_timeout(**args)
    assert best == pytest.approx(30 * math.log(6 * 600 / (0.1 * 30)))  # 212.7 s
    at_best = lost_seconds_per_hour(best, **args)
    for other in (best / 2, best * 0.9, best * 1.1, best * 2):
        assert lost_seconds_per_hour(other, **args) > at_best


def test_a_short_timeout_restarts_on_healthy_pauses():
    assert false_positive_share(30.0, 30.0) == pytest.approx(math.exp(-1))
    assert best_timeout(1.0, 60.0, 0.01, 30.0) == 0.0  # pauses too rare to matter


def _short_timeout_fires_first(short_s: float, sleep_s: float) -> dict:
    import time

    import torch
    import torch.distributed as dist

    from dtlab.runtime.torchrun import set_training_timeout

    applied = set_training_timeout(short_s)
    if dist.get_rank() == 1:
        time.sleep(sleep_s)  # a silent peer: it never posts the all-reduce
        return {"applied": applied, "woke": time.time()}
    try:
        dist.all_reduce(torch.ones(1))
    except RuntimeError as error:
        return {"applied": applied, "error": str(error)[:200], "caught": time.time()}
    return {"applied": applied, "error": None}


def test_the_shortened_training_timeout_fires_before_a_silent_peer_wakes():
    """The group was joined with the Cluster's long collective timeout; after the barrier it is
    1 s, so rank 0's all-reduce gives up while rank 1 still sleeps (ordering, not durations)."""
    with dtlab.Cluster(2, device="cpu", timeout=60) as cluster:
        first, second = cluster.run(_short_timeout_fires_first, 1.0, 8.0)
    assert first["applied"] and second["applied"]
    assert first["error"] is not None and "imed out" in first["error"], first
    assert first["caught"] < second["woke"]


def _without_set_pg_timeout() -> dict:
    import warnings

    import torch
    import torch.distributed as dist

    from dtlab.runtime.torchrun import set_training_timeout

    c10d = dist.distributed_c10d
    kept = c10d._set_pg_timeout
    del c10d._set_pg_timeout  # a torch without the private setter
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            applied = set_training_timeout(1.0)
        total = torch.ones(1)
        dist.all_reduce(total)  # the group still works, with its start-up timeout
    finally:
        c10d._set_pg_timeout = kept
    return {"applied": applied, "warnings": [str(w.message) for w in caught], "sum": total.item()}


def test_without_torchs_private_setter_the_start_up_timeout_stays_with_a_warning(cluster2):
    for result in cluster2.run(_without_set_pg_timeout):
        assert result["applied"] is False
        assert any("_set_pg_timeout" in w for w in result["warnings"]), result["warnings"]
        assert result["sum"] == 2.0
