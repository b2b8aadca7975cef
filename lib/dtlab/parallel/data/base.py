"""The DDP contract: what naive, overlapped and bucketed DDP share (:class:`DataParallelBase`).

Data parallelism (Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", VLDB 2020) keeps a full replica of the model on every rank, feeds each rank a different
slice of the global batch, and averages the gradients before the optimizer step, so every replica
takes the same step and the replicas never drift apart.

Collectives go through the dp group's :class:`~dtlab.comm.Communicator` (``dim="dp"``): torch's
own (``collectives="torch"``, bytes by the ring convention) or dtlab's counted rings
(``collectives="dtlab"``, every byte counted from real messages) — see :mod:`dtlab.comm`. The communicator, the start-up broadcast and the
end-of-backward queue live in :mod:`dtlab.parallel.gradient_sync`, shared with ZeRO/FSDP.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from dtlab.collectives.stats import CommStats
from dtlab.comm import Communicator
from dtlab.parallel.gradient_sync import (
    broadcast_module_state,
    queue_end_of_backward,
    trainable_parameters,
)
from dtlab.runtime import context

__all__ = ["DataParallelBase"]


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
        self.comm = Communicator(process_group, collectives, dim="dp")
        self.require_gradient_sync = True
        self.params = trainable_parameters(module)
        self._synchronized = True
        self._finish_queued = False
        broadcast_module_state(module, self.comm)
        self.comm_stats.reset()  # the stats describe training steps, not the start-up copy

    @property
    def comm_stats(self) -> CommStats:
        """What this wrapper's collectives moved (``.counted`` says measured or convention)."""
        return self.comm.comm_stats

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

    def _remember_local_usage(self) -> None:
        """Which parameters got a gradient on this rank, kept as a Python list: the tensor the
        ranks compare is built only when ``find_unused_parameters`` needs it (on a GPU, building
        it from host data every step would stall the host until the backward finishes)."""
        if self.find_unused_parameters:
            self._local_usage = [p.grad is not None for p in self.params]

    def _zero_fill_missing(self) -> None:
        """Remember who had a gradient (when ``find_unused_parameters`` will ask), then give every
        parameter one (zeros if unused here)."""
        self._remember_local_usage()
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)

    def _usage_flags(self) -> torch.Tensor:
        """:meth:`_remember_local_usage`'s list as int32 flags on the ranks' device."""
        device = self.params[0].device if self.params else context.device()  # NCCL: not CPU
        return torch.tensor(self._local_usage, dtype=torch.int32, device=device)

    def _drop_globally_unused(self) -> None:
        usage = self._usage_flags()
        # A control message, not gradient traffic: not added to comm_stats, drawn as control.
        self.comm.all_reduce_control(usage, name="unused_parameters")
        for p, used in zip(self.params, usage.tolist(), strict=True):
            if used == 0:
                p.grad = None
