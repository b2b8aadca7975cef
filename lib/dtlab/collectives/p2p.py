"""The counted point-to-point layer every collective in this package is built on.

A collective here is a sequence of *steps*. In one step a rank posts all its sends and receives
at once (``torch.distributed.batch_isend_irecv``: non-blocking ``isend``/``irecv`` pairs, grouped
so NCCL launches them together) and waits for all of them. :meth:`Peers.exchange` is that step.
It also

* counts, per rank, messages and bytes sent and received into a :class:`CommStats`, so a test can
  hold the traffic of "ring all-reduce" to ``2 (N-1)/N * M`` bytes exactly, and
* records one ``comm`` trace span per step (labelled ``comm_step`` and ``to=[[peer, bytes], ...]``;
  ``comm_step`` never clobbers a caller's own ``step`` label), so a ring
  all-reduce draws its ``2 (N-1)`` steps on the Cluster's timeline and :func:`traffic_matrix`
  can say who sent how much to whom.

Ranks are addressed by their index *within the group* (``0 .. size-1``); :class:`Peers` translates
to global ranks. A group is ``None`` (every rank), a ``torch.distributed`` process group, or a plain
list of global ranks — sends and receives go over the default group, so a list needs no
``dist.new_group`` call and costs nothing to make. The one exception is a thread inside
:func:`routed_over`: a background stream (:mod:`dtlab.comm.background`) runs whole collectives
there, its messages marked with a tag of their own, so they never match the calling thread's.

Empty chunks (a 3-element buffer cut into 4) are skipped on both sides: they cost no message.

Before its payload moves, every public collective exchanges a small *control message* — a
descriptor of the call, so ranks that disagree on sizes fail at once instead of hanging
(:mod:`dtlab.collectives.agreement`). :meth:`Peers.exchange_control` and
:meth:`Peers.all_gather_control` carry it (and :meth:`Peers.all_reduce_control` a scalar report
of a parallel layer, through :meth:`dtlab.comm.Communicator.all_reduce_control`): not counted in
:class:`CommStats` (byte counts stay the payload's), drawn as a span of kind ``other``.

A schedule that wants more than one step in flight — the pipelined ring
(:mod:`dtlab.collectives.ring_pipeline`) — posts single messages instead:
:meth:`Peers.post_send` and :meth:`Peers.post_recv` start one and return a handle to ``wait()``
on, counted the moment they are posted. Messages between two ranks match in the order they were
posted, as in MPI and gloo. Only transports whose ``streams`` is true allow it (gloo and the
simulated one; not NCCL, see :attr:`TorchTransport.streams`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist

from dtlab import trace
from dtlab.collectives.stats import CommStats

# DONE and _Done stay reachable here: the simulated transport answers with them.
from dtlab.collectives.transport import DONE, TorchTransport, _Done  # noqa: F401

# torch 2.13 renamed all_gather_into_tensor to all_gather_single; 2.11 has only the old name.
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

_process_stats = CommStats()
# A simulated world (dtlab.collectives.simulated) runs ranks as threads; each thread carries
# its own rank, transport and counters here, and whether it is sending control messages.
_thread = threading.local()


def sending_control() -> bool:
    """Whether this thread is posting a control message now (:meth:`Peers.exchange_control`):
    lets an observer of the raw messages — a grader counting bytes — tell it from payload."""
    return getattr(_thread, "control", False)


def comm_stats() -> CommStats:
    """The live counters of this rank (they keep counting until :meth:`CommStats.reset`); on a
    thread inside :func:`routed_over`, that thread's own counters."""
    simulated = getattr(_thread, "world", None)
    if simulated is not None:
        return simulated.comm_stats
    route = getattr(_thread, "route", None)
    return route[1] if route is not None else _process_stats


@contextmanager
def routed_over(tag: int, stats: CommStats) -> Iterator[None]:
    """Mark this thread's messages with ``tag`` and count them into ``stats``.

    gloo matches the messages between two ranks by posting order *per tag* (as MPI does): a
    second thread posting untagged messages would interleave with the main thread's, one
    posting with a tag of its own cannot. Its bytes go to ``stats``, not to the process's
    counters, so a :func:`counting` block on the main thread never picks up this thread's
    traffic; the caller adds them when the work is waited for (:mod:`dtlab.comm.background`).
    """
    previous = getattr(_thread, "route", None)
    _thread.route = (tag, stats)
    try:
        yield
    finally:
        _thread.route = previous


