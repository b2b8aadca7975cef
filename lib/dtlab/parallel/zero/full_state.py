"""Whole tensors and held bytes from sharded training: full parameters, full gradients, memory.

Under ZeRO-1/2 every rank already holds full *compute* parameters, but under mixed precision the
authoritative values are the fp32 master shards; under ZeRO-3 no rank holds a full parameter
between uses. Either way the full value of a segment is the all-gather of its shards
((N-1)/N·Ψ·b bytes sent per rank), after which each parameter is a slice of the flat result.
Every rank receives every tensor (on CPU); save from rank 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dtlab.comm import nbytes
from dtlab.parallel.zero.flat_segment import state_tensor_bytes


def _gather_segment(comm, seg, shard: torch.Tensor) -> list[torch.Tensor]:
    full = torch.empty(seg.padded_numel, dtype=shard.dtype, device=shard.device)
    comm.all_gather(full, shard.detach().contiguous(), name="gather_full_state")
    return [view.cpu().clone() for view in seg.views(full)]


@torch.no_grad()
def gather_full_tensors(fsdp, value_of: Callable[[nn.Parameter], torch.Tensor | None]):
    """``value_of(registered parameter)`` made whole for every trainable parameter, by name.

    For a sharded parameter ``value_of`` sees the 1-D shard view (its ``.data`` or ``.grad``);
    the shards of a unit are laid back into the flat segment (zeros where ``None``) and gathered.
    """
    values: dict[int, torch.Tensor | None] = {}
    for unit in fsdp.units:
        if unit.params:
            lo, hi = unit.seg.my_range
            shard = torch.zeros(hi - lo, dtype=unit.master_dtype, device=unit.shard.device)
            for sp, off in zip(unit.shard_params, unit.seg.offsets, strict=True):
                value = value_of(sp)
                if value is not None and sp.numel():
                    start = max(off, lo) - lo
                    shard[start : start + sp.numel()] = value
            for p, full in zip(
                unit.params, _gather_segment(unit.comm, unit.seg, shard), strict=True
            ):
                values[id(p)] = full
        for p in unit.replicated:
            value = value_of(p)
            values[id(p)] = None if value is None else value.detach().cpu().clone()
    originals = {
        id(sp): p for u in fsdp.units for sp, p in zip(u.shard_params, u.params, strict=True)
    }
    out = {}
    for name, p in fsdp.module.named_parameters():
        key = id(originals.get(id(p), p))
        if key in values:
            out[name] = values[key]
    return out


@torch.no_grad()
def gather_full_parameters(
    sharded, optimizer=None, module: nn.Module | None = None
) -> dict[str, torch.Tensor]:
    """Full-precision parameters by name from a ZeRO-3 wrapper or a ZeRO-1/2 optimizer.

    ``sharded`` is a :class:`~dtlab.parallel.FullyShardedDataParallel` (its shards are the fp32
    masters; frozen parameters come back as they are) or a :class:`~dtlab.parallel.ZeroOptimizer`
    (pass ``module`` for the names; its fp32 masters are gathered).
    """
    if hasattr(sharded, "units"):  # a FullyShardedDataParallel (zero.fsdp uses this module)
        trained = gather_full_tensors(sharded, lambda p: p.detach())
        return {
            name: trained[name] if name in trained else p.detach().cpu().clone()
            for name, p in sharded.module.named_parameters()
        }
    if module is None:
        raise ValueError("pass module=... so the gathered parameters can be named")
    values: dict[int, torch.Tensor] = {}
    for seg, master in zip(sharded.segments, sharded.masters, strict=True):
        for p, full in zip(seg.params, _gather_segment(sharded.comm, seg, master), strict=True):
            values[id(p)] = full
    return {
        name: values[id(p)] if id(p) in values else p.detach().cpu().clone()
        for name, p in module.named_parameters()
    }


def held_by_category(fsdp, optimizer: torch.optim.Optimizer | None) -> dict:
    """What a ZeRO-3 rank holds now, measured from its tensors.

    ``params`` are the shards (fp32: they double as master weights) plus replicas plus any
    gathered unit; ``grads`` the registered gradients (shards and replicas) plus any full
    gradient kept for a later reduction under ``no_sync()``; ``optimizer_state`` the optimizer's
    per-element state. ``by_device`` splits the same bytes by the device that really holds each
    storage.
    """
    by_device: dict[str, int] = {}

    def count(t: torch.Tensor, size: int | None = None) -> int:
        size = nbytes(t) if size is None else size
        by_device[str(t.device)] = by_device.get(str(t.device), 0) + size
        return size

    params = grads = 0
    for unit in fsdp.units:
        params += count(unit.shard) + count(unit.flat, unit.flat.untyped_storage().size())
        distinct = {id(p): p for p in unit.replicated + unit.replicated_compute}
        params += sum(count(p) for p in distinct.values())
        registered = unit.shard_params + unit.replicated
        grads += sum(count(p.grad) for p in registered if p.grad is not None)
        grads += sum(count(t) for t in unit.unsynced.values())  # kept whole under no_sync()
    state = 0
    if optimizer is not None:
        state = state_tensor_bytes(optimizer)
        for s in optimizer.state.values():
            for t in s.values():
                if torch.is_tensor(t) and t.dim() > 0:
                    count(t)
    return {"params": params, "grads": grads, "optimizer_state": state, "by_device": by_device}
