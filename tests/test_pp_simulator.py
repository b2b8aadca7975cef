"""The simulator's bubble and activation counts equal the closed forms for equal stage costs."""

from __future__ import annotations

import pytest

from dtlab.cost import bubble
from dtlab.parallel.pipeline import (
    Costs,
    dualpipe_v,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    simulate,
    with_communication,
    zb_h1,
)

SIZES = [(2, 2), (2, 4), (2, 5), (3, 7), (4, 4), (4, 8), (4, 9), (8, 16)]


@pytest.mark.parametrize("p, m", SIZES)
def test_gpipe_and_1f1b_bubble_equals_both_formulas(p, m):
    for make in (gpipe, one_f_one_b):
        sim = simulate(make(p, m), Costs(forward=1.0, backward_input=1.5, backward_weight=0.5))
        assert sim.bubble_fraction_of_total == pytest.approx(bubble.bubble_fraction_of_total(p, m))
        assert sim.bubble_ratio_to_ideal == pytest.approx(bubble.bubble_ratio_to_ideal(p, m))
        assert sim.makespan == pytest.approx((m + p - 1) * 3.0)


@pytest.mark.parametrize("p, m", [(2, 2), (2, 4), (3, 6), (4, 4), (4, 8), (4, 12)])
def test_interleaved_bubble_shrinks_by_v(p, m):
    for v in (2, 3):
        sim = simulate(interleaved_1f1b(p, m, v))
        expected = bubble.interleaved_bubble_ratio_to_ideal(p, m, v)
        assert sim.bubble_ratio_to_ideal == pytest.approx(expected)
        assert sim.bubble_fraction_of_total == pytest.approx(
            bubble.interleaved_bubble_fraction_of_total(p, m, v)
        )


@pytest.mark.parametrize("p, m", [(2, 4), (3, 7), (4, 8), (4, 9)])
def test_zb_h1_leaves_each_rank_idle_for_p_minus_1_times_f_plus_i_minus_w(p, m):
    """Qi et al. 2023: ZB-H1's bubble is (p-1)(t_F + t_I - t_W) per rank, against 1F1B's
    (p-1)(t_F + t_I + t_W): a third of it when the three costs are equal."""
    costs = Costs(forward=1.0, backward_input=1.0, backward_weight=0.5)
    zb, one_f = simulate(zb_h1(p, m), costs), simulate(one_f_one_b(p, m), costs)
    for rank in range(p):
        assert zb.idle(rank) == pytest.approx((p - 1) * (1.0 + 1.0 - 0.5))
        assert one_f.idle(rank) == pytest.approx((p - 1) * (1.0 + 1.0 + 0.5))
    assert zb.peak_in_flight(0) == one_f.peak_in_flight(0) == p  # same memory as 1F1B


@pytest.mark.parametrize("p, m", [(2, 4), (2, 6), (4, 8), (4, 9)])
def test_gpipe_holds_m_micro_batches_on_stage_0_and_1f1b_p(p, m):
    assert [simulate(gpipe(p, m)).peak_in_flight(s) for s in range(p)] == [m] * p
    assert [simulate(one_f_one_b(p, m)).peak_in_flight(s) for s in range(p)] == list(
        range(p, 0, -1)
    )


def test_in_flight_curve_rises_and_falls_with_forwards_and_backwards():
    sim = simulate(one_f_one_b(2, 3))  # rank 0: F0 F1 (wait) B0 F2 B1 B2, each B freeing one
    assert sim.in_flight(0) == [(0.0, 1), (1.0, 2), (9.0, 1), (12.0, 0)]
    assert sim.in_flight(0)[-1][0] == sim.makespan


def test_dualpipe_v_bubble_is_below_1f1b_on_the_same_ranks():
    """Per unit of work (a V stage is half a 1F1B stage), DualPipeV idles less than 1F1B."""
    for p, m in ((2, 4), (4, 8), (4, 16)):
        dual = simulate(dualpipe_v(p, m))
        assert dual.bubble_fraction_of_total < simulate(one_f_one_b(p, m)).bubble_fraction_of_total


def test_p2p_latency_adds_to_the_critical_path():
    """GPipe's fill and drain each cross p-1 links: 2(p-1) latencies on top of the formula."""
    p, m, latency = 4, 8, 0.25
    sim = simulate(gpipe(p, m), Costs(p2p=latency))
    assert sim.makespan == pytest.approx((m + p - 1) * 3.0 + 2 * (p - 1) * latency)
    explicit = simulate(with_communication(gpipe(p, m), Costs(p2p=latency)), Costs(p2p=latency))
    assert explicit.makespan >= sim.makespan  # a blocking message also occupies its sender


def test_simulated_timeline_is_a_trace_the_timeline_figure_draws():
    from dtlab.viz import timeline

    sim = simulate(with_communication(one_f_one_b(2, 4), Costs(p2p=0.1)), Costs(p2p=0.1))
    trace = sim.trace()
    assert trace.ranks == [0, 1]
    f3 = [s for s in trace.spans if s.name == "1F3"]
    assert len(f3) == 1 and f3[0].labels == {"micro_batch": 3, "phase": "F", "stage": 1}
    assert {s.kind for s in trace.spans} == {"compute", "comm"}
    assert trace.total_seconds("compute") == pytest.approx(2 * 4 * 3.0 / 1e3)  # units are ms
    assert len(timeline(trace).data) > 0
    assert "bubble" in sim.summary() and "idle/total" in sim.summary()
