"""Overlapped DDP: launch one async all-reduce per parameter the moment its gradient is ready.

Backward produces gradients last-layer-first. A post-accumulate-grad hook on each parameter fires
once its gradient is complete (a tied weight's hook fires once, after both uses have summed
into it) and launches an asynchronous all-reduce of that gradient, so communication for layer L
runs while autograd computes layer L-1. Before the optimizer step,
:meth:`finish_gradient_synchronization` waits for every launch and divides by N.

Launch order must be the same on every rank (collectives on a group are matched by issue
order), so launches follow a fixed order — reverse registration order, which is roughly the order
gradients appear — and a gradient that is ready early waits for the ones before it. Bytes are
the same as naive DDP; what changes is *when* they move. The cost: one small collective per
parameter, each paying the latency term α — :mod:`dtlab.parallel.data.bucketed` fixes that.
"""

from __future__ import annotations

from torch import nn

from dtlab.comm import PendingCollective
from dtlab.parallel.data.base import DataParallelBase


class OverlappedDDP(DataParallelBase):
    """Per-parameter async all-reduce from gradient hooks (see module docstring)."""

    def __init__(
        self,
        module: nn.Module,
        process_group=None,
        find_unused_parameters: bool = False,
        collectives: str = "torch",
    ) -> None:
        super().__init__(module, process_group, find_unused_parameters, collectives)
        self.launch_order = list(reversed(self.params))
        self._index = {id(p): i for i, p in enumerate(self.launch_order)}
        self._prepare_for_backward()
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._on_gradient_ready)

    def _prepare_for_backward(self) -> None:
        self._ready = [False] * len(self.launch_order)
        self._next_to_launch = 0
        self._pending: list[PendingCollective] = []

    def _on_gradient_ready(self, p: nn.Parameter) -> None:
        if not self.require_gradient_sync or self._synchronized:
            return
        self._queue_finish()
        self._ready[self._index[id(p)]] = True
        self._launch_ready_prefix()

    def _launch_ready_prefix(self) -> None:
        while self._next_to_launch < len(self.launch_order) and self._ready[self._next_to_launch]:
            p = self.launch_order[self._next_to_launch]
            self._pending.append(
                self.comm.all_reduce(
                    p.grad,
                    name=f"grad[{self._next_to_launch}]",
                    async_op=True,
                )  # fmt: skip
            )
            self._next_to_launch += 1

    def _complete_reduction(self) -> None:
        # Parameters that got no gradient on this rank never fired a hook: send zeros for them.
        self._zero_fill_missing()
        self._ready = [True] * len(self.launch_order)
        self._launch_ready_prefix()
        for pending in self._pending:
            pending.wait()
        for p in self.launch_order:
            p.grad.div_(self.world_size)
        self._pending = []
