"""The optimizer half of ZeRO: step fp32 master *shards* with any torch optimizer class.

Shared by ZeRO-1/2 (:mod:`dtlab.parallel.zero_optimizer`) and ZeRO-3
(:mod:`dtlab.parallel.zero3`). Subclasses decide how gradient shards arrive
(``_reduce_gradients``) and how updated shards become parameters again (``_publish_parameters``);
this class owns the rest of a step:

1. every segment's gradient shard (compute dtype) becomes the master's fp32 ``.grad``;
2. the wrapped optimizer — ``optimizer_cls(param_groups, **kwargs)``, built over master shards
   only — steps, so its state (Adam's m and v) exists for 1/N of the elements on each rank;
3. the subclass publishes the new values (ZeRO-1/2: all-gather the full parameters).

With ``offload=True`` masters and optimizer state live in host memory (see
:mod:`dtlab.parallel.offload`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dtlab import trace
from dtlab.parallel.ddp_common import CommStats
from dtlab.parallel.flat_shard import FlatSegment, state_tensor_bytes
from dtlab.parallel.grad_clip import clip_sharded_grad_norm_
from dtlab.parallel.mixed_precision import MixedPrecision
from dtlab.parallel.offload import to_host


class MasterShardOptimizer:
    """Base class: fp32 master shards + inner optimizer; subclasses move gradients/parameters."""

    def __init__(
        self,
        segments_by_group: list[tuple[dict, list[FlatSegment]]],
        initial_shards: list[torch.Tensor],
        optimizer_cls: type[torch.optim.Optimizer],
        optimizer_kwargs: dict,
        process_group: dist.ProcessGroup | None,
        mixed_precision: MixedPrecision | None,
        offload: bool,
    ) -> None:
        self.process_group = process_group
        self.mixed_precision = mixed_precision
        self.offload = offload
        self.comm_stats = CommStats()
        self.segments = [seg for _, segs in segments_by_group for seg in segs]
        master_dtype = mixed_precision.master_dtype if mixed_precision else None
        self.masters: list[nn.Parameter] = []
        self.masters_share_storage = not offload and mixed_precision is None
        for shard in initial_shards:
            if offload:
                master = to_host(shard.detach(), master_dtype or shard.dtype)
            elif master_dtype is not None:
                master = shard.detach().to(master_dtype).clone()
            else:
                master = shard.detach()  # same storage: the optimizer updates it in place
            self.masters.append(nn.Parameter(master))
        self.grad_shards: list[torch.Tensor | None] = [None] * len(self.segments)
        inner_groups, i = [], 0
        for options, segs in segments_by_group:
            group = {k: v for k, v in options.items() if k != "params"}
            inner_groups.append({**group, "params": self.masters[i : i + len(segs)]})
            i += len(segs)
        self.optimizer = optimizer_cls(inner_groups, **optimizer_kwargs)

    @property
    def param_groups(self) -> list[dict]:
        """The inner optimizer's groups (an LR scheduler may edit ``lr`` here)."""
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def finish_gradient_synchronization(self) -> None:
        """Make sure every gradient shard holds this rank's chunk of the averaged gradient."""
        self._reduce_gradients()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the true global norm over all ranks' shards (see :mod:`grad_clip`)."""
        self.finish_gradient_synchronization()
        return clip_sharded_grad_norm_(
            self.grad_shards, max_norm, self.process_group, self.comm_stats
        )

    @torch.no_grad()
    def step(self, closure=None) -> None:
        if closure is not None:
            raise ValueError(
                "sharded optimizers do not support closures (LBFGS-style re-evaluation)"
            )
        self.finish_gradient_synchronization()
        for master, grad in zip(self.masters, self.grad_shards, strict=True):
            if grad is None:
                grad = torch.zeros_like(master)
            # The fp32 gradient shard: a transient upcast (and host copy when offloading).
            master.grad = grad.to(device=master.device, dtype=master.dtype)
        with trace.span("optimizer_step", kind="optimizer"):
            self.optimizer.step()
        for master in self.masters:
            master.grad = None
        self.grad_shards = [None] * len(self.segments)
        self._publish_parameters()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.grad_shards = [None] * len(self.segments)
        for seg in self.segments:
            for p in seg.params:
                p.grad = None

    def held_bytes(self) -> dict[str, int]:
        """Bytes this rank holds by category (the ZeRO accounting), measured from the tensors."""
        masters = 0 if self.masters_share_storage else sum(_nbytes(m) for m in self.masters)
        optimizer_state = masters + state_tensor_bytes(self.optimizer)
        return {
            "params": self._param_bytes(),
            "grads": self._grad_bytes(),
            "optimizer_state": 0 if self.offload else optimizer_state,
            "offloaded_optimizer_state": optimizer_state if self.offload else 0,
        }

    def _grad_bytes(self) -> int:
        return sum(_nbytes(g) for g in self.grad_shards if g is not None)

    def _param_bytes(self) -> int:
        raise NotImplementedError

    def _reduce_gradients(self) -> None:
        raise NotImplementedError

    def _publish_parameters(self) -> None:
        raise NotImplementedError


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
