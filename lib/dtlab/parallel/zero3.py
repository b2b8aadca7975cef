"""ZeRO-3 / FSDP: shard the parameters too, gathering one unit at a time just before it is used.

Rajbhandari et al. (SC 2020) §5.3 and Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully
Sharded Data Parallel" (VLDB 2023). The model is cut into *units* (typically one per transformer
block, plus the *root* unit holding everything else: embeddings, final norm, head). Between uses a
rank keeps only chunk r of each unit's flat segment (:mod:`flat_shard`). What moves where:

* **forward** — before unit k runs, all-gather its parameters ((N-1)/N·Ψ_k·b bytes sent per
  rank) into a flat buffer the parameters are views of, and launch the all-gather of unit k+1
  asynchronously (*prefetch*) so it overlaps unit k's compute. After unit k, free the buffer
  (its storage is resized to 0; the Parameter objects stay, autograd keeps pointing at them).
* **backward** — when the gradient reaches unit k's outputs, all-gather it again (and prefetch
  unit k-1); when every parameter of unit k has its gradient, *reduce-scatter* the gradients
  ((N-1)/N·Ψ_k·b), keep chunk r averaged, free the full gradients and parameters.

Per step that is 3·(N-1)/N·Ψ·b = 1.5× the 2·(N-1)/N·Ψ·b of one DDP all-reduce, in exchange for
holding (2 + 2 + 12)Ψ/N bytes instead of 16Ψ. Every unit, the root included, is re-gathered for
backward, so the 1.5× holds exactly. Frozen parameters and buffers stay replicated.

    fsdp = FullyShardedDataParallel(model, units=list(model.blocks))
    opt = fsdp.build_optimizer(torch.optim.AdamW, lr=1e-3)
    loss_fn(fsdp(x)).backward(); opt.step(); opt.zero_grad()
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dtlab.parallel.ddp_common import (
    CommStats,
    PendingCollective,
    all_gather,
    broadcast_module_state,
    nbytes,
    queue_end_of_backward,
    reduce_scatter,
)
from dtlab.parallel.flat_shard import FlatSegment
from dtlab.parallel.mixed_precision import MixedPrecision
from dtlab.parallel.sharded_optimizer import MasterShardOptimizer


class _Unit:
    def __init__(self, index: int, module: nn.Module, params: list[nn.Parameter], rank, world):
        self.index, self.module = index, module
        self.seg = FlatSegment(params, rank, world)
        self.flat: torch.Tensor | None = None  # full buffer; storage size 0 while sharded
        self.shard: torch.Tensor | None = None  # this rank's chunk, compute dtype (persistent)
        self.gathered = False
        self.prefetch: PendingCollective | None = None
        self.reduced = False
        self.missing = len(params)


class FullyShardedDataParallel(nn.Module):
    """Parameter-sharded data parallel over ``units`` (see module docstring)."""

    def __init__(
        self,
        module: nn.Module,
        units: list[nn.Module] | None = None,
        process_group: dist.ProcessGroup | None = None,
        mixed_precision: MixedPrecision | None = None,
        prefetch: bool = True,
    ) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError(
                "FSDP needs a process group: run inside cluster.run(...) or torchrun"
            )
        self.module, self.process_group = module, process_group
        self.mixed_precision, self.prefetch = mixed_precision, prefetch
        self.world_size = dist.get_world_size(process_group)
        rank = dist.get_rank(process_group)
        self.comm_stats = CommStats()
        broadcast_module_state(module, process_group, None)
        if mixed_precision is not None:  # frozen weights and buffers compute in the same dtype
            module.to(mixed_precision.param_dtype)
        units = list(units) if units is not None else _default_units(module)
        owner: dict[int, int] = {}
        for k, unit in enumerate(units):
            for p in unit.parameters():
                if p.requires_grad and owner.setdefault(id(p), k) != k:
                    raise ValueError(
                        f"a parameter is shared by units {owner[id(p)]} and {k} (tied weights?); "
                        "put both users in one unit or leave the weight to the root unit"
                    )
        unit_params: list[list[nn.Parameter]] = [[] for _ in units]
        root_params = []
        for p in module.parameters():
            if p.requires_grad:
                (unit_params[owner[id(p)]] if id(p) in owner else root_params).append(p)
        self.units = [_Unit(0, module, root_params, rank, self.world_size)] + [
            _Unit(k + 1, m, ps, rank, self.world_size)
            for k, (m, ps) in enumerate(zip(units, unit_params, strict=True))
        ]
        self.units = [u for u in self.units if u.seg.params]
        for k, unit in enumerate(self.units):
            unit.index = k
            self._shard(unit)
            if unit.module is not module:
                unit.module.register_forward_pre_hook(lambda m, a, u=unit: self._before_forward(u))
                unit.module.register_forward_hook(lambda m, a, o, u=unit: self._after_forward(u, o))
            for p in unit.seg.params:
                p.register_post_accumulate_grad_hook(lambda p, u=unit: self._on_gradient(u))
        self.grad_shards: list[torch.Tensor | None] = [None] * len(self.units)
        self._backward_started = False

    # -- sharding and gathering ---------------------------------------------------------------
    @torch.no_grad()
    def _shard(self, unit: _Unit) -> None:
        seg = unit.seg
        dtype = self.mixed_precision.param_dtype if self.mixed_precision else seg.params[0].dtype
        full = seg.flatten([p.detach() for p in seg.params], dtype, seg.params[0].device)
        lo, hi = seg.my_range
        unit.shard = full[lo:hi].clone()
        unit.flat = full
        seg.point_params_at(full)
        self._free(unit)

    def _free(self, unit: _Unit) -> None:
        unit.flat.untyped_storage().resize_(0)
        unit.gathered = False

    def _launch_gather(self, unit: _Unit, async_op: bool) -> PendingCollective | None:
        unit.flat.untyped_storage().resize_(unit.seg.padded_numel * unit.flat.element_size())
        unit.gathered = True
        return all_gather(
            unit.flat, unit.shard, self.comm_stats, self.process_group,
            name=f"unit[{unit.index}].all_gather", async_op=async_op,
        )  # fmt: skip

    def _gather(self, unit: _Unit) -> None:
        if unit.prefetch is not None:
            unit.prefetch.wait()
            unit.prefetch = None
        elif not unit.gathered:
            self._launch_gather(unit, async_op=False)

    def _prefetch(self, index: int) -> None:
        if self.prefetch and 0 <= index < len(self.units):
            unit = self.units[index]
            if not unit.gathered and not unit.reduced:
                unit.prefetch = self._launch_gather(unit, async_op=True)

    # -- forward and backward hooks ------------------------------------------------------------
    def forward(self, *args, **kwargs):
        root = self.units[0]
        if torch.is_grad_enabled():
            self._backward_started = False
            for unit in self.units:
                unit.reduced, unit.missing = False, len(unit.seg.params)
        self._before_forward(root)
        out = self.module(*args, **kwargs)
        return self._after_forward(root, out)

    def _before_forward(self, unit: _Unit) -> None:
        self._gather(unit)
        self._prefetch(unit.index + 1)

    def _after_forward(self, unit: _Unit, output):
        self._free(unit)
        if torch.is_grad_enabled():
            for t in _tensors_in(output):
                if t.requires_grad:
                    t.register_hook(lambda g, u=unit: self._before_backward(u, g))
        return output

    def _before_backward(self, unit: _Unit, grad: torch.Tensor) -> torch.Tensor:
        if not self._backward_started:
            self._backward_started = True
            queue_end_of_backward(self.finish_gradient_synchronization)
        if not unit.reduced:
            self._gather(unit)
            self._prefetch(len(self.units) - 1 if unit.index == 0 else unit.index - 1)
        return grad

    def _on_gradient(self, unit: _Unit) -> None:
        unit.missing -= 1
        if unit.missing == 0:
            self._reduce(unit)

    @torch.no_grad()
    def _reduce(self, unit: _Unit) -> None:
        """Reduce-scatter the unit's gradients into this rank's (averaged) gradient shard."""
        seg = unit.seg
        full = seg.flatten([p.grad for p in seg.params], unit.shard.dtype, unit.shard.device)
        shard = torch.empty_like(unit.shard)
        reduce_scatter(
            shard, full, self.comm_stats, self.process_group, name=f"unit[{unit.index}].grad_rs"
        )
        shard.div_(self.world_size)
        previous = self.grad_shards[unit.index]
        self.grad_shards[unit.index] = shard if previous is None else previous.add_(shard)
        for p in seg.params:
            p.grad = None
        unit.reduced = True
        self._free(unit)

    def finish_gradient_synchronization(self) -> None:
        """End of backward: reduce units whose parameters got no gradient (zeros), free all."""
        if not self._backward_started:
            return
        for unit in self.units:
            if not unit.reduced:
                if not unit.gathered:
                    self._gather(unit)
                self._reduce(unit)
            if unit.prefetch is not None:  # a prefetch nobody used: finish it before freeing
                unit.prefetch.wait()
                unit.prefetch = None
            self._free(unit)
        self._backward_started = False

    # -- optimizer and accounting --------------------------------------------------------------
    def build_optimizer(
        self, optimizer_cls: type[torch.optim.Optimizer], offload: bool = False, **kwargs
    ) -> ShardedParameterOptimizer:
        """An optimizer over this rank's parameter shards (fp32 masters under mixed precision)."""
        return ShardedParameterOptimizer(self, optimizer_cls, offload, kwargs)

    def held_parameter_bytes(self) -> int:
        """Parameter bytes this rank holds now: shards plus any units currently gathered."""
        gathered = sum(u.flat.untyped_storage().size() for u in self.units)
        return sum(nbytes(u.shard) for u in self.units) + gathered


