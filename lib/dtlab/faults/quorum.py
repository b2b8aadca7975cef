"""Per-step quorums over a key-value store: who is alive, who rejoins, one decision for all.

torchft (Rice et al., PyTorch 2024–25) keeps a job alive through failures by deciding, every
step, which data-parallel replicas take part — the *quorum* — and reconfiguring the replicas'
communicator to exactly those. Its lighthouse server makes the decision; here the job's own
``TCPStore`` (hosted by Cluster rank 0, see :mod:`dtlab.faults.replicas`) plays that role:

* every live replica posts ``join/<step>/<r>`` and waits up to ``heartbeat_s`` for the members of
  the previous quorum to post theirs — a replica that stays silent is presumed dead (a missed
  heartbeat: the same detection a real lighthouse uses);
* a replacement asks to come back with ``rejoin/<r>`` (a counter) and blocks on its admission;
  its launcher announces it with ``starting/<r>`` (a counter) as soon as it sees the old process
  die, and a quorum waits up to ``join_timeout_s`` for an announced replacement to ask (torchft's
  lighthouse likewise waits ``join_timeout`` for replicas that heartbeat but have not joined);
* each live replica proposes ``members`` and ``rejoiners``; ``compare_set`` on
  ``quorum/<step>/<attempt>`` keeps the *first* proposal, so all replicas act on the same
  decision; whoever wrote it admits the rejoiners at that step;
* after the step's all-reduce every member votes (:func:`should_commit`, torchft's
  ``Manager.should_commit``): the step is committed only if *every* member's collective
  succeeded; one failed (or silent) member aborts it for all — the optimizer is not stepped and
  the same step is tried again as ``attempt + 1`` with a new quorum.
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
    attempt: int = 0  # > 0: the step is being redone after an aborted (uncommitted) attempt

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
    attempt: int = 0,
) -> Quorum:
    """A live replica's part in deciding the quorum of ``step`` (see module docstring)."""
    key = f"{step}/{attempt}"
    store.set(f"join/{key}/{me}", "1")
    deadline = time.monotonic() + heartbeat_s
    while True:
        joined = [r for r in previous if store.check([f"join/{key}/{r}"])]
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
    decided = store.compare_set(f"quorum/{key}", "", proposal).decode()
    if decided == proposal:
        for r, count in rejoiners:
            store.set(f"admit/{r}/{count}", key)
    return read_quorum(store, key)


def read_quorum(store, key: str) -> Quorum:
    """The quorum decided under ``key`` = ``"<step>/<attempt>"``."""
    d = json.loads(store.get(f"quorum/{key}").decode())
    step, attempt = (int(k) for k in key.split("/"))
    return Quorum(step, tuple(d["members"]), tuple(r for r, _ in d["rejoiners"]), attempt)


def should_commit(store, quorum: Quorum, me: int, ok: bool, timeout_s: float) -> bool:
    """Vote on committing this attempt of the step: ``ok`` = my all-reduce succeeded.

    One decision for all members (``compare_set`` keeps the first): ``commit`` only once every
    member voted ok; ``abort`` as soon as one failed, or when one stays silent for
    ``timeout_s`` (it died before voting). A member whose collective broke votes abort at once.
    """
    key = f"{quorum.step}/{quorum.attempt}"
    decision = "abort"
    if ok:
        store.set(f"vote/{key}/{me}", "1")
        votes = [f"vote/{key}/{r}" for r in quorum.members]
        deadline = time.monotonic() + timeout_s
        while not store.add(f"failed/{key}", 0) and time.monotonic() < deadline:
            if store.check(votes):
                decision = "commit"
                break
            time.sleep(0.0005)
    else:
        store.add(f"failed/{key}", 1)
    return store.compare_set(f"commit/{key}", "", decision).decode() == "commit"


def announce_replacement(store, r: int) -> None:
    """A launcher: replica ``r``'s replacement is starting (quorums wait for its request)."""
    store.add(f"starting/{r}", 1)


def request_rejoin(store, me: int) -> Quorum:
    """A replacement: ask to rejoin and block until a quorum admits it; return that quorum."""
    count = store.add(f"rejoin/{me}", 1)
    return read_quorum(store, store.get(f"admit/{me}/{count}").decode())
