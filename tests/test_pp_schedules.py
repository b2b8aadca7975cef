"""Pipeline schedules as data: the generators, PyTorch's action strings and its own orders.

No processes here: every schedule is a list of actions per rank, so its shape can be checked
exactly — against ``torch.distributed.pipelining``'s generators, against the validator, and
through the message placement that makes blocking send/recv safe.
"""

from __future__ import annotations

import pytest

from dtlab.parallel.pipeline import (
    SCHEDULES,
    Action,
    Schedule,
    ScheduleError,
    dualpipe_v,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    torch_schedule,
    validate,
    with_communication,
    zb_h1,
)
from dtlab.parallel.pipeline.replay import Costs, replay

SIZES = [(p, m) for p in (1, 2, 3, 4) for m in sorted({p, p + 1, 2 * p, 2 * p + 1, 3 * p})]


def _generated(p: int, m: int):
    """Every generator that accepts (p, m)."""
    for name, make in SCHEDULES.items():
        try:
            yield name, make(p, m)
        except ValueError:
            continue


def test_action_strings_are_pytorchs_form_and_parse_back():
    assert str(Action(1, "F", 0)) == "1F0"
    assert str(Action(0, "I", 3)) == "0I3"
    assert str(Action(2, "SEND_F", 1)) == "2SEND_F1"
    for text in ("1F0", "0I3", "12W10", "3RECV_B7", "0SEND_B2"):
        assert str(Action.parse(text)) == text
    with pytest.raises(ValueError, match="stage, kind, micro-batch"):
        Action.parse("F1")
    with pytest.raises(ValueError, match="not one of"):
        Action(0, "X", 0)


def test_schedule_round_trips_through_torch_strings_with_messages():
    schedule = with_communication(one_f_one_b(3, 5))
    again = Schedule.from_torch_strings(schedule.to_torch_strings(), schedule.name)
    assert again == schedule


def test_import_drops_torch_bubbles_and_bookkeeping_and_splits_overlapped_pairs():
    orders = {0: ["0F0", None, "(0F1;0B0)OVERLAP_F_B", "0B1", "0REDUCE_GRAD"]}
    schedule = Schedule.from_torch_strings(orders)
    assert [str(a) for a in schedule.actions[0]] == ["0F0", "0F1", "0B0", "0B1"]
    assert schedule.n_micro == 2 and schedule.stage_ranks == (0,)


@pytest.mark.parametrize(
    "ours, theirs, n_virtual",
    [
        (gpipe, "GPipe", 1),
        (one_f_one_b, "1F1B", 1),  # what torch runs; its pipeline_order IR differs (see there)
        (interleaved_1f1b, "Interleaved1F1B", 2),
        (zb_h1, "InterleavedZeroBubble", 1),  # torch's ZB1P with one stage per rank is ZB-H1
        (dualpipe_v, "DualPipeV", 2),
    ],
    ids=["gpipe", "1f1b", "interleaved", "zb_h1", "dualpipe_v"],
)
def test_generators_give_pytorchs_orders_exactly(ours, theirs, n_virtual):
    compared = 0
    for p, m in SIZES:
        try:
            schedule = ours(p, m)
        except ValueError:  # e.g. DualPipeV needs m >= 2p: torch refuses those too
            continue
        torch_order = torch_schedule(theirs, p, m, n_virtual=n_virtual)
        assert schedule.stage_ranks == torch_order.stage_ranks, (p, m)
        assert schedule.actions == torch_order.actions, (p, m)
        compared += 1
    assert compared >= 10


def test_one_f_one_b_reads_like_the_paper():
    assert one_f_one_b(4, 6).grid().splitlines()[0].split()[2:] == (
        ["0F0", "0F1", "0F2", "0F3", "0B0", "0F4", "0B1", "0F5", "0B2", "0B3", "0B4", "0B5"]
    )
    assert gpipe(2, 2).grid() == "rank 0:  0F0  0F1  0B0  0B1\nrank 1:  1F0  1F1  1B0  1B1"


@pytest.mark.parametrize("p, m", SIZES)
def test_every_generated_schedule_validates_with_and_without_written_out_messages(p, m):
    for name, schedule in _generated(p, m):
        validate(schedule)
        explicit = with_communication(schedule, Costs(p2p=0.1))
        validate(explicit)
        assert explicit.compute_only().actions == schedule.actions, name


def test_sending_right_after_computing_deadlocks_1f1b_on_blocking_p2p():
    """The order every learner writes first: send as soon as the tensor exists, receive just
    before it is needed. On blocking (rendezvous) send/recv, 1F1B's steady state has rank 0
    sending a forward while rank 1 sends a gradient back — both wait forever."""
    schedule = one_f_one_b(2, 4)
    naive: list[list[Action]] = []
    for rank, actions in enumerate(schedule.actions):
        out: list[Action] = []
        for a in actions:
            if a.kind == "F" and rank == 1:
                out.append(Action(1, "RECV_F", a.micro_batch))
            if a.kind == "B" and rank == 0:
                out.append(Action(0, "RECV_B", a.micro_batch))
            out.append(a)
            if a.kind == "F" and rank == 0:
                out.append(Action(0, "SEND_F", a.micro_batch))
            if a.kind == "B" and rank == 1:
                out.append(Action(1, "SEND_B", a.micro_batch))
        naive.append(out)
    broken = Schedule("naive 1F1B", 4, schedule.stage_ranks, tuple(map(tuple, naive)))
    with pytest.raises(ScheduleError, match=r"deadlock.*rank 0 waits at 0SEND_F1.*rank 1 waits "
                       r"at 1SEND_B0") as caught:  # fmt: skip
        validate(broken)
    assert caught.value.rank == 0 and caught.value.action == Action(0, "SEND_F", 1)
    placed = with_communication(schedule)
    validate(placed)
    assert [str(a) for a in placed.actions[0][:6]] == [
        "0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0",
    ]  # fmt: skip


def test_placed_messages_keep_the_ideal_timeline_when_messages_are_free():
    """With free messages, blocking send/recv in the placed order loses nothing against the
    ideal of non-blocking sends: GPipe and 1F1B finish in (m+p-1)(t_F+t_B)."""
    for make in (gpipe, one_f_one_b):
        schedule = make(4, 8)
        ideal = replay(schedule)
        placed = replay(with_communication(schedule))
        assert max(t.end for t in placed[0]) == max(t.end for t in ideal[0]) == (8 + 3) * 3
