"""What every data-parallel wrapper shares: counted collectives and the DDP contract.

Data parallelism (Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", VLDB 2020) keeps a full replica of the model on every rank, feeds each rank a different
slice of the global batch, and averages the gradients before the optimizer step, so every replica
takes the same step and the replicas never drift apart.

Bytes on the wire are counted per rank with the nccl-tests ring convention ("bytes each rank
sends" for a payload of ``M`` bytes on ``N`` ranks):

=================  ===================  ==========================================
collective         bytes sent per rank   why
=================  ===================  ==========================================
all-reduce          2(N-1)/N * M         reduce-scatter phase + all-gather phase
reduce-scatter      (N-1)/N * M          ``M`` is the full (input) tensor
all-gather          (N-1)/N * M          ``M`` is the full (output) tensor
broadcast           M                    pipelined ring: every rank but the last forwards M
=================  ===================  ==========================================

Every collective issued here is wrapped in a ``comm`` trace span carrying those bytes, and added
to a :class:`CommStats` that accounting tests compare with the formulas.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from dtlab import trace

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


@dataclass
class CommStats:
    """Bytes this rank sent, per collective kind. Reset it to measure one step."""

    calls: int = 0
    bytes_sent: float = 0.0
    bytes_by_op: dict[str, float] = field(default_factory=dict)

    def add(self, op: str, payload_bytes: int, world_size: int) -> float:
        sent = ring_bytes_sent(op, payload_bytes, world_size)
        self.calls += 1
        self.bytes_sent += sent
        self.bytes_by_op[op] = self.bytes_by_op.get(op, 0.0) + sent
        return sent

    def reset(self) -> None:
        self.calls, self.bytes_sent, self.bytes_by_op = 0, 0.0, {}


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class PendingCollective:
    """An async collective in flight; :meth:`wait` blocks and records its trace span.

    The ``comm`` span runs from launch to completion (when the backend reports it), so it shows
    how much of the communication ran under compute; the time spent blocked in :meth:`wait` is
    recorded separately as an ``idle`` span named ``wait:<name>`` — that is the *exposed* part.
    """

    def __init__(self, work: dist.Work, name: str, sent: float) -> None:
        self.work, self.name, self.sent = work, name, sent
        self.start_ns = trace.now_ns()
        self.done_ns: int | None = None
        # Backends without futures: the span simply ends when we wait.
        with contextlib.suppress(AttributeError, RuntimeError):
            work.get_future().then(self._mark_done)

    def _mark_done(self, _fut) -> None:
        self.done_ns = trace.now_ns()

    def wait(self) -> None:
        with trace.span(f"wait:{self.name}", kind="idle"):
            self.work.wait()
        end = self.done_ns if self.done_ns is not None else trace.now_ns()
        trace.record(self.name, "comm", self.start_ns, end, int(self.sent), async_op=True)


def _issue(op, name, payload, stats, group, async_op, call):
    world = dist.get_world_size(group)
    sent = (
        stats.add(op, payload, world) if stats is not None else ring_bytes_sent(op, payload, world)
    )
    if async_op:
        return PendingCollective(call(True), name, sent)
    with trace.span(name, kind="comm", nbytes=int(sent)):
        call(False)
    return None


def all_reduce(
    tensor: torch.Tensor,
    stats: CommStats | None = None,
    group: dist.ProcessGroup | None = None,
    name: str = "all_reduce",
    async_op: bool = False,
) -> PendingCollective | None:
    """Sum ``tensor`` in place over ``group``; counted as 2(N-1)/N * bytes(tensor)."""
    return _issue(
        "all_reduce", name, nbytes(tensor), stats, group, async_op,
        lambda a: dist.all_reduce(tensor, group=group, async_op=a),
    )  # fmt: skip


def reduce_scatter(
    shard: torch.Tensor,
    full: torch.Tensor,
    stats: CommStats | None = None,
    group: dist.ProcessGroup | None = None,
    name: str = "reduce_scatter",
    async_op: bool = False,
) -> PendingCollective | None:
    """Sum ``full`` over ranks; rank r keeps chunk r in ``shard``. (N-1)/N * bytes(full)."""
    return _issue(
        "reduce_scatter", name, nbytes(full), stats, group, async_op,
        lambda a: _reduce_scatter_tensor(shard, full, group=group, async_op=a),
    )  # fmt: skip


def all_gather(
    full: torch.Tensor,
    shard: torch.Tensor,
    stats: CommStats | None = None,
    group: dist.ProcessGroup | None = None,
    name: str = "all_gather",
    async_op: bool = False,
) -> PendingCollective | None:
    """Concatenate every rank's ``shard`` into ``full`` on all ranks. (N-1)/N * bytes(full)."""
    return _issue(
        "all_gather", name, nbytes(full), stats, group, async_op,
        lambda a: _all_gather_tensor(full, shard, group=group, async_op=a),
    )  # fmt: skip


