"""Point to point on a :class:`~dtlab.comm.communicator.Communicator`: who sends what to whom.

* :func:`point_to_point` — one blocking ``send`` or ``recv`` with a named group rank: on the
  counted path through :mod:`dtlab.collectives.p2p` (bytes from the message), on torch's path
  ``dist.send``/``dist.recv`` (bytes = the tensor's size).
* :func:`recv_from_anyone` — the next message from any rank (a parameter server's loop); torch's
  path only, since the counted layer matches every message to a named peer.
* :func:`start_exchange` — post several sends and receives at once and return a
  :class:`~dtlab.comm.pending.PendingMessages` to ``wait()`` on, so a ring or a pipeline
  computes while its next block travels. Counted from the posted messages on either path.

The :class:`Communicator` methods ``send``, ``recv``, ``start_exchange``, ``isend`` and ``irecv``
call these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from dtlab import collectives as C
from dtlab import trace
from dtlab.comm.pending import PendingMessages
from dtlab.comm.volumes import nbytes

if TYPE_CHECKING:
    from dtlab.comm.communicator import Communicator


def point_to_point(comm: Communicator, op: str, tensor: torch.Tensor, peer: int, name: str) -> None:
    """A blocking ``send`` or ``recv`` with group rank ``peer``, on ``comm``'s path."""
    size = nbytes(tensor)
    sent, received = (size, 0) if op == "send" else (0, size)
    if comm.via == "dtlab":
        peers = C.peers_of(comm.peer_list)
        with C.counting() as moved, trace.labels(**comm.span_labels()):
            getattr(peers, op)(peer, tensor, name=name)
        comm.comm_stats.add_call(op, moved.bytes_sent, moved.bytes_received, counted=True)
        comm.comm_stats.messages_sent += moved.messages_sent
        comm.comm_stats.messages_received += moved.messages_received
        return
    comm.comm_stats.add_call(op, sent, received, counted=False)
    call = dist.send if op == "send" else dist.recv
    with trace.cuda_span(
        name, kind="comm", nbytes=size, peer=comm.ranks[peer], **comm.span_labels()
    ):
        call(tensor, comm.ranks[peer], group=comm.group)


def recv_from_anyone(comm: Communicator, tensor: torch.Tensor, name: str) -> int:
    """Receive the next message from any rank of the group; return its group rank."""
    if comm.via == "dtlab":
        raise ValueError(
            "receiving from any rank (source=None) needs collectives='torch': dtlab's counted "
            "layer posts every receive for a named peer; pass source=<group rank>"
        )
    if dist.get_backend(comm.group) == "nccl":
        raise ValueError(
            "receiving from any rank (source=None) is not something NCCL can do: it matches "
            "every receive to a named peer. Pass source=<group rank>, or run on gloo "
            "(dtlab.Cluster(n, device='cpu'))"
        )
    comm.comm_stats.add_call("recv", 0, nbytes(tensor), counted=False)
    with trace.cuda_span(name, kind="comm", nbytes=nbytes(tensor), **comm.span_labels()):
        sender = dist.recv(tensor, group=comm.group)
    return comm.ranks.index(sender)


def start_exchange(
    comm: Communicator,
    sends: Sequence[tuple[int, torch.Tensor]],
    recvs: Sequence[tuple[int, torch.Tensor]],
    name: str,
    op: str | None,
) -> PendingMessages:
    """Post every ``(group rank, tensor)`` send and receive now; ``wait()`` on the returned
    :class:`~dtlab.comm.pending.PendingMessages` before reading a received tensor or reusing
    a sent one. Receive buffers must be contiguous. Messages between two ranks match in
    posting order.

    Counted from the posted messages on either path (point to point has no convention to
    fall back on), into ``comm_stats`` under ``"<op>_send"``/``"<op>_recv"`` (``op=None``:
    ``"send"``/``"recv"``). On transports that cannot keep single messages in flight
    (NCCL, :attr:`dtlab.collectives.transport.TorchTransport.streams`) the messages move as one
    blocking step here and the handle is already done: no overlap, no deadlock.
    """
    peers = C.peers_of(comm.ranks)
    sends, recvs = list(sends), list(recvs)
    start = trace.now_ns()
    with C.counting() as moved:
        if peers.streams:
            works = [peers.post_send(peer, t) for peer, t in sends]
            works += [peers.post_recv(peer, t) for peer, t in recvs]
        else:
            works = []
            with trace.labels(**comm.span_labels()):
                peers.exchange(sends, recvs, name=name)
    sent_as, received_as = (f"{op}_send", f"{op}_recv") if op else ("send", "recv")
    if sends:
        comm.comm_stats.add_call(sent_as, moved.bytes_sent, 0, counted=True)
    if recvs:
        comm.comm_stats.add_call(received_as, 0, moved.bytes_received, counted=True)
    comm.comm_stats.messages_sent += moved.messages_sent
    comm.comm_stats.messages_received += moved.messages_received
    to: dict[int, int] = {}
    for peer, t in sends:
        if t.numel():
            to[comm.ranks[peer]] = to.get(comm.ranks[peer], 0) + nbytes(t)
    return PendingMessages(
        works, [t for _, t in sends], name, moved.bytes_sent,
        [[rank, size] for rank, size in to.items()], comm.dim, start,
    )  # fmt: skip
