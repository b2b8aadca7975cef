"""The DDP and ZeRO benchmarks: interleaving, ratios and hidden fractions (never wall-clock)."""

from __future__ import annotations

import pytest

from dtlab.bench import Spread, best_ratios_to, ratios_to, rotated, slowest_rank
from dtlab.bench import ddp as ddp_bench
from dtlab.bench import zero as zero_bench
from dtlab.trace import Span, Trace


def test_rotation_puts_every_variant_in_every_position_once_per_cycle():
    names = ["a", "b", "c"]
    orders = [rotated(names, r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    for position in range(3):
        assert sorted(order[position] for order in orders) == names


def test_a_round_takes_the_slowest_ranks_time():
    per_rank = [{"x": [1.0, 5.0]}, {"x": [3.0, 2.0]}]
    assert slowest_rank(per_rank) == {"x": [3.0, 5.0]}


def test_ratios_pair_steps_of_the_same_round_so_shared_load_cancels():
    # The load doubles every time in round 2 and 3; the variant is always 2x the baseline.
    seconds = {"base": [1.0, 1.0, 2.0, 2.0], "variant": [2.0, 2.0, 4.0, 4.0]}
    ratios = ratios_to(seconds, "base", repeats=2)
    assert ratios["variant"] == Spread(2.0, 2.0, 2.0)
    assert ratios["base"] == Spread(1.0, 1.0, 1.0)
    assert best_ratios_to(seconds, "base") == {"base": 1.0, "variant": 2.0}


def _span(rank, name, kind, start, end, **labels):
    return Span(rank, name, kind, start, end, 0, labels)


def test_hidden_fraction_counts_comm_inside_backward_within_each_step_window():
    spans = [
        _span(0, "broadcast_state", "comm", 0, 5),  # start-up: in no window
        _span(0, "bench_step", "other", 10, 100, variant="overlapped", round=0),
        _span(0, "backward", "compute", 20, 60),
        _span(0, "grad[0]", "comm", 40, 80),  # 20 of 40 ns inside backward
        _span(0, "bench_step", "other", 100, 200, variant="naive", round=0),
        _span(0, "backward", "compute", 110, 150),
        _span(0, "grad[0]", "comm", 150, 190),  # after backward: hidden 0
    ]
    fractions = ddp_bench.hidden_fractions(Trace(spans), steps=1, repeats=1)
    assert fractions["overlapped"]["hidden"].median == pytest.approx(0.5)
    assert fractions["naive"]["hidden"].median == 0.0
    assert fractions["overlapped"]["comm_s_per_step"] == pytest.approx(40e-9)
    assert fractions["bucketed"]["hidden"] is None


def test_ddp_bench_reports_every_variant_and_naive_ddp_hides_nothing(cluster2):
    results = ddp_bench.run(cluster2, model_size="tiny", steps=2, repeats=2)
    by = {r.variant: r for r in results}
    assert list(by) == list(ddp_bench.VARIANTS)
    assert by["torch_ddp"].vs_torch_ddp == Spread(1.0, 1.0, 1.0)
    for r in results:
        assert len(r.step_s_per_round) == 4
        assert r.step_s > 0 and r.vs_torch_ddp.low <= r.vs_torch_ddp.median
        assert r.comm_s_per_step > 0, f"{r.variant} recorded no gradient communication"
        assert 0.0 <= r.comm_hidden.low <= r.comm_hidden.high <= 1.0
    assert by["naive"].comm_hidden.high == 0.0


def test_zero_bench_reports_time_and_peak_memory_against_fsdp2(cluster2):
    results = zero_bench.run(cluster2, model_size="tiny", steps=2, repeats=1)
    by = {r.implementation: r for r in results}
    assert list(by) == list(zero_bench.IMPLEMENTATIONS)
    assert by["torch_fsdp2"].vs_fsdp2 == Spread(1.0, 1.0, 1.0)
    assert by["torch_fsdp2"].peak_vs_fsdp2 == 1.0
    for r in results:
        assert r.step_s > 0 and len(r.step_s_per_round) == 2
        assert r.peak_bytes == r.state_bytes + r.step_high_water_bytes
        assert r.state_bytes > 0 and r.step_high_water_bytes > 0
    # Both shard the same model over 2 ranks: the same parameter and Adam state bytes.
    assert by["dtlab_zero3"].state_bytes == by["torch_fsdp2"].state_bytes
