"""Play a schedule forward in time: when every action starts and ends, or where it gets stuck.

One engine serves the validator (does the schedule finish at all?) and the simulator (when does
each action run?). Each rank runs its list in order; an action starts when the rank is free and
what it needs has arrived:

* **implicit messages** (a schedule of F/B/I/W only): a forward of stage ``s`` needs the forward
  of ``s-1`` to have finished, plus ``p2p`` if that stage is on another rank; a backward (B or I)
  of ``s`` needs the backward of ``s+1`` likewise. Sends never block — the ideal the bubble
  formulas assume.
* **explicit messages** (SEND/RECV actions written out): a send and its receive are a
  *rendezvous* — both ranks must have reached them, then both are busy for ``p2p`` — which is
  what a blocking ``send``/``recv`` on gloo does (a gloo send returns only once the receiver
  has posted its receive). Messages between two ranks match in the order they were posted.

If no rank can move and some are not done, the schedule deadlocks: :class:`ScheduleError` names
each stuck rank, the action it is stuck at and what it waits for.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.parallel.pipeline.actions import Action, Schedule, ScheduleError


@dataclass(frozen=True)
class Costs:
    """Time per action, in any unit (the simulator draws them as milliseconds).

    ``forward``: one F; ``backward_input``: one I; ``backward_weight``: one W; a full backward B
    costs ``backward_input + backward_weight`` (``2·forward`` by default, the usual rule of thumb);
    ``p2p``: one message between ranks.
    """

    forward: float = 1.0
    backward_input: float = 1.0
    backward_weight: float = 1.0
    p2p: float = 0.0

    def of(self, action: Action) -> float:
        if action.kind == "F":
            return self.forward
        if action.kind == "B":
            return self.backward_input + self.backward_weight
        if action.kind == "I":
            return self.backward_input
        if action.kind == "W":
            return self.backward_weight
        return self.p2p


@dataclass(frozen=True)
class Timed:
    """One action placed in time on one rank."""

    rank: int
    action: Action
    start: float
    end: float


def is_backward(action: Action) -> bool:
    """B or I: the part of a backward that produces the gradient the previous stage waits for."""
    return action.kind in ("B", "I")


def peer_stage(action: Action) -> int:
    """The stage at the other end of a message action."""
    forward = action.kind.endswith("_F")
    sending = action.kind.startswith("SEND")
    return action.stage + (1 if forward == sending else -1)


def matching(action: Action) -> Action:
    """The receive that pairs with a send, or the send that pairs with a receive."""
    verb, direction = action.kind.split("_")
    other = "RECV" if verb == "SEND" else "SEND"
    return Action(peer_stage(action), f"{other}_{direction}", action.micro_batch)


def replay(schedule: Schedule, costs: Costs | None = None) -> list[list[Timed]]:
    """Each rank's actions with start and end times; raises :class:`ScheduleError` on deadlock."""
    costs = costs or Costs()
    if schedule.has_communication:
        return _replay_rendezvous(schedule, costs)
    return _replay_implicit(schedule, costs)


def _replay_implicit(schedule: Schedule, costs: Costs) -> list[list[Timed]]:
    stage_ranks, last = schedule.stage_ranks, schedule.n_stages - 1
    forward_done: dict[tuple[int, int], float] = {}
    backward_done: dict[tuple[int, int], float] = {}
    timeline: list[list[Timed]] = [[] for _ in schedule.actions]
    free = [0.0] * schedule.n_ranks
    cursor = [0] * schedule.n_ranks

    def arrival(rank: int, action: Action) -> float | None:
        """When what ``action`` needs from another stage is here (None: not produced yet)."""
        s, mb = action.stage, action.micro_batch
        if action.kind == "F" and s > 0:
            source, done = s - 1, forward_done.get((s - 1, mb))
        elif is_backward(action) and s < last:
            source, done = s + 1, backward_done.get((s + 1, mb))
        else:
            return 0.0
        if done is None:
            return None
        return done + (costs.p2p if stage_ranks[source] != rank else 0.0)

    moved = True
    while moved:
        moved = False
        for rank, actions in enumerate(schedule.actions):
            while cursor[rank] < len(actions):
                action = actions[cursor[rank]]
                ready = arrival(rank, action)
                if ready is None:
                    break
                start = max(free[rank], ready)
                free[rank] = end = start + costs.of(action)
                timeline[rank].append(Timed(rank, action, start, end))
                key = (action.stage, action.micro_batch)
                if action.kind == "F":
                    forward_done[key] = end
                elif is_backward(action):
                    backward_done[key] = end
                cursor[rank] += 1
                moved = True
    stuck = [r for r, actions in enumerate(schedule.actions) if cursor[r] < len(actions)]
    if stuck:
        _raise_deadlock(schedule, cursor, stuck, _implicit_wait)
    return timeline


