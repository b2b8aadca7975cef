"""Per-step quorums over a key-value store: who is alive, who rejoins, one decision for all.

torchft (Rice et al., PyTorch 2024–25) keeps a job alive through failures by deciding, every
step, which data-parallel replicas take part — the *quorum* — and reconfiguring the replicas'
communicator to exactly those. Its lighthouse server makes the decision; here the job's own
rendezvous store plays that role (the ``FileStore`` every Cluster rank already shares):

* every live replica posts ``join/<step>/<r>`` and waits up to ``heartbeat_s`` for the members of
  the previous quorum to post theirs — a replica that stays silent is presumed dead (a missed
  heartbeat: the same detection a real lighthouse uses);
* a replacement asks to come back with ``rejoin/<r>`` (a counter) and blocks on its admission;
  its launcher announces it with ``starting/<r>`` (a counter) as soon as it sees the old process
  die, and a quorum waits up to ``join_timeout_s`` for an announced replacement to ask (torchft's
  lighthouse likewise waits ``join_timeout`` for replicas that heartbeat but have not joined);
* each live replica proposes ``members`` and ``rejoiners``; ``compare_set`` on
  ``quorum/<step>`` keeps the *first* proposal, so all replicas act on the same decision;
  whoever wrote it admits the rejoiners at that step.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Quorum:
    step: int
    members: tuple[int, ...]
    rejoiners: tuple[int, ...]  # members that must first copy state from a healthy peer

    @property
    def donor(self) -> int:
        """The healthy member that sends state to rejoiners (the lowest-ranked one)."""
        return min(r for r in self.members if r not in self.rejoiners)


def decide(
    store,
    step: int,
    me: int,
    previous: tuple[int, ...],
    n_replicas: int,
    heartbeat_s: float,
    join_timeout_s: float = 0.0,
) -> Quorum:
    """A live replica's part in deciding the quorum of ``step`` (see module docstring)."""
    store.set(f"join/{step}/{me}", "1")
    deadline = time.monotonic() + heartbeat_s
    while True:
        joined = [r for r in previous if store.check([f"join/{step}/{r}"])]
        if len(joined) == len(previous) or time.monotonic() > deadline:
            break
        time.sleep(0.001)
    rejoiners = []
    deadline = time.monotonic() + join_timeout_s
    for r in range(n_replicas):
        if r in previous:
            continue
        count = store.add(f"rejoin/{r}", 0)
        while count < store.add(f"starting/{r}", 0) and time.monotonic() < deadline:
            time.sleep(0.001)  # announced by its launcher, still booting: wait for its request
            count = store.add(f"rejoin/{r}", 0)
        if count and not store.check([f"admit/{r}/{count}"]):
            rejoiners.append((r, count))
    proposal = json.dumps(
        {"members": sorted(set(joined) | {r for r, _ in rejoiners}), "rejoiners": rejoiners}
    )
    decided = store.compare_set(f"quorum/{step}", "", proposal).decode()
    if decided == proposal:
        for r, count in rejoiners:
            store.set(f"admit/{r}/{count}", str(step))
    return read_quorum(store, step)


def read_quorum(store, step: int) -> Quorum:
    d = json.loads(store.get(f"quorum/{step}").decode())
    return Quorum(step, tuple(d["members"]), tuple(r for r, _ in d["rejoiners"]))


def announce_replacement(store, r: int) -> None:
    """A launcher: replica ``r``'s replacement is starting (quorums wait for its request)."""
    store.add(f"starting/{r}", 1)


def request_rejoin(store, me: int) -> Quorum:
    """A replacement: ask to rejoin and block until a quorum admits it; return that quorum."""
    count = store.add(f"rejoin/{me}", 1)
    step = int(store.get(f"admit/{me}/{count}").decode())
    return read_quorum(store, step)
