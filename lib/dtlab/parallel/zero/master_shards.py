"""The optimizer half of ZeRO-1/2: step fp32 master *shards* with any torch optimizer class.

Subclasses decide how gradient shards arrive (``_reduce_gradients``) and how updated shards become
parameters again (``_publish_parameters``); this class owns the rest of a step:

1. every segment's gradient shard (compute dtype) becomes the master's fp32 ``.grad``;
2. the wrapped optimizer — ``optimizer_cls(param_groups, **kwargs)``, built over master shards
   only — steps, so its state (Adam's m and v) exists for 1/N of the elements on each rank;
3. the subclass publishes the new values (ZeRO-1/2: all-gather the full parameters).

It *is* a ``torch.optim.Optimizer``: ``param_groups`` and ``state`` are the wrapped optimizer's
own objects, so an ``LRScheduler`` that edits ``lr`` reaches the inner step, and
``state_dict``/``load_state_dict`` save and restore this rank's shard of the state (as torch's
``ZeroRedundancyOptimizer`` does per rank before consolidation).

With ``offload=True`` (ZeRO-Offload, Ren et al., USENIX ATC 2021) the fp32 masters and the
optimizer state live in host memory: each step copies the gradient shard device → host and the
updated shard host → device, traced as ``memcpy`` spans. On a GPU the host buffers are pinned
and the copies are issued with ``non_blocking=True`` (the step synchronises once before the CPU
optimizer reads them); on a CPU-only machine device and host are the same memory, so offloading
adds copies and moves nothing — :meth:`held_bytes` reports each storage under the device that
really holds it, which shows exactly that.
"""

from __future__ import annotations

import torch
from torch import nn

from dtlab import trace
from dtlab.comm import Communicator, nbytes
from dtlab.parallel.zero.flat_segment import FlatSegment
from dtlab.parallel.zero.grad_clip import clip_sharded_grad_norm_
from dtlab.parallel.zero.optimizer_offload import host_buffer
from dtlab.precision.mixed_precision import MixedPrecision


