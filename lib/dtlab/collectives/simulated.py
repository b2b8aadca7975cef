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
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dtlab.collectives import auto, p2p
from dtlab.cost.alpha_beta import Link


class _PostedRecv:
    """A receive posted on a simulated rank; messages fill posted receives in posting order."""

    def __init__(self, transport: _QueueTransport, peer: int, tensor: torch.Tensor):
        self._transport, self.peer, self.tensor, self.landed = transport, peer, tensor, False

    def wait(self) -> None:
        posted = self._transport.posted[self.peer]
        while not self.landed:  # fill every older receive from this peer first (FIFO matching)
            posted.popleft()._land()

    def _land(self) -> None:
        me, peer, tensor = self._transport.me, self.peer, self.tensor
        try:
            message = self._transport.mailboxes[(peer, me)].get(timeout=self._transport.timeout)
        except queue.Empty:
            raise TimeoutError(
                f"simulated rank {me} waited {self._transport.timeout}s for a message from rank "
                f"{peer} that never came: the schedule's sends and receives do not match"
            ) from None
        if message.shape != tensor.shape or message.dtype != tensor.dtype:
            raise RuntimeError(
                f"simulated rank {me} expected {tuple(tensor.shape)} {tensor.dtype} "
                f"from rank {peer} but got {tuple(message.shape)} {message.dtype}"
            )
        tensor.copy_(message)
        self.landed = True


class _QueueTransport:
    streams = True  # a send never blocks: posting ahead is always safe

    def __init__(self, mailboxes: dict[tuple[int, int], queue.Queue], me: int, timeout: float):
        self.mailboxes = mailboxes
        self.me = me
        self.timeout = timeout
        self.posted: dict[int, deque[_PostedRecv]] = defaultdict(deque)

    def post_send(self, peer: int, tensor: torch.Tensor) -> p2p._Done:
        self.mailboxes[(self.me, peer)].put(tensor.clone())
        return p2p.DONE

    def post_recv(self, peer: int, tensor: torch.Tensor) -> _PostedRecv:
        handle = _PostedRecv(self, peer, tensor)
        self.posted[peer].append(handle)
        return handle

    def exchange(
        self,
        sends: Sequence[tuple[int, torch.Tensor]],
        recvs: Sequence[tuple[int, torch.Tensor]],
    ) -> None:
        for peer, tensor in sends:
            self.post_send(peer, tensor)
        handles = [self.post_recv(peer, tensor) for peer, tensor in recvs]
        for handle in handles:
            handle.wait()


@dataclass
class _SimulatedRank:
    rank: int
    size: int
    transport: _QueueTransport
    comm_stats: p2p.CommStats = field(default_factory=p2p.CommStats)
    link_model: Link | None = None  # what algorithm="auto" prices with (dtlab.collectives.auto)


def simulate(world_size: int, fn: Callable[..., Any], *args, timeout: float = 10.0, **kwargs):
    """Run ``fn(*args, **kwargs)`` on ``world_size`` simulated ranks; results in rank order.

    Inside ``fn``, :func:`dtlab.collectives.p2p.comm_stats` gives this rank's counters and
    :func:`rank_of_simulation` its rank. An exception on any rank is re-raised naming the rank.
    """
    mailboxes = {(s, d): queue.Queue() for s in range(world_size) for d in range(world_size)}
    results: list[Any] = [None] * world_size
    errors: list[tuple[int, BaseException]] = []
    inherited = auto.link_model()  # each simulated rank starts from the process's link model

    def body(r: int) -> None:
        transport = _QueueTransport(mailboxes, r, timeout)
        p2p._thread.world = _SimulatedRank(r, world_size, transport, link_model=inherited)
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
