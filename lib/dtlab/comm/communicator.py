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
    counted from the messages actually posted (``comm_stats.counted`` is ``True``). A blocking
    call runs the ring on the calling thread. ``async_op=True`` queues it on the ranks'
    *background stream* (:mod:`dtlab.comm.background`: one worker thread running the queue in
    order, its messages tagged so they never match the caller's) and returns a
    :class:`~dtlab.comm.background.QueuedCollective`: the ring runs while the caller computes,
    bit-identical to the blocking call, its bytes counted when it is waited for. On NCCL the
    counted path has no background stream: the call runs inside its launch, warns once per
    communicator (:class:`~dtlab.comm.pending.OverlapRefused`) and returns a
    :class:`~dtlab.comm.pending.Finished` handle. Accounting tests and the labs' "measured vs
    formula" cells use this path, so the equality they show can fail.

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

Point to point: :meth:`Communicator.send`/:meth:`~Communicator.recv` block;
:meth:`~Communicator.start_exchange` (and :meth:`~Communicator.isend`/:meth:`~Communicator.irecv`)
posts messages and returns a :class:`~dtlab.comm.pending.PendingMessages` to ``wait()`` on, so
a ring or a pipeline can compute while its next block travels (the methods are those of the base
class :class:`~dtlab.comm.point_to_point.PointToPoint`; :mod:`dtlab.comm.messages` holds how).
Posted messages go through :mod:`dtlab.collectives.p2p` on either path, so their bytes are
counted from the messages.

Control messages: a scalar *report* — a loss averaged for printing, a gradient norm, a flag of
which parameters were used — is not training traffic. :meth:`~Communicator.all_reduce_control`
and :meth:`~Communicator.all_gather_control` run it with the group's own torch collective
whichever ``collectives=`` was chosen, leave ``comm_stats`` untouched (so byte counts stay the
payload's) and draw it as a span of kind ``other`` named ``"<name> (control)"``, labelled
``control=True`` and with the group — the convention of :mod:`dtlab.collectives.agreement`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from dtlab import collectives as C
from dtlab import trace
from dtlab.collectives.stats import CommStats
from dtlab.comm import background
from dtlab.comm.groups import group_containing
from dtlab.comm.pending import Finished, PendingCollective, refuse_overlap
from dtlab.comm.point_to_point import PointToPoint
from dtlab.comm.volumes import nbytes, ring_bytes_sent

VIA = ("torch", "dtlab")
_TORCH_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}

# torch 2.13 renamed the "tensor" collectives to "*_single"; 2.11 only has the old names.
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class Communicator(PointToPoint):
    """Collectives over one group, with the :class:`CommStats` of what moved.

    ``group`` is a torch process group (``None``: every rank); ``dim`` names it on spans (the
    mesh dimension, e.g. ``"tp"``). The counted path addresses the same ranks as a plain list,
    so it needs no extra ``new_group``. Build one from a mesh with :meth:`along`, or over rank
    lists that are not a mesh dimension with :meth:`among`.
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
        self.comm_stats = CommStats(counted=collectives == "dtlab")
        self._refused_overlap = False

    @classmethod
    def along(cls, mesh, dim: str, collectives: str = "torch") -> Communicator:
        """The communicator of ``mesh``'s ``dim`` group (``"tp"``, ``"dp"``, ``"ep"``, ...)."""
        return cls(getattr(mesh, f"{dim}_group"), collectives, dim)

    @classmethod
    def among(
        cls, rank_lists: Sequence[Sequence[int]], collectives: str = "torch", dim: str = "world"
    ) -> Communicator | None:
        """The communicator of the group in ``rank_lists`` (disjoint lists of global ranks) that
        holds this rank, ``None`` if none does. Collective over the world: every rank must call
        it with the same lists (:func:`~dtlab.comm.groups.group_containing`)."""
        group = group_containing(rank_lists)
        return None if group is None else cls(group, collectives, dim)

    @property
    def peer_list(self):
        """The group for dtlab's collectives: ``None`` for the world, else the rank list."""
        return None if self.group is None else self.ranks

    def span_labels(self) -> dict:
        """The labels every span of this communicator carries: its group, then the trace's."""
        return {"group": self.dim, **trace.current_labels()}

    @property
    def counted(self) -> bool:
        """Whether ``comm_stats`` holds bytes counted from real messages (else the ring convention)."""
        return self.via == "dtlab"

    @property
    def overlaps(self) -> bool:
        """Whether ``async_op=True`` really runs the collective behind compute: torch's path
        always; dtlab's counted rings on gloo, on the background stream
        (:mod:`dtlab.comm.background`), not on NCCL (they run inside the call there)."""
        return self.via == "torch" or background.available()

    def _run(self, op: str, name: str, payload: int, async_op: bool, torch_call, dtlab_call):
        if self.via == "dtlab":
            if async_op and background.available():
                return background.launch(
                    self.ranks, op, name, dtlab_call, self.span_labels(), self.comm_stats
                )
            if async_op and not self._refused_overlap:
                self._refused_overlap = True
                refuse_overlap(name, self.dim)
            with C.counting() as moved, trace.labels(**self.span_labels()):
                dtlab_call()
            self.comm_stats.add_call(op, moved.bytes_sent, moved.bytes_received, counted=True)
            self.comm_stats.messages_sent += moved.messages_sent
            self.comm_stats.messages_received += moved.messages_received
            return Finished() if async_op else None
        sent = ring_bytes_sent(op, payload, self.world_size)
        self.comm_stats.add_call(op, sent, sent, counted=False)
        if async_op:
            launched = trace.now_ns()  # the comm span starts when it was asked for
            return PendingCollective(torch_call(True), name, sent, self.span_labels(), launched)
        with trace.cuda_span(name, kind="comm", nbytes=int(sent), **self.span_labels()):
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
            lambda: C.all_reduce(tensor, op, algorithm="ring", group=self.peer_list),
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
            lambda: shard.copy_(C.reduce_scatter(full, "sum", group=self.peer_list)),
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
            lambda: C.all_gather(shard, group=self.peer_list, out=full),
        )  # fmt: skip

    def broadcast(self, tensor: torch.Tensor, name: str = "broadcast") -> None:
        """Copy group rank 0's ``tensor`` to every rank, in place."""
        src = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        self._run(
            "broadcast", name, nbytes(tensor), False,
            lambda a: dist.broadcast(tensor, src=src, group=self.group, async_op=a),
            lambda: C.broadcast(tensor, 0, algorithm="chain", group=self.peer_list),
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
            with C.counting() as moved, trace.labels(**self.span_labels()):
                C.all_to_all(tensor, input_splits, output_splits, group=self.peer_list, out=output)
            self.comm_stats.add_call(
                "all_to_all", moved.bytes_sent, moved.bytes_received, counted=True
            )
            return
        self.comm_stats.add_call("all_to_all", sent, nbytes(output) - mine, counted=False)
        with trace.cuda_span(name, kind="comm", nbytes=int(sent), **self.span_labels()):
            dist.all_to_all_single(output, tensor, output_splits, input_splits, group=self.group)

    # -- control messages ---------------------------------------------------------------------
    def all_reduce_control(self, tensor: torch.Tensor, name: str, op: str = "sum") -> None:
        """Combine a small report (a loss, a norm, a flag per parameter) in place over the group
        as a *control message*: not added to ``comm_stats``, drawn as ``"<name> (control)"``."""
        if op not in _TORCH_OPS:
            raise ValueError(
                f"all_reduce op {op!r} is not supported; choose one of {list(_TORCH_OPS)}"
            )
        C.peers_of(self.group).all_reduce_control(
            tensor, op=_TORCH_OPS[op], name=f"{name} (control)", group=self.dim
        )

    def all_gather_control(self, out: torch.Tensor, mine: torch.Tensor, name: str) -> None:
        """Every rank's ``mine`` into ``out`` (rank order) as a *control message* (a check
        before a payload moves): not added to ``comm_stats``, drawn as ``"<name> (control)"``."""
        C.peers_of(self.group).all_gather_control(
            out, mine, name=f"{name} (control)", group=self.dim
        )