def broadcast_module_state(
    module: nn.Module, group: dist.ProcessGroup | None = None, stats: CommStats | None = None
) -> None:
    """Copy rank 0's parameters and buffers (frozen ones too) to every rank of ``group``.

    Replicas must *start* equal: identical averaged gradients only keep them equal.
    """
    src = dist.get_global_rank(group, 0) if group is not None else 0
    world = dist.get_world_size(group)
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            payload = nbytes(t)
            sent = stats.add("broadcast", payload, world) if stats else payload
            with trace.span("broadcast_state", kind="comm", nbytes=int(sent)):
                dist.broadcast(t.data, src=src, group=group)


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Parameters that get gradients, each once (a tied weight appears once), in registration order."""
    return [p for p in module.parameters() if p.requires_grad]


def queue_end_of_backward(callback) -> None:
    """Run ``callback`` once the current backward pass has finished (all gradients accumulated)."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


class DataParallelBase(nn.Module):
    """The contract shared by naive, overlapped and bucketed DDP.

    * construction broadcasts rank 0's parameters and buffers;
    * ``forward`` runs the wrapped model (``.module``) on this rank's slice of the batch;
    * after ``backward`` every trainable gradient holds the *average* over ranks; a subclass
      decides when the reduction is issued, and :meth:`finish_gradient_synchronization` is
      queued to run when backward ends (callers may also call it themselves; it is idempotent);
    * inside :meth:`no_sync` gradients only accumulate locally (gradient accumulation);
    * ``find_unused_parameters=False`` (the default, as in torch): a parameter that got no
      gradient on a rank contributes zeros, so every rank ends with a (possibly zero) gradient.
      ``True`` also all-reduces a one-int-per-parameter usage map (traced as ``usage_map``; a
      control message, not counted in ``comm_stats``) and leaves a parameter *no* rank used with ``grad=None``, exactly like
      single-process training, so optimizers with momentum or weight decay skip it.
    """

    def __init__(
        self,
        module: nn.Module,
        process_group: dist.ProcessGroup | None = None,
        find_unused_parameters: bool = False,
    ) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError(
                "data parallel needs a process group: run this inside cluster.run(...) or torchrun"
            )
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.find_unused_parameters = find_unused_parameters
        self.comm_stats = CommStats()
        self.require_gradient_sync = True
        self.params = trainable_parameters(module)
        self._synchronized = True
        self._finish_queued = False
        broadcast_module_state(module, process_group, self.comm_stats)

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled() and self.require_gradient_sync:
            self._synchronized = False
            self._finish_queued = False
            self._prepare_for_backward()
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the next synced backward averages the total."""
        previous, self.require_gradient_sync = self.require_gradient_sync, False
        try:
            yield
        finally:
            self.require_gradient_sync = previous

    def _queue_finish(self) -> None:
        if not self._finish_queued:
            self._finish_queued = True
            queue_end_of_backward(self.finish_gradient_synchronization)

    def finish_gradient_synchronization(self) -> None:
        """Make every gradient the average over ranks (blocks until communication is done)."""
        if self._synchronized:
            return
        self._synchronized = True
        self._complete_reduction()
        if self.find_unused_parameters:
            self._drop_globally_unused()

    def _prepare_for_backward(self) -> None:
        """Subclass hook: reset per-step state before a backward that will be synced."""

    def _complete_reduction(self) -> None:
        raise NotImplementedError

    def _used_here(self) -> torch.Tensor:
        return torch.tensor([p.grad is not None for p in self.params], dtype=torch.int32)

    def _zero_fill_missing(self) -> None:
        """Remember who had a gradient, then give every parameter one (zeros if unused here)."""
        self._local_usage = self._used_here()
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)

    def _drop_globally_unused(self) -> None:
        usage = self._local_usage.clone()
        all_reduce(usage, None, self.process_group, name="usage_map")
        for p, used in zip(self.params, usage.tolist(), strict=True):
            if used == 0:
                p.grad = None
