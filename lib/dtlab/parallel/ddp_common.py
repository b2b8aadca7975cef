"""What every data-parallel wrapper shares: the DDP contract and its communicator.

Data parallelism (Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", VLDB 2020) keeps a full replica of the model on every rank, feeds each rank a different
slice of the global batch, and averages the gradients before the optimizer step, so every replica
takes the same step and the replicas never drift apart.

Collectives go through a :class:`DataParallelComm` (a :class:`~dtlab.comm.Communicator` on the dp group): torch's own
(``collectives="torch"``, bytes by the ring convention) or dtlab's counted rings
(``collectives="dtlab"``, every byte counted from real messages) — see :mod:`dtlab.comm`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from dtlab.collectives.stats import CommStats
from dtlab.comm import Communicator, PendingCollective, nbytes, ring_bytes_sent

__all__ = [
    "CommStats",
    "DataParallelBase",
    "DataParallelComm",
    "PendingCollective",
    "all_gather",
    "broadcast_module_state",
    "nbytes",
    "queue_end_of_backward",
    "reduce_scatter",
    "ring_bytes_sent",
    "trainable_parameters",
]


class DataParallelComm(Communicator):
    """The data-parallel group's :class:`~dtlab.comm.Communicator` (spans labelled ``dp``)."""

    def __init__(self, group: dist.ProcessGroup | None = None, collectives: str = "torch") -> None:
        super().__init__(group, collectives, dim="dp")


def reduce_scatter(shard: torch.Tensor, full: torch.Tensor, group=None) -> None:
    """Exercise helper: rank r receives the sum of chunk r of every rank's ``full`` in ``shard``.

    Runs on dtlab's counted ring, so a grader can hold the bytes to (N-1)/N · bytes(full).
    """
    DataParallelComm(group, "dtlab").reduce_scatter(shard, full)


def all_gather(full: torch.Tensor, shard: torch.Tensor, group=None) -> None:
    """Exercise helper: every rank's ``shard`` concatenated into ``full`` (counted ring)."""
    DataParallelComm(group, "dtlab").all_gather(full, shard)


def broadcast_module_state(module: nn.Module, comm: DataParallelComm) -> None:
    """Copy group rank 0's parameters and buffers (frozen ones too) to every rank.

    Replicas must *start* equal: identical averaged gradients only keep them equal.
    """
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            comm.broadcast(t.data, name="broadcast_state")


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
        collectives: str = "torch",
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
        self.comm = DataParallelComm(process_group, collectives)
        self.require_gradient_sync = True
        self.params = trainable_parameters(module)
        self._synchronized = True
        self._finish_queued = False
        broadcast_module_state(module, self.comm)
        self.comm_stats.reset()  # the stats describe training steps, not the start-up copy

    @property
    def comm_stats(self) -> CommStats:
        """What this wrapper's collectives moved (``.counted`` says measured or convention)."""
        return self.comm.stats

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
        device = self.params[0].device if self.params else torch.device("cpu")
        return torch.tensor(
            [p.grad is not None for p in self.params], dtype=torch.int32, device=device
        )

    def _zero_fill_missing(self) -> None:
        """Remember who had a gradient, then give every parameter one (zeros if unused here)."""
        self._local_usage = self._used_here()
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)

    def _drop_globally_unused(self) -> None:
        usage = self._local_usage.clone()
        # A control message, not gradient traffic: torch's all-reduce, not added to comm_stats.
        dist.all_reduce(usage, group=self.process_group)
        for p, used in zip(self.params, usage.tolist(), strict=True):
            if used == 0:
                p.grad = None