def _implicit_wait(schedule: Schedule, action: Action) -> str:
    s, mb = action.stage, action.micro_batch
    if action.kind == "F":
        return f"for the activation of {s - 1}F{mb} (rank {schedule.stage_ranks[s - 1]})"
    return f"for the gradient of {s + 1}B{mb} or {s + 1}I{mb} (rank {schedule.stage_ranks[s + 1]})"


def _replay_rendezvous(schedule: Schedule, costs: Costs) -> list[list[Timed]]:
    stage_ranks = schedule.stage_ranks
    timeline: list[list[Timed]] = [[] for _ in schedule.actions]
    free = [0.0] * schedule.n_ranks
    cursor = [0] * schedule.n_ranks

    def head(rank: int) -> Action | None:
        actions = schedule.actions[rank]
        return actions[cursor[rank]] if cursor[rank] < len(actions) else None

    def place(rank: int, action: Action, start: float, end: float) -> None:
        timeline[rank].append(Timed(rank, action, start, end))
        free[rank] = end
        cursor[rank] += 1

    moved = True
    while moved:
        moved = False
        for rank in range(schedule.n_ranks):
            while (action := head(rank)) is not None:
                if action.is_compute:
                    place(rank, action, free[rank], free[rank] + costs.of(action))
                    moved = True
                    continue
                peer = stage_ranks[peer_stage(action)]
                theirs = head(peer)
                if theirs is None or theirs.is_compute or theirs.kind[:4] == action.kind[:4]:
                    break  # the peer is computing, finished, or also sending / also receiving
                if stage_ranks[peer_stage(theirs)] != rank:
                    break  # the peer is exchanging with its other neighbour first
                if theirs != matching(action):
                    raise ScheduleError(
                        f"rank {rank} runs {action} while rank {peer} runs {theirs}: messages "
                        f"between two ranks match in the order they are posted, so rank {peer} "
                        f"would get the wrong tensor; post {matching(action)} on rank {peer} here",
                        rank,
                        action,
                    )
                start = max(free[rank], free[peer])
                place(rank, action, start, start + costs.p2p)
                place(peer, theirs, start, start + costs.p2p)
                moved = True
    stuck = [r for r in range(schedule.n_ranks) if head(r) is not None]
    if stuck:
        _raise_deadlock(schedule, cursor, stuck, _rendezvous_wait)
    return timeline


def _rendezvous_wait(schedule: Schedule, action: Action) -> str:
    peer = schedule.stage_ranks[peer_stage(action)]
    verb = "to receive" if action.kind.startswith("SEND") else "to send"
    return f"for rank {peer} {verb} {matching(action)}"


def _raise_deadlock(schedule: Schedule, cursor: list[int], stuck: list[int], why) -> None:
    waits = []
    for rank in stuck:
        action = schedule.actions[rank][cursor[rank]]
        waits.append(f"rank {rank} waits at {action} {why(schedule, action)}")
    first = schedule.actions[stuck[0]][cursor[stuck[0]]]
    raise ScheduleError(
        f"deadlock in {schedule.name}: " + "; ".join(waits) + ". No rank can move: reorder the "
        "actions so that what each one waits for comes first",
        stuck[0],
        first,
    )
