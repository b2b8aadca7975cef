"""Write out a schedule's messages in an order that blocking send/recv can run without deadlock.

A compute-only schedule says *what* each rank computes; the executor must also say when each
activation and gradient crosses between ranks. On gloo a ``send`` returns only once the receiver
has posted its ``recv`` (a rendezvous), so the naive order — send right after computing —
deadlocks 1F1B: in the steady state rank ``k`` sends forward to ``k+1`` while ``k+1`` sends the
previous micro-batch's gradient back to ``k``, and both wait for the other to receive.
Megatron-LM fuses such pairs into one batched exchange (``send_forward_recv_backward``).

Here the order is derived instead: a small simulation (with :class:`~dtlab.parallel.pipeline.replay.Costs`)
plays the compute schedule forward; a rank that finishes a computation holds its outgoing
tensors in an outbox, and a message moves the moment both its sender and its receiver are
between computations — a receiver takes a message early if it is free, and a sender drains its
outbox before starting its next computation. Every move is written into *both* ranks' lists at
once, so the lists are projections of one global order of events: whichever message is earliest
in it has both ranks ready for it, which is why blocking send/recv can never deadlock on it.
"""

from __future__ import annotations

import heapq
from collections import deque

from dtlab.parallel.pipeline.actions import Action, Schedule
from dtlab.parallel.pipeline.replay import Costs, is_backward
from dtlab.parallel.pipeline.validate import validate


def with_communication(schedule: Schedule, costs: Costs | None = None) -> Schedule:
    """``schedule`` with its SEND_F/RECV_F/SEND_B/RECV_B actions written out (see module doc).

    A schedule that already has them is validated and returned unchanged.
    """
    validate(schedule)
    if schedule.has_communication:
        return schedule
    costs = costs or Costs()
    n, last, stage_ranks = schedule.n_ranks, schedule.n_stages - 1, schedule.stage_ranks
    out: list[list[Action]] = [[] for _ in range(n)]
    cursor, busy_until = [0] * n, [0.0] * n
    outbox: list[deque[tuple[Action, Action]]] = [deque() for _ in range(n)]
    arrived: list[set[tuple[str, int, int]]] = [set() for _ in range(n)]
    finishing: list[tuple[float, int, Action]] = []  # (end, rank, action) of running computes

    def finish(rank: int, action: Action) -> None:
        """The tensor ``action`` produced goes to the neighbouring stage: in memory, or mailed."""
        s, mb = action.stage, action.micro_batch
        if action.kind == "F" and s < last:
            send, recv = Action(s, "SEND_F", mb), Action(s + 1, "RECV_F", mb)
        elif is_backward(action) and s > 0:
            send, recv = Action(s, "SEND_B", mb), Action(s - 1, "RECV_B", mb)
        else:
            return
        if stage_ranks[recv.stage] == rank:
            arrived[rank].add((recv.kind, recv.stage, mb))
        else:
            outbox[rank].append((send, recv))

    def ready(rank: int, action: Action) -> bool:
        s, mb = action.stage, action.micro_batch
        if action.kind == "F" and s > 0:
            return ("RECV_F", s, mb) in arrived[rank]
        if is_backward(action) and s < last:
            return ("RECV_B", s, mb) in arrived[rank]
        return True

    now = 0.0
    while True:
        moved = True
        while moved:
            moved = False
            while finishing and finishing[0][0] <= now:
                _, rank, action = heapq.heappop(finishing)
                finish(rank, action)
            for rank in range(n):  # messages first: both ends free now
                for _ in range(len(outbox[rank])):
                    send, recv = outbox[rank][0]
                    dst = stage_ranks[recv.stage]
                    if busy_until[rank] > now or busy_until[dst] > now:
                        break
                    outbox[rank].popleft()
                    out[rank].append(send)
                    out[dst].append(recv)
                    arrived[dst].add((recv.kind, recv.stage, recv.micro_batch))
                    busy_until[rank] = busy_until[dst] = now + costs.p2p
                    moved = True
            for rank in range(n):  # then computations, on ranks with nothing left to send
                actions = schedule.actions[rank]
                if busy_until[rank] > now or outbox[rank] or cursor[rank] == len(actions):
                    continue
                action = actions[cursor[rank]]
                if not ready(rank, action):
                    continue
                out[rank].append(action)
                cursor[rank] += 1
                busy_until[rank] = now + costs.of(action)
                heapq.heappush(finishing, (busy_until[rank], rank, action))
                moved = True
        later = [t for t in busy_until if t > now] + [t for t, _, _ in finishing if t > now]
        if not later:
            break
        now = min(later)
    if any(outbox) or any(c < len(a) for c, a in zip(cursor, schedule.actions, strict=True)):
        raise AssertionError(f"placing the messages of {schedule.name} left some unplaced")
    return Schedule(schedule.name, schedule.n_micro, stage_ranks, tuple(map(tuple, out)))


def bytes_sent_per_rank(schedule: Schedule, activation_bytes: int) -> list[int]:
    """Bytes each rank sends in one step: for every stage boundary that crosses ranks, each of
    the ``m`` micro-batches sends one activation forward and one gradient (same size) back.
    Interleaving with ``v`` chunks per rank crosses ``v`` times as many boundaries."""
    sent = [0] * schedule.n_ranks
    for s in range(schedule.n_stages - 1):
        here, there = schedule.stage_ranks[s], schedule.stage_ranks[s + 1]
        if here != there:
            sent[here] += schedule.n_micro * activation_bytes  # activation forward
            sent[there] += schedule.n_micro * activation_bytes  # its gradient back
    return sent
