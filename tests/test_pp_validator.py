"""The validator turns a broken schedule into an error naming the rank and the action."""

from __future__ import annotations

import re

import pytest

from dtlab.parallel.pipeline import (
    Action,
    Schedule,
    ScheduleError,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    validate,
    with_communication,
    zb_h1,
)


def _edit(schedule: Schedule, rank: int, actions: list[str]) -> Schedule:
    per_rank = list(schedule.actions)
    per_rank[rank] = tuple(Action.parse(a) for a in actions)
    return Schedule("edited", schedule.n_micro, schedule.stage_ranks, tuple(per_rank))


def _rejects(schedule: Schedule, message: str, rank: int, action: str) -> None:
    with pytest.raises(ScheduleError, match=message) as caught:
        validate(schedule)
    assert caught.value.rank == rank
    assert str(caught.value.action) == action


def test_rejects_a_missing_backward():
    _rejects(
        _edit(gpipe(2, 3), 1, ["1F0", "1F1", "1F2", "1B0", "1B2"]),
        "rank 1 never runs 1B1: the backward of micro-batch 1 on stage 1 is missing",
        1,
        "1B1",
    )


def test_rejects_a_split_backward_missing_its_weight_half():
    schedule = zb_h1(2, 2)
    without_w = [str(a) for a in schedule.actions[0] if str(a) != "0W1"]
    _rejects(_edit(schedule, 0, without_w), "rank 0 never runs 0W1", 0, "0W1")


def test_rejects_forward_after_backward():
    _rejects(
        _edit(gpipe(2, 2), 0, ["0F0", "0B1", "0F1", "0B0"]),
        re.escape("rank 0 runs 0B1 before 0F1"),
        0,
        "0B1",
    )


def test_rejects_a_deadlocking_order_and_names_every_stuck_rank():
    """Each rank on its own is fine (F before B everywhere), but rank 0 waits for micro-batch
    0's gradient before sending micro-batch 1 forward, while rank 1 waits for micro-batch 1's
    activation before running micro-batch 0's backward."""
    schedule = _edit(gpipe(2, 2), 0, ["0F0", "0B0", "0F1", "0B1"])
    _rejects(
        schedule,
        re.escape(
            "deadlock in edited: rank 0 waits at 0B0 for the gradient of 1B0 or 1I0 (rank 1); "
            "rank 1 waits at 1F1 for the activation of 0F1 (rank 0)"
        ),
        0,
        "0B0",
    )


def test_rejects_messages_posted_in_a_different_order_than_received():
    """Two sends on one link arrive in the order posted: receiving them the other way round
    would hand micro-batch 1's activation to micro-batch 0."""
    placed = with_communication(gpipe(2, 2))
    rank1 = [str(a) for a in placed.actions[1]]
    i, j = rank1.index("1RECV_F0"), rank1.index("1RECV_F1")
    rank1[i], rank1[j] = rank1[j], rank1[i]
    rank1.remove("1F0")
    rank1.insert(rank1.index("1RECV_F0") + 1, "1F0")
    with pytest.raises(ScheduleError, match="messages between two ranks match in the order"):
        validate(_edit(placed, 1, rank1))


@pytest.mark.parametrize(
    "actions, message, action",
    [
        (["0F0", "0F1", "0B0", "0B1", "0B1"], "runs 0B1 2 times", "0B1"),
        (["0F0", "0F1", "0B0", "0B1", "1F0"], "stage 1 lives on rank 1", "1F0"),
        (["0F0", "0F1", "0B0", "0B1", "0F2"], r"micro-batches are 0\.\.1", "0F2"),
        (["0F0", "0F1", "0B0", "0B1", "0W1"], "runs both 0B1 and a split backward", "0B1"),
    ],
    ids=["twice", "wrong-rank", "no-such-micro-batch", "B-and-W"],
)
def test_rejects_misplaced_and_duplicated_actions(actions, message, action):
    _rejects(_edit(gpipe(2, 2), 0, actions), message, 0, action)


def test_rejects_a_message_between_stages_on_one_rank():
    schedule = interleaved_1f1b(1, 2, 2)  # one rank holds both stages
    edited = _edit(schedule, 0, ["0F0", "0SEND_F0", *[str(a) for a in schedule.actions[0][1:]]])
    _rejects(edited, "both on rank 0: the tensor is handed over in memory", 0, "0SEND_F0")


def test_generated_schedules_pass():
    for schedule in (gpipe(3, 5), one_f_one_b(4, 9), interleaved_1f1b(2, 4), zb_h1(3, 3)):
        assert validate(schedule) is schedule
