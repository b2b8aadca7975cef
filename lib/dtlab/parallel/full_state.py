"""Gather full parameters (name → tensor) from sharded training, e.g. to save a checkpoint.

Under ZeRO-1/2 every rank already holds full *compute* parameters, but under mixed precision the
authoritative values are the fp32 master shards; under ZeRO-3 no rank holds a full parameter
between uses. Either way the full value of a segment is the all-gather of its master shards
((N-1)/N·Ψ·4 bytes sent per rank), after which each parameter is a slice of the flat result.
Every rank receives every tensor (on CPU); save from rank 0.
"""

from __future__ import annotations

import torch
from torch import nn

from dtlab.parallel.ddp_common import all_gather


@torch.no_grad()
def gather_full_parameters(
    sharded, optimizer=None, module: nn.Module | None = None
) -> dict[str, torch.Tensor]:
    """Full-precision parameters by name from a ZeRO-3 wrapper or a ZeRO-1/2 optimizer.

    ``sharded`` is a :class:`~dtlab.parallel.FullyShardedDataParallel` (its ``.module`` names the
    parameters) or a :class:`~dtlab.parallel.ZeroOptimizer` (pass ``module`` for the names).
    ``optimizer`` supplies fp32 masters under mixed precision; without it the compute-dtype
    shards are gathered. Frozen parameters are returned as they are (they are replicated).
    """
    from dtlab.parallel.zero3 import FullyShardedDataParallel

    if isinstance(sharded, FullyShardedDataParallel):
        module = sharded.module
        segments = [u.seg for u in sharded.units]
        shards = [u.shard for u in sharded.units]
        group = sharded.process_group
    else:
        if module is None:
            raise ValueError("pass module=... so the gathered parameters can be named")
        optimizer, segments, group = sharded, sharded.segments, sharded.process_group
        shards = [
            f[s.my_range[0] : s.my_range[1]] for s, f in zip(segments, sharded.flats, strict=True)
        ]
    if optimizer is not None:
        shards = optimizer.masters
    values: dict[int, torch.Tensor] = {}
    for seg, shard in zip(segments, shards, strict=True):
        full = torch.empty(seg.padded_numel, dtype=shard.dtype, device=shard.device)
        all_gather(full, shard.detach().contiguous(), None, group, name="gather_full_state")
        for p, view in zip(seg.params, seg.views(full), strict=True):
            values[id(p)] = view.cpu().clone()
    return {
        name: values[id(p)] if id(p) in values else p.detach().cpu().clone()
        for name, p in module.named_parameters()
    }
