"""A :class:`~dtlab.comm.communicator.Communicator`'s point-to-point methods.

``send``/``recv`` block; ``start_exchange`` (and ``isend``/``irecv``) posts messages and returns
a :class:`~dtlab.comm.pending.PendingMessages` to ``wait()`` on, so a ring or a pipeline can
compute while its next block travels. Each method names its peer by *group* rank and hands the
work to :mod:`dtlab.comm.messages` (who sends what to whom, counted from the messages on either
path).

It stands alone because messages between two ranks are a different concept from the
communicator's collectives over the whole group; :class:`PointToPoint` is the communicator's
base class, so these stay ``Communicator`` methods. It holds no state of its own: the functions
of :mod:`dtlab.comm.messages` read the communicator's (its path ``via``, its group and ranks,
``comm_stats``, ``span_labels()``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dtlab.comm import messages
from dtlab.comm.pending import PendingMessages


class PointToPoint:
    """The point-to-point half of :class:`~dtlab.comm.communicator.Communicator`."""

    def send(self, tensor: torch.Tensor, to: int, name: str = "send") -> None:
        """Send ``tensor`` to group rank ``to`` (blocking until the receiver has it)."""
        messages.point_to_point(self, "send", tensor, to, name)

    def recv(self, tensor: torch.Tensor, source: int | None = None, name: str = "recv") -> int:
        """Receive into ``tensor`` from group rank ``source`` and return ``source``. ``None``
        takes the next message from *any* rank and returns the group rank that sent it (torch's
        path only: the counted layer matches every message to a named peer)."""
        if source is None:
            return messages.recv_from_anyone(self, tensor, name)
        messages.point_to_point(self, "recv", tensor, source, name)
        return source

    def start_exchange(
        self,
        sends: Sequence[tuple[int, torch.Tensor]] = (),
        recvs: Sequence[tuple[int, torch.Tensor]] = (),
        *,
        name: str,
        op: str | None = None,
    ) -> PendingMessages:
        """Post every ``(group rank, tensor)`` send and receive now and return the handle to
        ``wait()`` on before reading a received tensor or reusing a sent one; counted from the
        posted messages (:func:`dtlab.comm.messages.start_exchange`)."""
        return messages.start_exchange(self, sends, recvs, name, op)

    def isend(self, tensor: torch.Tensor, to: int, name: str = "isend") -> PendingMessages:
        """Start sending ``tensor`` to group rank ``to`` (see :meth:`start_exchange`)."""
        return self.start_exchange(sends=[(to, tensor)], name=name)

    def irecv(self, tensor: torch.Tensor, source: int, name: str = "irecv") -> PendingMessages:
        """Start receiving group rank ``source``'s next message into ``tensor``."""
        return self.start_exchange(recvs=[(source, tensor)], name=name)