@contextmanager
def counting() -> Iterator[CommStats]:
    """Measure the traffic of a block: ``with counting() as moved: ...; moved.bytes_sent``."""
    delta = CommStats()
    before = comm_stats().snapshot()
    try:
        yield delta
    finally:
        moved = comm_stats() - before
        for name, value in moved.as_dict().items():
            setattr(delta, name, value)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


Group = dist.ProcessGroup | Sequence[int] | None
"""Whom a collective runs over: ``None`` (every rank), a process group, or a list of global ranks."""


class Peers:
    """The ranks one collective runs over, numbered ``0 .. size-1``, and the step that moves data."""

    def __init__(
        self, global_ranks: Sequence[int], my_global_rank: int, transport, stats, torch_group=None
    ):
        self.global_ranks = list(global_ranks)
        # The torch process group of exactly these ranks, in this order, when there is one.
        self.torch_group = torch_group
        if my_global_rank not in self.global_ranks:
            raise ValueError(
                f"rank {my_global_rank} is not in group {self.global_ranks}; only member ranks "
                "may call a collective on it"
            )
        self.rank = self.global_ranks.index(my_global_rank)
        self.size = len(self.global_ranks)
        self._transport = transport
        self._stats = stats

    @property
    def right(self) -> int:
        """The next rank on the ring."""
        return (self.rank + 1) % self.size

    @property
    def left(self) -> int:
        """The previous rank on the ring."""
        return (self.rank - 1) % self.size

    def subgroup(self, indices: Sequence[int]) -> Peers:
        """The peers at ``indices`` of this group (e.g. the ranks of one "node")."""
        me = self.global_ranks[self.rank]
        return Peers([self.global_ranks[i] for i in indices], me, self._transport, self._stats)

    def exchange(
        self,
        sends: Sequence[tuple[int, torch.Tensor]] = (),
        recvs: Sequence[tuple[int, torch.Tensor]] = (),
        *,
        name: str,
        step: int = 0,
    ) -> None:
        """One step: post every ``(peer, tensor)`` send and receive together, then wait for all.

        Receives land in the given tensors (views of a bigger buffer are fine: they must be
        contiguous). The step is counted in :func:`comm_stats` and drawn as one ``comm`` span.
        """
        sends = [(p, t) for p, t in sends if t.numel() > 0]
        recvs = [(p, t) for p, t in recvs if t.numel() > 0]
        if not sends and not recvs:
            return
        sent = sum(_nbytes(t) for _, t in sends)
        received = sum(_nbytes(t) for _, t in recvs)
        to = [[self.global_ranks[p], _nbytes(t)] for p, t in sends]
        with trace.cuda_span(
            name, kind="comm", nbytes=sent, comm_step=step, received=received, to=to
        ):
            self._transport.exchange(
                [(self.global_ranks[p], t) for p, t in sends],
                [(self.global_ranks[p], t) for p, t in recvs],
            )
        stats = self._stats
        stats.messages_sent += len(sends)
        stats.bytes_sent += sent
        stats.messages_received += len(recvs)
        stats.bytes_received += received

    @contextmanager
    def _as_control(self, name: str, nbytes: int, **labels) -> Iterator[None]:
        _thread.control = True
        try:
            with trace.span(name, kind="other", nbytes=nbytes, control=True, **labels):
                yield
        finally:
            _thread.control = False

    def exchange_control(
        self,
        sends: Sequence[tuple[int, torch.Tensor]] = (),
        recvs: Sequence[tuple[int, torch.Tensor]] = (),
        *,
        name: str,
        step: int = 0,
    ) -> None:
        """One step of *control* messages (what the ranks agree on before a payload moves):
        posted like :meth:`exchange`, but not counted in :func:`comm_stats`, so a collective's
        bytes stay exactly its payload's; drawn as a span of kind ``other`` without a ``to``
        label, so :func:`traffic_matrix` leaves it out too."""
        with self._as_control(name, sum(_nbytes(t) for _, t in sends), comm_step=step):
            self._transport.exchange(
                [(self.global_ranks[p], t) for p, t in sends],
                [(self.global_ranks[p], t) for p, t in recvs],
            )

    def all_gather_control(
        self, out: torch.Tensor, mine: torch.Tensor, *, name: str, **labels
    ) -> None:
        """Every rank's ``mine`` into ``out`` (rank order) as a control message, by the torch
        group's own all-gather (:attr:`torch_group` must be set): on gloo a tiny collective
        slows the point-to-point payload after it less than control messages on its links do.
        ``labels`` go on its span."""
        with self._as_control(name, _nbytes(mine), **labels):
            _all_gather_tensor(out, mine, group=self.torch_group)

    def all_reduce_control(
        self, tensor: torch.Tensor, *, name: str, op=dist.ReduceOp.SUM, **labels
    ) -> None:
        """Combine ``tensor`` in place over the group as a control message (a report such as a
        loss or a norm, not payload), by the torch group's own all-reduce (:attr:`torch_group`
        must be set). ``labels`` go on its span."""
        with self._as_control(name, _nbytes(tensor), **labels):
            dist.all_reduce(tensor, op=op, group=self.torch_group)

    @property
    def streams(self) -> bool:
        """Whether :meth:`post_send`/:meth:`post_recv` may be used (see :class:`TorchTransport`)."""
        return self._transport.streams

    def post_send(self, peer: int, tensor: torch.Tensor):
        """Start sending ``tensor`` to ``peer``; returns a handle whose ``wait()`` returns once
        ``tensor`` may be reused. Counted now; not traced (the caller draws its own steps)."""
        if tensor.numel() == 0:
            return DONE
        self._stats.messages_sent += 1
        self._stats.bytes_sent += _nbytes(tensor)
        return self._transport.post_send(self.global_ranks[peer], tensor)

    def post_recv(self, peer: int, tensor: torch.Tensor):
        """Start receiving ``peer``'s next message into ``tensor`` (contiguous); ``wait()`` on
        the handle returns once it has landed. Counted now; not traced."""
        if tensor.numel() == 0:
            return DONE
        self._stats.messages_received += 1
        self._stats.bytes_received += _nbytes(tensor)
        return self._transport.post_recv(self.global_ranks[peer], tensor)

    def send(self, peer: int, tensor: torch.Tensor, *, name: str, step: int = 0) -> None:
        self.exchange(sends=[(peer, tensor)], name=name, step=step)

    def recv(self, peer: int, tensor: torch.Tensor, *, name: str, step: int = 0) -> None:
        self.exchange(recvs=[(peer, tensor)], name=name, step=step)


