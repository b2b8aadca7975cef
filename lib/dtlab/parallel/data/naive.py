"""Naive DDP: wait for the whole backward, then all-reduce every gradient, one at a time.

What moves where: after ``loss.backward()`` each rank holds the gradient of *its* micro-batch
for every parameter. For each trainable parameter (registration order) the ranks all-reduce
(sum) that gradient and divide by N, so every rank ends with the global-batch average. Bytes sent
per rank per step: 2(N-1)/N * Ψ * bytes_per_grad — the same as any DDP, but none of it overlaps
the backward pass: the network idles during backward and the CPU/GPU idles during communication.
Compare with :mod:`dtlab.parallel.data.overlapped` and :mod:`dtlab.parallel.data.bucketed`.
"""

from __future__ import annotations

from torch import nn

from dtlab.parallel.data.base import DataParallelBase


class NaiveDDP(DataParallelBase):
    """All-reduce every gradient after backward (see module docstring)."""

    def __init__(
        self,
        module: nn.Module,
        process_group=None,
        find_unused_parameters: bool = False,
        collectives: str = "torch",
    ) -> None:
        super().__init__(module, process_group, find_unused_parameters, collectives)
        for p in self.params:
            # No communication here: the hook only arranges for the reduction to run at the end.
            p.register_post_accumulate_grad_hook(lambda _p: self._queue_finish_if_syncing())

    def _queue_finish_if_syncing(self) -> None:
        if self.require_gradient_sync and not self._synchronized:
            self._queue_finish()

    def _complete_reduction(self) -> None:
        self._zero_fill_missing()
        for i, p in enumerate(self.params):
            self.comm.all_reduce(p.grad, name=f"grad[{i}]")
            p.grad.div_(self.world_size)
