"""Bucketed DDP: pack gradients into a few flat buckets and all-reduce each bucket when it fills.

This is what ``torch.nn.parallel.DistributedDataParallel`` does (Li et al., VLDB 2020, §3.2).
Parameters are assigned to buckets in *reverse registration order* (the order backward tends to
produce their gradients) until a bucket reaches ``bucket_cap_mb``; the first bucket may be
smaller (``first_bucket_mb``) so communication starts as early as possible. One bucket holds one
dtype. When the last gradient of a bucket arrives, the bucket (a flat buffer the gradients were
copied into) is all-reduced asynchronously; buckets launch in index order on every rank.
:meth:`finish_gradient_synchronization` launches the buckets still waiting — a parameter this
backward gave no gradient contributes the one it holds (accumulated under :meth:`no_sync`, or
kept by ``zero_grad(set_to_none=False)``), or zeros if it has none — waits, and divides each
bucket by N.

**Gradients as bucket views** (``gradient_as_bucket_view=True``, torch DDP's option of the same
name; off by default, as in torch, so gradients and buckets are separate memory — what lab 03
measures): the hook copies a fresh gradient into its slot once and then makes ``p.grad`` that
slot, a view of the bucket, so the averages need no copy back and the gradients need no memory
of their own; while the view stays (``zero_grad(set_to_none=False)``: accumulation, under
:meth:`no_sync` or across steps, goes into the view) autograd accumulates straight into the
bucket and even the copy in goes — with torch's default ``set_to_none=True`` a fresh gradient is
copied in once per step. On a GPU every copy is a kernel the host must launch per parameter, and
host time per parameter is what a Python DDP pays over torch's C++ reducer. A parameter that is
not contiguous keeps its own gradient (a view would change its layout) and is copied both ways.

Bytes per rank per step are the same as naive DDP, 2(N-1)/N * Ψ * bytes_per_grad, but spread over
``len(buckets)`` collectives instead of one per parameter: fewer latency (α) terms than
:mod:`dtlab.parallel.data.overlapped`, more overlap than :mod:`dtlab.parallel.data.naive`.
The bucketing rule, :func:`~dtlab.parallel.gradient_sync.assign_buckets`, is shared with ZeRO-1/2,
which cuts its flat segments the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dtlab.comm import PendingCollective
from dtlab.parallel.data.base import DataParallelBase
from dtlab.parallel.gradient_sync import assign_buckets


@dataclass
class Bucket:
    """A flat buffer and the parameters whose gradients live in it (at ``offsets``)."""

    params: list[nn.Parameter]
    offsets: list[int]
    buffer: torch.Tensor
    as_views: bool = False  # gradient_as_bucket_view

    def __post_init__(self) -> None:
        # Each parameter's view of the buffer, made once: a gradient hook then costs at most one
        # copy, not a slice, a view and a copy (host time per parameter is DDP's cost on a GPU).
        self._slots = [
            self.buffer[offset : offset + p.numel()].view_as(p)
            for p, offset in zip(self.params, self.offsets, strict=True)
        ]
        self._adoptable = [self.as_views and p.is_contiguous() for p in self.params]

    def slot(self, i: int) -> torch.Tensor:
        return self._slots[i]

    def holds_gradient_of(self, i: int) -> bool:
        """Whether parameter ``i``'s ``.grad`` is already its slot (autograd wrote into it)."""
        if not self._adoptable[i]:
            return False
        grad = self.params[i].grad
        return grad is not None and grad.data_ptr() == self._slots[i].data_ptr()

    def take_gradient(self, i: int) -> None:
        """Copy parameter ``i``'s fresh gradient into its slot, and make the slot its ``.grad``."""
        if self.holds_gradient_of(i):
            return
        p = self.params[i]
        self._slots[i].copy_(p.grad)
        if self._adoptable[i]:
            p.grad = self._slots[i]

    def give_back_averages(self) -> None:
        """After the all-reduce: every parameter's ``.grad`` holds its average."""
        for i, p in enumerate(self.params):
            if self.holds_gradient_of(i):
                continue
            if p.grad is not None:
                p.grad.copy_(self._slots[i])
            elif self._adoptable[i]:
                p.grad = self._slots[i]
            else:
                p.grad = self._slots[i].clone()


class BucketedDDP(DataParallelBase):
    """Gradient buckets reduced as soon as they are full (see module docstring)."""

    def __init__(
        self,
        module: nn.Module,
        process_group=None,
        find_unused_parameters: bool = False,
        bucket_cap_mb: float = 25.0,
        first_bucket_mb: float | None = 1.0,
        collectives: str = "torch",
        gradient_as_bucket_view: bool = False,
    ) -> None:
        super().__init__(module, process_group, find_unused_parameters, collectives)
        self.buckets: list[Bucket] = []
        self._where: dict[int, tuple[int, int]] = {}
        for b, group in enumerate(assign_buckets(self.params, bucket_cap_mb, first_bucket_mb)):
            offsets = [sum(p.numel() for p in group[:i]) for i in range(len(group))]
            total = offsets[-1] + group[-1].numel()
            self.buckets.append(
                Bucket(
                    group,
                    offsets,
                    torch.zeros(total, dtype=group[0].dtype, device=group[0].device),
                    gradient_as_bucket_view,
                )
            )
            for i, p in enumerate(group):
                self._where[id(p)] = (b, i)
        self._prepare_for_backward()
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._on_gradient_ready)

    def _prepare_for_backward(self) -> None:
        self._missing = [len(b.params) for b in self.buckets]
        self._next_to_launch = 0
        self._pending: list[PendingCollective] = []

    def _on_gradient_ready(self, p: nn.Parameter) -> None:
        if not self.require_gradient_sync or self._synchronized:
            return
        self._queue_finish()
        b, i = self._where[id(p)]
        self.buckets[b].take_gradient(i)
        self._missing[b] -= 1
        self._launch_full_prefix()

    def _launch_full_prefix(self) -> None:
        while self._next_to_launch < len(self.buckets) and self._missing[self._next_to_launch] == 0:
            b = self._next_to_launch
            self._pending.append(
                self.comm.all_reduce(
                    self.buckets[b].buffer,
                    name=f"bucket[{b}]",
                    async_op=True,
                )  # fmt: skip
            )
            self._next_to_launch += 1

    def _complete_reduction(self) -> None:
        self._remember_local_usage()
        for b, bucket in enumerate(self.buckets):
            if b < self._next_to_launch:
                continue
            for i, p in enumerate(bucket.params):
                if p.grad is None:  # no gradient on this rank: contribute zeros
                    bucket.slot(i).zero_()
                else:  # a gradient this backward did not touch (no_sync, or kept by zero_grad)
                    bucket.take_gradient(i)
            self._missing[b] = 0
        self._launch_full_prefix()
        for pending in self._pending:
            pending.wait()
        for bucket in self.buckets:
            bucket.buffer.div_(self.world_size)
            bucket.give_back_averages()
        self._pending = []
