"""Check a schedule before any rank runs it; a broken one gets an error naming rank and action.

What a schedule must satisfy, in the order checked:

1. **Placement** — every action is for a stage its rank holds, and a micro-batch that exists.
2. **Completeness** — every (stage, micro-batch) has exactly one F and one backward: a full B, or
   an I and a W (never both, never twice).
3. **Order on a rank** — F before its backward (a backward needs the activations the forward
   saved), I before W; a send after the action that produced its tensor, a compute after the
   receive that brings its input.
4. **Order across ranks** — replaying the schedule (:mod:`~dtlab.parallel.pipeline.replay`)
   must finish: a forward waits for the previous stage's forward, a backward for the next
   stage's backward, and written-out sends and receives must pair up in order. A cycle of waits
   is a deadlock, reported with every rank's stuck action.
"""

from __future__ import annotations

from collections import Counter

from dtlab.parallel.pipeline.actions import Action, Schedule, ScheduleError
from dtlab.parallel.pipeline.replay import Costs, is_backward, matching, peer_stage, replay


def validate(schedule: Schedule) -> Schedule:
    """Raise :class:`ScheduleError` if ``schedule`` cannot run; return it unchanged if it can."""
    if len(schedule.stage_ranks) < 1 or schedule.n_micro < 1:
        raise ScheduleError(f"{schedule.name} has no stages or no micro-batches")
    if sorted(set(schedule.stage_ranks)) != list(range(schedule.n_ranks)):
        raise ScheduleError(
            f"{schedule.name}: stage_ranks {list(schedule.stage_ranks)} must give every one of "
            f"the {schedule.n_ranks} ranks at least one stage"
        )
    _check_placement(schedule)
    _check_complete(schedule)
    _check_order_on_each_rank(schedule)
    replay(schedule, Costs())
    return schedule


def _check_placement(schedule: Schedule) -> None:
    for rank, actions in enumerate(schedule.actions):
        for action in actions:
            if not 0 <= action.stage < schedule.n_stages:
                raise ScheduleError(
                    f"rank {rank} runs {action}, but stages are 0..{schedule.n_stages - 1}",
                    rank,
                    action,
                )
            if schedule.stage_ranks[action.stage] != rank:
                raise ScheduleError(
                    f"rank {rank} runs {action}, but stage {action.stage} lives on rank "
                    f"{schedule.stage_ranks[action.stage]}",
                    rank,
                    action,
                )
            if not 0 <= action.micro_batch < schedule.n_micro:
                raise ScheduleError(
                    f"rank {rank} runs {action}, but micro-batches are 0..{schedule.n_micro - 1}",
                    rank,
                    action,
                )
            if not action.is_compute:
                _check_message_placement(schedule, rank, action)


def _check_message_placement(schedule: Schedule, rank: int, action: Action) -> None:
    peer = peer_stage(action)
    if not 0 <= peer < schedule.n_stages:
        raise ScheduleError(
            f"rank {rank} runs {action}, but stage {peer} does not exist to talk to", rank, action
        )
    if schedule.stage_ranks[peer] == rank:
        raise ScheduleError(
            f"rank {rank} runs {action}, but stages {action.stage} and {peer} are both on rank "
            f"{rank}: the tensor is handed over in memory, no message", rank, action
        )  # fmt: skip


def _check_complete(schedule: Schedule) -> None:
    counts = Counter((a.stage, a.kind, a.micro_batch) for acts in schedule.actions for a in acts)
    for (stage, kind, mb), n in counts.items():
        if n > 1:
            rank = schedule.stage_ranks[stage]
            raise ScheduleError(
                f"rank {rank} runs {Action(stage, kind, mb)} {n} times; once is enough",
                rank,
                Action(stage, kind, mb),
            )
    for stage, rank in enumerate(schedule.stage_ranks):
        for mb in range(schedule.n_micro):
            has = {k for k in ("F", "B", "I", "W") if (stage, k, mb) in counts}
            forward = Action(stage, "F", mb)
            if "F" not in has:
                raise ScheduleError(
                    f"rank {rank} never runs {forward}: micro-batch {mb} skips stage {stage}",
                    rank,
                    forward,
                )
            if "B" in has and has & {"I", "W"}:
                raise ScheduleError(
                    f"rank {rank} runs both {stage}B{mb} and a split backward ({stage}I{mb} / "
                    f"{stage}W{mb}): the gradients would count twice",
                    rank,
                    Action(stage, "B", mb),
                )
            if "B" not in has and has & {"I", "W"} != {"I", "W"}:
                missing = Action(stage, "W" if "I" in has else ("I" if "W" in has else "B"), mb)
                raise ScheduleError(
                    f"rank {rank} never runs {missing}: the backward of micro-batch {mb} on "
                    f"stage {stage} is missing (a B, or an I and a W)",
                    rank,
                    missing,
                )
            if schedule.has_communication:
                _check_messages_exist(schedule, stage, mb, counts)


def _check_messages_exist(schedule: Schedule, stage: int, mb: int, counts: Counter) -> None:
    """With written-out messages, every hop between ranks needs its send and its receive."""
    hops = []
    if stage + 1 < schedule.n_stages:
        hops.append(Action(stage, "SEND_F", mb))
    if stage > 0:
        hops.append(Action(stage, "SEND_B", mb))
    for send in hops:
        if schedule.stage_ranks[peer_stage(send)] == schedule.stage_ranks[stage]:
            continue
        for action in (send, matching(send)):
            if (action.stage, action.kind, action.micro_batch) not in counts:
                rank = schedule.stage_ranks[action.stage]
                raise ScheduleError(
                    f"rank {rank} never runs {action}: the tensor between stages {stage} and "
                    f"{peer_stage(send)} for micro-batch {mb} would never move",
                    rank,
                    action,
                )


def _check_order_on_each_rank(schedule: Schedule) -> None:
    for rank, actions in enumerate(schedule.actions):
        done: set[tuple[int, str, int]] = set()
        for action in actions:
            for needed in _needs_first(schedule, rank, action):
                if needed not in done:
                    raise ScheduleError(
                        f"rank {rank} runs {action} before {_describe(needed)}", rank, action
                    )
            done.add((action.stage, action.kind, action.micro_batch))
            if is_backward(action):  # a B or an I: the input's gradient exists
                done.add((action.stage, "backward", action.micro_batch))


def _describe(key: tuple[int, str, int]) -> str:
    stage, kind, mb = key
    return f"{stage}B{mb} (or {stage}I{mb})" if kind == "backward" else f"{stage}{kind}{mb}"


def _needs_first(schedule: Schedule, rank: int, action: Action) -> list[tuple[int, str, int]]:
    """What must already have run on ``rank`` before ``action`` (local dependencies only)."""
    s, mb, kind = action.stage, action.micro_batch, action.kind
    last = schedule.n_stages - 1

    def on_this_rank(stage: int) -> bool:
        return schedule.stage_ranks[stage] == rank

    if kind in ("B", "I"):
        needs = [(s, "F", mb)]
        if s < last and on_this_rank(s + 1):
            needs.append((s + 1, "backward", mb))
        elif s < last and schedule.has_communication:
            needs.append((s, "RECV_B", mb))
        return needs
    if kind == "W":
        return [(s, "I", mb)]
    if kind == "F" and s > 0:
        if on_this_rank(s - 1):
            return [(s - 1, "F", mb)]
        return [(s, "RECV_F", mb)] if schedule.has_communication else []
    if kind == "SEND_F":
        return [(s, "F", mb)]
    if kind == "SEND_B":
        return [(s, "backward", mb)]
    return []  # a first-stage forward or a receive needs nothing local