class MasterShardOptimizer(torch.optim.Optimizer):
    """Base class: fp32 master shards + inner optimizer; subclasses move gradients/parameters."""

    def __init__(
        self,
        segments_by_group: list[tuple[dict, list[FlatSegment]]],
        initial_shards: list[torch.Tensor],
        optimizer_cls: type[torch.optim.Optimizer],
        optimizer_kwargs: dict,
        comm: Communicator,
        mixed_precision: MixedPrecision | None,
        offload: bool,
    ) -> None:
        self.comm, self.mixed_precision, self.offload = comm, mixed_precision, offload
        self.segments = [seg for _, segs in segments_by_group for seg in segs]
        master_dtype = mixed_precision.master_dtype if mixed_precision else None
        self.masters: list[nn.Parameter] = []
        self.masters_share_storage = not offload and mixed_precision is None
        for shard in initial_shards:
            if offload:
                master = host_buffer(shard.shape, master_dtype or shard.dtype)
                master.copy_(shard.detach())  # from the original weights, at full precision
            elif master_dtype is not None:
                master = shard.detach().to(master_dtype).clone()
            else:
                master = shard.detach()  # same storage: the optimizer updates it in place
            self.masters.append(nn.Parameter(master))
        # This rank's averaged gradient chunk per segment. An entry may be replaced by an fp32
        # tensor of the same shape before step() (the loss scaler unscales into fp32 copies).
        self.grad_shards: list[torch.Tensor | None] = [None] * len(self.segments)
        self._host_grads: dict[int, torch.Tensor] = {}
        inner_groups, i = [], 0
        for options, segs in segments_by_group:
            group = {k: v for k, v in options.items() if k != "params"}
            inner_groups.append({**group, "params": self.masters[i : i + len(segs)]})
            i += len(segs)
        self.optimizer = optimizer_cls(inner_groups, **optimizer_kwargs)
        super().__init__(self.masters, dict(self.optimizer.defaults))
        self._share_inner_state()

    def _share_inner_state(self) -> None:
        self.param_groups = self.optimizer.param_groups
        self.state = self.optimizer.state

    def state_dict(self) -> dict:
        """This rank's shard of the optimizer state. When the fp32 masters are separate tensors
        (mixed precision, offload) they are saved too: the bf16 model cannot give them back."""
        state = self.optimizer.state_dict()
        if not self.masters_share_storage:
            state["master_shards"] = [m.detach().cpu().clone() for m in self.masters]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        masters = state_dict.pop("master_shards", None)
        self.optimizer.load_state_dict(state_dict)
        self._share_inner_state()
        if masters is not None:
            with torch.no_grad():
                for master, saved in zip(self.masters, masters, strict=True):
                    master.copy_(saved)
            self._publish_parameters()

    def finish_gradient_synchronization(self) -> None:
        """Make sure every gradient shard holds this rank's chunk of the averaged gradient."""
        self._reduce_gradients()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the true global norm over all ranks' shards (see :mod:`~dtlab.parallel.zero.grad_clip`)."""
        self.finish_gradient_synchronization()
        return clip_sharded_grad_norm_(self.grad_shards, max_norm, self.comm)

    @torch.no_grad()
    def step(self, closure=None) -> None:
        if closure is not None:
            raise ValueError(
                "sharded optimizers do not support closures (LBFGS-style re-evaluation)"
            )
        self.finish_gradient_synchronization()
        copies = []
        for i, (master, grad) in enumerate(zip(self.masters, self.grad_shards, strict=True)):
            if grad is None:
                grad = torch.zeros(master.shape, dtype=master.dtype, device=master.device)
            if self.offload:
                if i not in self._host_grads:  # one pinned buffer per shard, reused every step
                    self._host_grads[i] = host_buffer(master.shape, master.dtype)
                master.grad = self._host_grads[i]
                with trace.span("offload:grad_to_host", kind="memcpy", nbytes=nbytes(grad)):
                    master.grad.copy_(grad, non_blocking=master.grad.is_pinned())
                copies.append(master.grad)
            else:  # the fp32 gradient shard: a transient upcast
                master.grad = grad.to(dtype=master.dtype)
        if any(c.is_pinned() for c in copies):
            torch.cuda.synchronize()  # the CPU optimizer reads the host copies next
        with trace.span("optimizer_step", kind="optimizer"):
            self.optimizer.step()
        for master in self.masters:
            master.grad = None
        self.grad_shards = [None] * len(self.segments)
        self._publish_parameters()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) the gradient shards and every parameter's full gradient."""
        if set_to_none:
            self.grad_shards = [None] * len(self.segments)
        else:
            for g in self.grad_shards:
                if g is not None:
                    g.zero_()
        for seg in self.segments:
            for p in seg.params:
                if set_to_none or p.grad is None:
                    p.grad = None
                else:
                    p.grad.zero_()

    def held_bytes(self) -> dict:
        """Bytes this rank holds by category, measured from the tensors, and ``by_device``: the
        same bytes under the device that really holds each storage."""
        by_device: dict[str, int] = {}

        def count(tensors) -> int:
            total = 0
            for t in tensors:
                by_device[str(t.device)] = by_device.get(str(t.device), 0) + nbytes(t)
                total += nbytes(t)
            return total

        state = [
            t for s in self.optimizer.state.values() for t in s.values()
            if torch.is_tensor(t) and t.dim() > 0
        ]  # fmt: skip
        masters = [] if self.masters_share_storage else list(self.masters)
        optimizer_state = count(masters) + count(state)
        return {
            "params": count(self._param_tensors()),
            "grads": count(self._grad_tensors()),
            "optimizer_state": optimizer_state,
            "by_device": by_device,
        }

    def _grad_tensors(self) -> list[torch.Tensor]:
        return [g for g in self.grad_shards if g is not None]

    def _param_tensors(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def _reduce_gradients(self) -> None:
        raise NotImplementedError

    def _publish_parameters(self) -> None:
        raise NotImplementedError
