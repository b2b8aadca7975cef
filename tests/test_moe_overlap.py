"""Two micro-batches through one MoE block: each all-to-all hidden under the other micro-batch's
attention or experts, equal to running them one after the other. The overlap is asserted by
ordering — each wait begins after the compute that hides it — never by wall-clock."""

from __future__ import annotations

import uuid

import pytest

from dtlab.parallel.expert.overlap import measure_two_microbatch_overlap


def test_overlapped_schedule_equals_sequential_and_moves_the_same_bytes(cluster2):
    result = measure_two_microbatch_overlap(cluster2, tokens=32, dim=8, rounds=1)
    assert result.equal
    assert all(b > 0 for b in result.bytes_per_rank)
    assert set(result.exposed_s) == set(result.step_s) == {"sequential", "overlapped"}
    assert all(v > 0 for v in result.exposed_s.values())


def _one(schedule: str, run_id: str):
    import torch
    import torch.distributed as dist

    from dtlab import trace
    from dtlab.comm import Communicator
    from dtlab.parallel.expert.exchange import TokenExchange
    from dtlab.parallel.expert.overlap import SCHEDULES, _Parts

    parts = _Parts(8, 4, 2, TokenExchange(Communicator(None, collectives="dtlab", dim="ep")))
    g = torch.Generator().manual_seed(dist.get_rank())
    with trace.labels(run_id=run_id):  # spans a late message of an earlier run left are not ours
        SCHEDULES[schedule](parts, [torch.randn(2, 8, 8, generator=g) for _ in range(2)])


def _spans_of(cluster, schedule: str):
    run_id = uuid.uuid4().hex
    spans = cluster.run(_one, schedule, run_id).trace.spans
    return [s for s in spans if s.labels.get("run_id") == run_id]


def _span(spans, rank, name, micro_batch):
    (found,) = [
        s
        for s in spans
        if s.rank == rank and s.name == name and s.labels.get("micro_batch") == micro_batch
    ]
    return found


def test_each_wait_begins_after_the_compute_that_hides_it(cluster2):
    spans = _spans_of(cluster2, "overlapped")
    for rank in (0, 1):
        # A's dispatch waits for B's attention, B's dispatch for A's experts, A's combine for
        # B's experts: each transfer was in flight while the other micro-batch computed
        for wait, mb, compute, other in (
            ("wait:moe_dispatch", 0, "attention", 1),
            ("wait:moe_dispatch", 1, "moe_experts", 0),
            ("wait:moe_combine", 0, "moe_experts", 1),
        ):
            posted = _span(spans, rank, wait.removeprefix("wait:"), mb)
            hider = _span(spans, rank, compute, other)
            assert posted.start_ns <= hider.start_ns
            assert _span(spans, rank, wait, mb).start_ns >= hider.end_ns


def test_sequential_schedule_waits_before_the_other_micro_batch_computes(cluster2):
    spans = _spans_of(cluster2, "sequential")
    for rank in (0, 1):
        assert (
            _span(spans, rank, "wait:moe_dispatch", 0).end_ns
            <= _span(spans, rank, "attention", 1).start_ns
        )


def test_overlap_measurement_refuses_odd_token_counts(cluster2):
    with pytest.raises(ValueError, match="even"):
        measure_two_microbatch_overlap(cluster2, tokens=33)
