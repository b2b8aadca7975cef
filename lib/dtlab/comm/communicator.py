"""One place that runs a collective over a group: on torch's backend or on dtlab's counted rings.

Every parallel wrapper and layer moves tensors through a :class:`Communicator` bound to one group
(a mesh dimension: ``dp``, ``tp``, ``cp``, ``ep``, ``pp``); none calls ``torch.distributed``
itself. Each call records a ``comm`` span labelled with the group's dimension and ranks, plus the
micro-batch and phase of :func:`dtlab.trace.labels` in force, and adds its bytes to the
communicator's :class:`~dtlab.collectives.stats.CommStats`. It runs each collective one of two
ways, chosen with ``collectives=``:

``"torch"`` (default)
    ``torch.distributed``'s own all-reduce / reduce-scatter / all-gather (gloo's or NCCL's
    algorithms), asynchronous where asked, so communication overlaps backward as in production.
    dtlab cannot see inside them, so the bytes recorded are the nccl-tests ring *convention*
    (:func:`ring_bytes_sent`), and the record says so: ``comm_stats.counted`` is ``False``.

``"dtlab"``
    :mod:`dtlab.collectives`' ring algorithms, built from ``isend``/``irecv``; every byte is
    counted from the messages actually posted (``comm_stats.counted`` is ``True``). These run
    synchronously — the collective finishes inside the hook that issues it — so this path is for
    *measuring* what moves, not for timing overlap. Accounting tests and the labs' "measured vs
    formula" cells use it, so the equality they show can fail.

Bytes each rank sends for a payload of ``M`` bytes on ``N`` ranks (ring, ``N`` dividing the length):

=================  ===================  ==========================================
collective         bytes sent per rank   why
=================  ===================  ==========================================
all-reduce          2(N-1)/N * M         reduce-scatter phase + all-gather phase
reduce-scatter      (N-1)/N * M          ``M`` is the full (input) tensor
all-gather          (N-1)/N * M          ``M`` is the full (output) tensor
broadcast           M (chain: last 0)    pipelined chain: every rank but the last forwards M
=================  ===================  ==========================================

Spans: the torch path records one ``comm`` span per collective (CUDA events on a GPU, so it
ends when the device finishes, not when the launch returns); the counted path's spans are the
p2p layer's own, one per ring step.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from dtlab import collectives as C
from dtlab import trace
from dtlab.collectives.stats import CommStats

VIA = ("torch", "dtlab")
_TORCH_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}

_RING_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0 if n > 1 else 0.0,
}

# torch 2.13 renamed the "tensor" collectives to "*_single"; 2.11 only has the old names.
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def ring_bytes_sent(op: str, payload_bytes: int, world_size: int) -> float:
    """Bytes one rank sends for ``op`` on a ``payload_bytes`` tensor (nccl-tests convention)."""
    if op not in _RING_FACTOR:
        raise ValueError(f"unknown collective {op!r}; choose one of {sorted(_RING_FACTOR)}")
    return _RING_FACTOR[op](world_size) * payload_bytes


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class PendingCollective:
    """A collective in flight; :meth:`wait` blocks until it is done and records its spans.

    The ``comm`` span runs from launch to completion, so it shows how much of the communication
    ran under compute; the time spent blocked in :meth:`wait` is recorded separately as an
    ``idle`` span named ``wait:<name>`` — that is the *exposed* part. On a GPU both ends are CUDA
    events on the compute stream (``wait`` makes that stream wait for the NCCL stream).
    """

    def __init__(
        self, work: dist.Work | None, name: str, sent: float, labels: dict | None = None
    ) -> None:
        self.work, self.name, self.sent, self.labels = work, name, sent, labels or {}
        self.start_ns = trace.now_ns()
        self.start_event = trace.cuda_mark()
        self.done_ns: int | None = None
        if work is not None:  # gloo completes the future on its own thread when the data lands
            with contextlib.suppress(AttributeError, RuntimeError):
                work.get_future().then(self._mark_done)

    def _mark_done(self, _fut) -> None:
        self.done_ns = trace.now_ns()

    def wait(self) -> None:
        """Block until done; idempotent. The Work is dropped, so nothing is left for teardown."""
        if self.work is None:
            return
        with trace.span(f"wait:{self.name}", kind="idle"):
            self.work.wait()
        self.work = None
        if self.start_event is not None:
            trace.record_cuda(
                self.name, "comm", self.start_event, trace.cuda_mark(), int(self.sent)
            )
            return
        end = self.done_ns if self.done_ns is not None else trace.now_ns()
        trace.record(
            self.name, "comm", self.start_ns, end, int(self.sent), async_op=True, **self.labels
        )


class _Done(PendingCollective):
    """A collective that already finished (the counted path runs synchronously)."""

    def __init__(self) -> None:
        self.work = None


class Communicator:
    """Collectives over one group, with the :class:`CommStats` of what moved.

    ``group`` is a torch process group (``None``: every rank); ``dim`` names it on spans (the
    mesh dimension, e.g. ``"tp"``). The counted path addresses the same ranks as a plain list,
    so it needs no extra ``new_group``. Build one from a mesh with :meth:`along`.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        collectives: str = "torch",
        dim: str = "world",
    ) -> None:
        if collectives not in VIA:
            raise ValueError(
                f"collectives={collectives!r} is not a choice: use 'torch' (gloo/NCCL's own, "
                "bytes by the ring convention) or 'dtlab' (our p2p rings, every byte counted)"
            )
        self.group, self.via, self.dim = group, collectives, dim
        self.world_size = dist.get_world_size(group)
        self.ranks = (
            dist.get_process_group_ranks(group)
            if group is not None
            else list(range(self.world_size))
        )
        self.rank = self.ranks.index(dist.get_rank())
        self.stats = CommStats(counted=collectives == "dtlab")

    @classmethod
    def along(cls, mesh, dim: str, collectives: str = "torch") -> Communicator:
        """The communicator of ``mesh``'s ``dim`` group (``"tp"``, ``"dp"``, ``"ep"``, ...)."""
        return cls(getattr(mesh, f"{dim}_group"), collectives, dim)

    @property
    def _peers(self):
        """The group for dtlab's collectives: ``None`` for the world, else the rank list."""
        return None if self.group is None else self.ranks

    def _labels(self) -> dict:
        return {"group": self.dim, **trace.current_labels()}

    @property
    def counted(self) -> bool:
        """Whether ``stats`` holds bytes counted from real messages (else the ring convention)."""
        return self.via == "dtlab"

    def _run(self, op: str, name: str, payload: int, async_op: bool, torch_call, dtlab_call):
        if self.via == "dtlab":
            with C.counting() as moved, trace.labels(**self._labels()):
                dtlab_call()
            self.stats.add_call(op, moved.bytes_sent, moved.bytes_received, counted=True)
            self.stats.messages_sent += moved.messages_sent
            self.stats.messages_received += moved.messages_received
            return _Done() if async_op else None
        sent = ring_bytes_sent(op, payload, self.world_size)
        self.stats.add_call(op, sent, sent, counted=False)
        if async_op:
            return PendingCollective(torch_call(True), name, sent, self._labels())
        with trace.cuda_span(name, kind="comm", nbytes=int(sent), **self._labels()):
            torch_call(False)
        return None

    def all_reduce(
        self,
        tensor: torch.Tensor,
        name: str = "all_reduce",
        async_op: bool = False,
        op: str = "sum",
    ) -> PendingCollective | None:
        """Combine ``tensor`` in place over the group (``op``: sum or max): 2(N-1)/N * bytes
        per rank."""
        if op not in _TORCH_OPS:
            raise ValueError(
                f"all_reduce op {op!r} is not supported; choose one of {list(_TORCH_OPS)}"
            )
        return self._run(
            "all_reduce", name, nbytes(tensor), async_op,
            lambda a: dist.all_reduce(tensor, op=_TORCH_OPS[op], group=self.group, async_op=a),
            lambda: C.all_reduce(tensor, op, algorithm="ring", group=self._peers),
        )  # fmt: skip

    def reduce_scatter(
        self,
        shard: torch.Tensor,
        full: torch.Tensor,
        name: str = "reduce_scatter",
        async_op: bool = False,
    ) -> PendingCollective | None:
        """Sum ``full`` over ranks; rank r keeps chunk r in ``shard``. (N-1)/N * bytes(full)."""
        return self._run(
            "reduce_scatter", name, nbytes(full), async_op,
            lambda a: _reduce_scatter_tensor(shard, full, group=self.group, async_op=a),
            lambda: shard.copy_(C.reduce_scatter(full, "sum", group=self._peers)),
        )  # fmt: skip

    def all_gather(
        self,
        full: torch.Tensor,
        shard: torch.Tensor,
        name: str = "all_gather",
        async_op: bool = False,
    ) -> PendingCollective | None:
        """Concatenate every rank's ``shard`` into ``full``. (N-1)/N * bytes(full) per rank."""
        return self._run(
            "all_gather", name, nbytes(full), async_op,
            lambda a: _all_gather_tensor(full, shard, group=self.group, async_op=a),
            lambda: C.all_gather(shard, group=self._peers, out=full),
        )  # fmt: skip

    def broadcast(self, tensor: torch.Tensor, name: str = "broadcast") -> None:
        """Copy group rank 0's ``tensor`` to every rank, in place."""
        src = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        self._run(
            "broadcast", name, nbytes(tensor), False,
            lambda a: dist.broadcast(tensor, src=src, group=self.group, async_op=a),
            lambda: C.broadcast(tensor, 0, algorithm="chain", group=self._peers),
        )  # fmt: skip

    def all_to_all(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_splits: list[int] | None = None,
        input_splits: list[int] | None = None,
        name: str = "all_to_all",
    ) -> None:
        """Rank i's rows ``input_splits[j]`` go to rank j, landing in ``output`` in rank order.

        Bytes sent by this rank: every row it does not keep, ``bytes(tensor) − bytes(own rows)``;
        the convention path records exactly that, the counted path counts the messages.
        """
        row = tensor[0].numel() * tensor.element_size() if tensor.dim() and len(tensor) else 0
        mine = (input_splits[self.rank] if input_splits else len(tensor) // self.world_size) * row
        sent = nbytes(tensor) - mine
        if self.via == "dtlab":
            with C.counting() as moved, trace.labels(**self._labels()):
                C.all_to_all(tensor, input_splits, output_splits, group=self._peers, out=output)
            self.stats.add_call("all_to_all", moved.bytes_sent, moved.bytes_received, counted=True)
            return
        self.stats.add_call("all_to_all", sent, nbytes(output) - mine, counted=False)
        with trace.cuda_span(name, kind="comm", nbytes=int(sent), **self._labels()):
            dist.all_to_all_single(output, tensor, output_splits, input_splits, group=self.group)

    def send(self, tensor: torch.Tensor, to: int, name: str = "send") -> None:
        """Send ``tensor`` to group rank ``to`` (blocking until the receiver has it)."""
        self._point_to_point("send", tensor, to, name)

    def recv(self, tensor: torch.Tensor, source: int, name: str = "recv") -> None:
        """Receive into ``tensor`` from group rank ``source``."""
        self._point_to_point("recv", tensor, source, name)

    def _point_to_point(self, op: str, tensor: torch.Tensor, peer: int, name: str) -> None:
        size = nbytes(tensor)
        sent, received = (size, 0) if op == "send" else (0, size)
        if self.via == "dtlab":
            peers = C.peers_of(self._peers)
            with C.counting() as moved, trace.labels(**self._labels()):
                getattr(peers, op)(peer, tensor, name=name)
            self.stats.add_call(op, moved.bytes_sent, moved.bytes_received, counted=True)
            self.stats.messages_sent += moved.messages_sent
            self.stats.messages_received += moved.messages_received
            return
        self.stats.add_call(op, sent, received, counted=False)
        call = dist.send if op == "send" else dist.recv
        with trace.cuda_span(
            name, kind="comm", nbytes=size, peer=self.ranks[peer], **self._labels()
        ):
            call(tensor, self.ranks[peer], group=self.group)