def peers_of(group: Group = None) -> Peers:
    """The :class:`Peers` of ``group`` for this rank: ``None`` means every rank.

    ``group`` may be a process group or a list of global ranks (in the order that defines the
    ring). Outside a process group this is a world of one rank.
    """
    simulated = getattr(_thread, "world", None)
    if simulated is not None:
        ranks = range(simulated.size) if group is None else list(group)
        return Peers(ranks, simulated.rank, simulated.transport, simulated.comm_stats)
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None and list(group) != [0]:
            raise RuntimeError("no process group is initialised: run this inside cluster.run(...)")
        return Peers([0], 0, TorchTransport(), _process_stats)
    torch_group = None
    if group is None:
        ranks, torch_group = list(range(dist.get_world_size())), dist.GroupMember.WORLD
    elif isinstance(group, dist.ProcessGroup):
        ranks, torch_group = dist.get_process_group_ranks(group), group
    else:
        ranks = [int(r) for r in group]
    if len(set(ranks)) != len(ranks) or not all(0 <= r < dist.get_world_size() for r in ranks):
        raise ValueError(
            f"group {ranks} must list distinct ranks in 0..{dist.get_world_size() - 1}"
        )
    route = getattr(_thread, "route", None)
    if route is None:
        return Peers(ranks, dist.get_rank(), TorchTransport(), _process_stats, torch_group)
    tag, stats = route  # a background stream: control messages too go as tagged messages
    return Peers(ranks, dist.get_rank(), TorchTransport(tag), stats)


def traffic_matrix(spans, world_size: int) -> list[list[int]]:
    """``matrix[src][dst]`` = bytes rank ``src`` sent to rank ``dst`` in a run's trace spans
    (e.g. ``cluster.run(...).trace.spans``): the picture of who sends what."""
    matrix = [[0] * world_size for _ in range(world_size)]
    for s in spans:
        for peer, nbytes in s.labels.get("to", ()) if s.kind == "comm" else ():
            matrix[s.rank][peer] += nbytes
    return matrix
