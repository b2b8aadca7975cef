"""How a message really travels: :class:`TorchTransport` posts it on the default process group.

:mod:`dtlab.collectives.p2p` counts and traces every message and decides which transport carries
it: this one for real ranks (gloo or NCCL), :mod:`dtlab.collectives.simulated`'s for ranks run as
threads. A transport knows nothing of bytes counted or spans drawn; it only moves tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


class _Done:
    """The handle of a message that needs no waiting (an empty one, or one already delivered)."""

    def wait(self) -> None:
        return None


DONE = _Done()


class TorchTransport:
    """Real messages: ``batch_isend_irecv`` over the default process group (gloo or NCCL).

    With a nonzero ``tag`` (a background stream, gloo only) every message carries it and is
    posted on the world group's own ``send``/``recv``: gloo's ``batch_isend_irecv`` is that same
    loop of single posts, and the runtime's bookkeeping of ``torch.distributed`` calls
    (:mod:`dtlab.runtime.inflight`) belongs to the main thread, whose blocking it tracks.
    """

    def __init__(self, tag: int = 0) -> None:
        self.tag = tag

    @property
    def streams(self) -> bool:
        """Whether single sends and receives may be posted ahead and completed out of step.

        gloo: yes — each ``isend``/``irecv`` progresses on its own in gloo's I/O thread. NCCL:
        no — point-to-point ops between two ranks run in posting order on one CUDA stream, so two
        ranks that each post a receive before their send wait on each other forever; NCCL needs
        a step's sends and receives launched as one group (``batch_isend_irecv``).
        """
        return not (dist.is_initialized() and dist.get_backend() == "nccl")

    def post_send(self, peer: int, tensor: torch.Tensor):
        if self.tag:
            return dist.group.WORLD.send([tensor], peer, self.tag)
        return dist.isend(tensor, peer)

    def post_recv(self, peer: int, tensor: torch.Tensor):
        if self.tag:
            return dist.group.WORLD.recv([tensor], peer, self.tag)
        return dist.irecv(tensor, peer)

    def exchange(
        self,
        sends: Sequence[tuple[int, torch.Tensor]],
        recvs: Sequence[tuple[int, torch.Tensor]],
    ) -> None:
        if self.tag:
            works = [self.post_send(peer, tensor) for peer, tensor in sends]
            works += [self.post_recv(peer, tensor) for peer, tensor in recvs]
            for work in works:
                work.wait()
            return
        ops = [dist.P2POp(dist.isend, tensor, peer) for peer, tensor in sends]
        ops += [dist.P2POp(dist.irecv, tensor, peer) for peer, tensor in recvs]
        for work in dist.batch_isend_irecv(ops):  # NCCL coalesces the batch into one work
            work.wait()
