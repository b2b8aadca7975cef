"""A world of ranks as threads in one process, for checking a schedule at any world size.

``simulate(6, fn)`` runs ``fn`` on six threads, each believing it is one rank: every collective in
this package sees the simulated rank and world size, and its messages travel through in-memory
queues (one FIFO per sender→receiver pair, as a real transport orders them). Counters and results
are per thread. It checks *who sends what to whom* at world sizes the CPU cannot afford to start
as processes (5, 6, 7, ...); it measures nothing about speed.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dtlab.collectives import p2p


class _QueueTransport:
    def __init__(self, mailboxes: dict[tuple[int, int], queue.Queue], me: int, timeout: float):
        self._mailboxes = mailboxes
        self._me = me
        self._timeout = timeout

    def exchange(
        self,
        sends: Sequence[tuple[int, torch.Tensor]],
        recvs: Sequence[tuple[int, torch.Tensor]],
        on_arrival: Callable[[int], None] | None = None,
    ) -> None:
        for peer, tensor in sends:
            self._mailboxes[(self._me, peer)].put(tensor.clone())
        for peer, tensor in recvs:
            try:
                message = self._mailboxes[(peer, self._me)].get(timeout=self._timeout)
            except queue.Empty:
                raise TimeoutError(
                    f"simulated rank {self._me} waited {self._timeout}s for a message from rank "
                    f"{peer} that never came: the schedule's sends and receives do not match"
                ) from None
            if message.shape != tensor.shape or message.dtype != tensor.dtype:
                raise RuntimeError(
                    f"simulated rank {self._me} expected {tuple(tensor.shape)} {tensor.dtype} "
                    f"from rank {peer} but got {tuple(message.shape)} {message.dtype}"
                )
            tensor.copy_(message)
        for i in range(len(recvs)) if on_arrival is not None else ():
            on_arrival(i)


@dataclass
class _SimulatedRank:
    rank: int
    size: int
    transport: _QueueTransport
    stats: p2p.CommStats = field(default_factory=p2p.CommStats)


def simulate(world_size: int, fn: Callable[..., Any], *args, timeout: float = 10.0, **kwargs):
    """Run ``fn(*args, **kwargs)`` on ``world_size`` simulated ranks; results in rank order.

    Inside ``fn``, :func:`dtlab.collectives.p2p.comm_stats` gives this rank's counters and
    :func:`rank_of_simulation` its rank. An exception on any rank is re-raised naming the rank.
    """
    mailboxes = {(s, d): queue.Queue() for s in range(world_size) for d in range(world_size)}
    results: list[Any] = [None] * world_size
    errors: list[tuple[int, BaseException]] = []

    def body(r: int) -> None:
        p2p._thread.world = _SimulatedRank(r, world_size, _QueueTransport(mailboxes, r, timeout))
        try:
            results[r] = fn(*args, **kwargs)
        except BaseException as error:  # re-raised below, naming the rank
            errors.append((r, error))
        finally:
            p2p._thread.world = None

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        r, error = min(errors, key=lambda e: e[0])
        raise RuntimeError(f"simulated rank {r} failed: {error!r}") from error
    return results


def rank_of_simulation() -> int:
    """This thread's simulated rank (for use inside ``simulate``)."""
    return p2p._thread.world.rank
