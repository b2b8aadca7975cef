"""Lab 12's DP-sync grader: a hand-written reading of the schedule passes; the library's answer
under another name, a reading that stops at the last I, the slack itself and negative exposure
fail with a hint; the bank's key helpers compute what the lab says."""

from __future__ import annotations

import pytest

from dtlab.parallel.pipeline import simulate
from dtlab.parallel.pipeline.dp_sync import exposed_per_stage
from dtlab.quiz import check_exercise
from dtlab.quiz.graders.overlap import (
    best_micro_batch_key,
    dp_slack_key,
    exposed_dp_key,
    peak_rank_in_flight_key,
    pipeline_step_key,
    zero_bubble_idle_key,
)

EXERCISE = "overlap.exposed_dp_per_stage"


def _last(schedule, costs, kinds):
    sim = simulate(schedule, costs)
    last = {}
    for rank in sim.timeline:
        for t in rank:
            if t.action.kind in kinds:
                last[t.action.stage] = max(last.get(t.action.stage, 0.0), t.end)
    return sim.makespan, last


def by_hand(schedule, costs, reduce_time):
    end, last = _last(schedule, costs, ("B", "W"))
    return {s: max(0.0, reduce_time - (end - t)) for s, t in last.items()}


def test_reading_the_schedule_by_hand_passes(cluster2):
    assert check_exercise(EXERCISE, by_hand, cluster2, record=False)


def test_the_library_answer_under_another_name_is_refused(cluster2):
    def wrapped(schedule, costs, reduce_time):
        return exposed_per_stage(schedule, costs, reduce_time)

    result = check_exercise(EXERCISE, wrapped, cluster2, record=False)
    assert not result and "exposed_per_stage" in result.message


def test_stopping_at_the_last_input_gradient_misses_the_ws(cluster2):
    def last_i(schedule, costs, reduce_time):
        end, last = _last(schedule, costs, ("B", "I"))
        return {s: max(0.0, reduce_time - (end - t)) for s, t in last.items()}

    result = check_exercise(EXERCISE, last_i, cluster2, record=False)
    assert not result and "last W" in result.message


def test_returning_the_slack_or_a_negative_exposure_fails_with_a_hint(cluster2):
    def slack(schedule, costs, reduce_time):
        end, last = _last(schedule, costs, ("B", "W"))
        return {s: end - t for s, t in last.items()}

    def unclipped(schedule, costs, reduce_time):
        end, last = _last(schedule, costs, ("B", "W"))
        return {s: reduce_time - (end - t) for s, t in last.items()}

    result = check_exercise(EXERCISE, slack, cluster2, record=False)
    assert not result and "slack" in result.message
    result = check_exercise(EXERCISE, unclipped, cluster2, record=False)
    assert not result and "never a negative" in result.message


def test_key_helpers():
    assert dp_slack_key("1f1b", 4, 8, 3) == 6.0  # three backward slots of t_I + t_W = 2
    assert exposed_dp_key("1f1b", 4, 8, 0, 3.0) == 3.0
    assert exposed_dp_key("1f1b", 4, 8, 1, 3.0) == 1.0
    assert zero_bubble_idle_key("zbv", 4, 16, 0, forward=0.5, backward_input=0.5,
                                backward_weight=0.5) == pytest.approx(1.5)  # fmt: skip
    assert peak_rank_in_flight_key("zbv", 4, 16, 0) == 8
    table = {1: 1.0, 2: 1.5, 4: 2.0}
    assert pipeline_step_key(table, 8, 4, 2) == 10.5
    assert pipeline_step_key(table, 8, 4, 4, v=2) == 7.0
    assert best_micro_batch_key(table, 8, 4) == 4
