"""Watch one ``Cluster.run``: collect every rank's reply, and tell a hang from slow work.

A rank is *stuck* only when it is blocked in a tracked operation that can never complete: a peer
it needs has already returned from the function having posted fewer matching operations
(:func:`~dtlab.runtime.matching.never_joined`; :mod:`dtlab.runtime.inflight` keeps the counts).
A rank that computes, sleeps or waits on a peer that is still running is not stuck, however long
it takes — up to the Cluster's ``timeout``. While some ranks have returned and others have not,
the watcher asks the others for their status, soon after each return and then less often (a
pipe round trip each).

Some waits happen where no tracked call shows (torch's C++ DDP reducer inside ``backward()``).
Once a rank has raised, a rank that sits in the same torch frame using no CPU time for
``_IDLE_S`` is judged by that lack of progress instead: it is waiting, not computing.

The same rule judges the operations a rank left unfinished when its function returned: one whose
peer returned without its side raises :class:`UnfinishedWork` and restarts the pool, because it
would otherwise be matched by the next run's messages.
"""

from __future__ import annotations

import math
import signal
import time
from multiprocessing.connection import wait
from textwrap import indent

from dtlab.runtime.errors import (
    ClusterTimeout,
    RankDied,
    RankError,
    ResultNotPicklable,
    UnfinishedWork,
)
from dtlab.runtime.hang import describe_blocking_call, describe_op, describe_status
from dtlab.runtime.matching import never_joined

_FIRST_LOOK_S = 0.01  # first status question after a rank returns; the gap doubles up to ...
_LOOK_EVERY_S = 1.0
_IDLE_S, _IDLE_CPU_SHARE = 1.0, 0.05  # no progress: the same torch frame, under 5% of a core
_RESTARTED = "The cluster was restarted; the next run starts fresh ranks."