class ShardedParameterOptimizer(MasterShardOptimizer):
    """ZeRO-3's optimizer: steps masters of the unit shards; parameters gather on next use."""

    def __init__(self, fsdp: FullyShardedDataParallel, optimizer_cls, offload, kwargs) -> None:
        self.fsdp = fsdp
        segments = [u.seg for u in fsdp.units]
        super().__init__(
            [({}, segments)], [u.shard for u in fsdp.units], optimizer_cls, kwargs,
            fsdp.process_group, fsdp.mixed_precision, offload,
        )  # fmt: skip
        self.comm_stats = fsdp.comm_stats

    @property
    def grad_shards(self) -> list[torch.Tensor | None]:
        return self.fsdp.grad_shards

    @grad_shards.setter
    def grad_shards(self, value: list[torch.Tensor | None]) -> None:
        self.fsdp.grad_shards = value

    def _reduce_gradients(self) -> None:
        self.fsdp.finish_gradient_synchronization()

    @torch.no_grad()
    def _publish_parameters(self) -> None:
        if not self.masters_share_storage:
            for unit, master in zip(self.fsdp.units, self.masters, strict=True):
                unit.shard.copy_(master)  # round fp32 masters into the compute-dtype shard

    def _param_bytes(self) -> int:
        return self.fsdp.held_parameter_bytes()


def _default_units(module: nn.Module) -> list[nn.Module]:
    """Every element of every ``nn.ModuleList`` (the transformer blocks of a typical model)."""
    return [m for child in module.modules() if isinstance(child, nn.ModuleList) for m in child]


def _tensors_in(output) -> list[torch.Tensor]:
    if torch.is_tensor(output):
        return [output]
    if isinstance(output, (list, tuple)):
        return [t for o in output for t in _tensors_in(o)]
    if isinstance(output, dict):
        return [t for o in output.values() for t in _tensors_in(o)]
    return []
