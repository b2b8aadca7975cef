"""Goodput vs checkpoint interval, replayed second by second against a simulated failure trace:
the replay's accounting by hand, and the measured peak beside Young/Daly's √(2·C·MTBF)."""

import pytest

from dtlab.cost.reliability import young_daly_interval, young_daly_interval_async
from dtlab.faults import failure_trace, goodput_curve, replay


def test_replay_without_failures_pays_only_the_blocking_saves():
    r = replay([], work_s=100, interval_s=10, blocking_s=1)
    assert (r.checkpoints, r.failures, r.lost_s) == (9, 0, 0)  # no save after the last step
    assert r.wall_s == 109 and r.goodput == pytest.approx(100 / 109)


def test_a_failure_loses_the_work_since_the_last_durable_checkpoint():
    # saved at 10 (wall 11); fails at wall 15 having redone 4 s; resumes from 10 at once
    r = replay([15.0], work_s=100, interval_s=10, blocking_s=1)
    assert r.lost_s == 4 and r.failures == 1
    assert r.wall_s == 15 + 9 * 10 + 8 * 1
    # asynchronously, the save at 10 becomes durable only at wall 11 + 5 = 16: the failure at
    # 15 throws away everything since 0
    a = replay([15.0], work_s=100, interval_s=10, blocking_s=1, write_s=5)
    assert a.lost_s == 10 + 4


def test_failure_trace_has_the_asked_mean_gap():
    trace = failure_trace(mtbf_s=100.0, horizon_s=1e6, seed=3)
    assert trace == sorted(trace) and trace[-1] <= 1e6
    assert len(trace) == pytest.approx(1e6 / 100.0, rel=0.05)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_measured_goodput_peaks_at_the_young_daly_interval(asynchronous):
    mtbf, write, snapshot = 3 * 3600.0, 60.0, 4.0
    trace = failure_trace(mtbf, 20000 * 3600, seed=1)
    intervals = [60.0 * k for k in range(1, 61)]
    if asynchronous:
        costs = {"blocking_s": snapshot, "write_s": write}
        tau = young_daly_interval_async(snapshot, write, mtbf)
    else:
        costs = {"blocking_s": write}
        tau = young_daly_interval(write, mtbf)
    curve = goodput_curve(intervals, trace, 5000 * 3600, **costs)
    best = max(curve, key=lambda p: p[1])
    near = max(g for t, g in curve if abs(t - tau) <= 60)
    assert best[0] == pytest.approx(tau, rel=0.35), (best, tau)
    assert near > best[1] - 0.005  # the formula's interval is within half a percent of the best
    assert curve[0][1] < best[1] - 0.01 and curve[-1][1] < best[1] - 0.005  # a real peak