def _signal_name(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class RunWatch:
    """Collects the replies to call ``call_id``; raises the Cluster's errors. ``discard_pool``
    kills the ranks (after a hang, a death or unfinished work the next run needs fresh ones)."""

    def __init__(
        self, pool, world_size: int, call_id: int, timeout: float, discard_pool, on_progress=None
    ):
        self.pool, self.world_size, self.call_id = pool, world_size, call_id
        self.on_progress = on_progress  # (rank, (done, total, desc)) -> None; dtlab.progress
        self.timeout, self.discard_pool = timeout, discard_pool
        self.replies: list[tuple | None] = [None] * world_size
        self.running = set(range(world_size))  # the function has not returned yet
        self.finished: dict[int, dict] = {}  # returned: the rank's counts of posted operations
        self.draining: dict[int, list[dict]] = {}  # returned with work still in flight
        self.statuses: dict[int, dict] = {}
        self.asked: dict[int, int] = {}
        self.seen: dict[int, list] = {}  # rank -> [stack, since, CPU s then, CPU s now, now]

    def collect(self) -> list[tuple]:
        pool, pending = self.pool, set(range(self.world_size))
        deadline = time.monotonic() + self.timeout
        gap, next_look = _FIRST_LOOK_S, math.inf
        while pending:
            waitables = [pool.conns[r] for r in pending] + [pool.procs[r].sentinel for r in pending]
            waitables += [pool.diag[r] for r in self.asked]
            ready = wait(waitables, timeout=max(0.0, min(deadline, next_look) - time.monotonic()))
            returned = False
            for rank in sorted(pending):
                if pool.conns[rank] in ready:
                    try:
                        reply = pool.conns[rank].recv()
                    except (EOFError, OSError):
                        self._raise_rank_died(rank)  # its end of the pipe closed
                    returned |= self._take(rank, reply, pending)
                elif pool.procs[rank].sentinel in ready:
                    self._raise_rank_died(rank)
            self._take_answers(ready)
            self._judge()
            now = time.monotonic()
            if now >= deadline:
                self._raise_unfinished(sorted(pending), timed_out=True)
            if returned:
                gap, next_look = _FIRST_LOOK_S, now + _FIRST_LOOK_S
            if not (self.running and self.finished):
                next_look = math.inf
            elif now >= next_look:
                for rank in self.running - set(self.asked):
                    self.asked[rank] = pool.ask_status(rank)
                gap = min(2 * gap, _LOOK_EVERY_S)
                next_look = now + gap
        if any(reply[0] == "error" for reply in self.replies):
            self._raise_rank_error({})
        return self.replies

    def _take(self, rank: int, reply: tuple, pending: set[int]) -> bool:
        if reply[1] != self.call_id:
            return False
        if reply[0] == "progress":  # not a reply: the rank is still running
            if self.on_progress is not None:
                self.on_progress(rank, reply[2])
            return False
        if reply[0] == "draining":
            self.draining[rank] = reply[2]["unfinished"]
            self.finished[rank] = reply[2]["counts"]
        else:
            self.replies[rank] = reply
            self.finished[rank] = reply[4]
            self.draining.pop(rank, None)
            pending.discard(rank)
        self.running.discard(rank)
        self.statuses.pop(rank, None)
        return True

    def _take_answers(self, ready: list) -> None:
        for rank in [r for r in self.asked if self.pool.diag[r] in ready]:
            try:
                number, status = self.pool.diag[rank].recv()
            except (EOFError, OSError):
                del self.asked[rank]  # the rank is gone: its sentinel says how
                continue
            if number == self.asked[rank]:
                del self.asked[rank]
                if rank in self.running and status.get("state") == "running":
                    self.statuses[rank] = status
                    self._note_progress(rank, status)

    def _note_progress(self, rank: int, status: dict) -> None:
        """Since when ``rank`` has shown this same stack, and its CPU time then and now."""
        now, cpu = time.monotonic(), self.pool.cpu_seconds(rank)
        stack = (tuple(map(tuple, status["frames"])), bool(status.get("blocked")))
        seen = self.seen.get(rank)
        if seen is None or seen[0] != stack or cpu is None:
            self.seen[rank] = [stack, now, cpu, cpu, now]
        else:
            seen[3], seen[4] = cpu, now

    def _idle_in_torch(self, rank: int, status: dict) -> float | None:
        """Seconds ``rank`` has sat in one torch frame without using the CPU, once ``_IDLE_S``."""
        seen, frames = self.seen.get(rank), status["frames"]
        if seen is None or seen[2] is None or not frames or "/torch/" not in frames[0][0]:
            return None
        _, since, cpu_then, cpu_now, last = seen
        waited = last - since
        return (
            waited if waited >= _IDLE_S and cpu_now - cpu_then < _IDLE_CPU_SHARE * waited else None
        )

    def _judge(self) -> None:
        """Raise now if some rank waits for what can never come."""
        stuck, dead = {}, {}
        for rank, status in self.statuses.items():
            for op in status.get("blocked") or ():
                culprit = never_joined(op, rank, self.finished)
                if culprit is not None:
                    stuck[rank] = describe_status(status, culprit)
        for rank, ops in self.draining.items():
            for op in ops:
                culprit = never_joined(op, rank, self.finished)
                if culprit is not None:
                    dead.setdefault(rank, []).append(
                        f"{describe_op(op)}, started at {op['where']}"
                        + (f" inside {op['api']}" if op.get("api") else "")
                        + f" (rank {culprit} returned without posting its side)"
                    )
        failed = [r for r, rep in enumerate(self.replies) if rep is not None and rep[0] == "error"]
        for rank, status in self.statuses.items() if failed else ():
            idle = None if rank in stuck else self._idle_in_torch(rank, status)
            if idle is not None:
                stuck[rank] = (
                    f"{describe_status(status)}; no progress for {idle:.1f} s (same stack, no CPU "
                    f"time) after rank {failed[0]} raised"
                )
        if stuck or dead:
            self._raise_unfinished(sorted(self.running | set(self.draining)), stuck, dead)

    def _describe(self, ranks: list[int], known: dict[int, str]) -> dict[int, str]:
        """What each unfinished rank is doing: its status, else a faulthandler stack dump."""
        out = {r: known[r] for r in ranks if r in known}
        for r in ranks:
            if r not in out and r in self.draining:
                ops = "; ".join(describe_op(op) for op in self.draining[r])
                out[r] = f"returned, but its {ops} did not complete"
        ask = [r for r in ranks if r not in out]
        statuses = self.pool.statuses(ask) if ask else {}
        dumps = self.pool.dump_stacks([r for r in ask if r not in statuses])
        for r in ask:
            out[r] = (
                describe_status(statuses[r])
                if r in statuses
                else describe_blocking_call(dumps.get(r, ""))
            )
        return dict(sorted(out.items()))

    def _raise_unfinished(self, ranks, stuck=None, dead=None, timed_out=False) -> None:
        stuck, dead = stuck or {}, dead or {}
        descriptions = self._describe(ranks, stuck)
        for rank, ops in dead.items():
            descriptions[rank] = "returned with unfinished " + "; ".join(ops)
        self.discard_pool()
        if any(reply is not None and reply[0] == "error" for reply in self.replies):
            self._raise_rank_error(descriptions)
        lines = [f"  rank {r}: {d}" for r, d in descriptions.items()]
        done = [r for r in range(self.world_size) if self.replies[r] is not None]
        if done:
            lines.append(f"  ranks {done} finished.")
        if dead and not stuck and not timed_out:
            raise UnfinishedWork(
                f"ranks {sorted(dead)} returned with communication that can never finish:\n"
                + "\n".join(lines)
                + "\nEvery isend/irecv (and async_op=True collective) needs its peer's matching "
                "call and a wait() on its handle before the function returns. " + _RESTARTED,
                {r: ops for r, ops in dead.items()},
            )
        head = (
            f"ranks {ranks} did not finish within {self.timeout:g} s."
            if timed_out
            else f"ranks {sorted(stuck or dead)} can never finish:"
        )
        raise ClusterTimeout(
            "\n".join([head, *lines])
            + "\nA collective completes only when every rank in its group calls it with matching "
            "shapes, in the same order; a send waits for its recv. " + _RESTARTED,
            descriptions,
        )

    def _raise_rank_error(self, left_waiting: dict[int, str]) -> None:
        replies = self.replies
        failed = [r for r, rep in enumerate(replies) if rep is not None and rep[0] == "error"]
        rank = failed[0]
        exc_type, message, remote_tb, what = replies[rank][2]
        note_lines = []
        if len(failed) > 1:
            note_lines.append(f"ranks {failed} all raised; showing rank {rank}.")
        if left_waiting:
            note_lines.append(
                f"ranks {sorted(left_waiting)} were left unfinished "
                + "; ".join(f"(rank {r}: {d})" for r, d in left_waiting.items())
                + ". "
                + _RESTARTED
            )
        note = "\n".join(note_lines)
        if what == "unpicklable":
            raise ResultNotPicklable(
                rank,
                exc_type,
                f"the value returned on rank {rank} could not be sent back ({message}). Return "
                f"tensors, numbers, strings and lists/dicts of them.",
                remote_tb,
                note,
            )
        raise RankError(rank, exc_type, message, remote_tb, note)

    def _raise_rank_died(self, rank: int) -> None:
        pool = self.pool
        proc = pool.procs[rank]
        proc.join(timeout=2.0)
        exitcode = proc.exitcode
        others = [r for r in range(self.world_size) if r != rank and self.replies[r] is None]
        self.discard_pool()
        hint = ""
        if exitcode == -signal.SIGKILL:
            hint = " (SIGKILL: killed from outside, often by the out-of-memory killer)"
        words = pool.stderr_since_mark(rank)
        if words:
            said = "\nIts last words on stderr:\n" + indent(words, "  | ")
        else:
            said = "\nIt wrote nothing to stderr during the run."
        raise RankDied(
            f"rank {rank} (pid {pool.pids[rank]}) {_signal_name(exitcode)}{hint} during the run."
            + (f" Ranks {others} had not finished." if others else "")
            + f" {_RESTARTED}"
            + said,
            rank,
            exitcode,
            words,
        )
