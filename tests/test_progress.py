"""dtlab.progress: one bar on the driver fed by rank 0, throttled, closed however the run ends."""

from __future__ import annotations

import time

import pytest

import dtlab
from dtlab import progress
from dtlab.progress import displaying, track


class Recorder:
    """A display that keeps what it was asked to draw."""

    made: list[Recorder] = []

    def __init__(self, interrupt_at: int | None = None):
        self.updates: list[tuple] = []
        self.closed = False
        self.interrupt_at = interrupt_at
        Recorder.made.append(self)

    def update(self, done, total, desc) -> None:
        self.updates.append((done, total, desc))
        if self.interrupt_at is not None and done >= self.interrupt_at:
            raise KeyboardInterrupt  # Ctrl-C arriving while the bar is drawn

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def fresh_recorders():
    Recorder.made = []


def _train(steps: int, pause_s: float) -> int:
    import dtlab.progress

    done = 0
    for _ in dtlab.progress.track(range(steps), desc="training"):
        time.sleep(pause_s)
        done += 1
    return done


def test_rank_zero_feeds_one_bar_on_the_driver_up_to_the_last_step(cluster2):
    with displaying(Recorder):
        assert cluster2.run(_train, 12, 0.03) == [12, 12]
    (bar,) = Recorder.made  # one display for the call, not one per rank
    assert bar.updates[0] == (0, 12, "training") and bar.updates[-1] == (12, 12, "training")
    done = [u[0] for u in bar.updates]
    assert done == sorted(done) and len(done) < 14  # throttled, never more than once per step
    assert bar.closed


def test_only_rank_zero_reports_and_nothing_is_bound_after_the_call(cluster2):
    assert cluster2.run(lambda: dtlab.progress._reporting) == [True, False]
    assert cluster2.run(lambda: dtlab.progress._sender is None) == [False, False]
    assert progress._sender is None  # the driver itself is never bound


def test_a_run_without_progress_makes_no_display(cluster2):
    with displaying(Recorder):
        cluster2.run(lambda: 1)
    assert Recorder.made == []


def test_interrupting_a_run_closes_the_bar_and_leaves_the_cluster_usable():
    with dtlab.Cluster(2) as cluster:
        with displaying(lambda: Recorder(interrupt_at=3)), pytest.raises(KeyboardInterrupt):
            cluster.run(_train, 200, 0.05)
        (bar,) = Recorder.made
        assert bar.closed
        assert cluster.run(lambda: dtlab.rank()) == [0, 1]  # fresh ranks, same Cluster


def test_reports_are_throttled_on_the_rank(monkeypatch):
    sent, now = [], [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    progress.bind_sender(sent.append, reporting=True)
    try:
        for _ in track(range(10), desc="d"):
            now[0] += 0.0625  # 16 steps per second: a report every 4th step
    finally:
        progress.bind_sender(None, reporting=True)
    assert sent[0] == (0, 10, "d") and sent[-1] == (10, 10, "d")
    assert [s[0] for s in sent] == [0, 4, 8, 10]  # the last step always, once


def test_a_non_reporting_rank_sends_nothing(monkeypatch):
    sent = []
    progress.bind_sender(sent.append, reporting=False)
    try:
        assert list(track(range(5))) == [0, 1, 2, 3, 4]
        progress.update(5, 5)
    finally:
        progress.bind_sender(None, reporting=True)
    assert sent == []


def test_outside_a_cluster_track_draws_locally():
    with displaying(Recorder):
        assert sum(track([1, 2, 3], desc="sweep")) == 6
    (bar,) = Recorder.made
    assert bar.updates[-1] == (3, 3, "sweep") and bar.closed


def test_a_broken_display_warns_and_never_breaks_the_run(cluster2):
    def broken():
        raise ModuleNotFoundError("No module named 'tqdm'")

    with displaying(broken), pytest.warns(UserWarning, match="no progress bar"):
        assert cluster2.run(_train, 3, 0.0) == [3, 3]
