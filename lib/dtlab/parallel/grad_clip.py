"""Gradient-norm clipping when no rank holds the whole gradient.

``torch.nn.utils.clip_grad_norm_`` computes ``||g|| = sqrt(sum_i g_i^2)`` over local tensors.
Under ZeRO-2/3 each rank holds one shard of the (already averaged) gradient, so a local norm is
only part of the answer. The true global norm is

    ||g||^2 = sum over ranks r of ||shard_r||^2     (shards are disjoint; padding is zero)

so each rank computes its partial sum of squares in fp32, one scalar all-reduce adds them, and
every rank scales its shard by the same ``min(1, max_norm / (||g|| + 1e-6))`` — exactly what
one process clipping the full gradient would do.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dtlab.parallel.ddp_common import CommStats, all_reduce


def clip_sharded_grad_norm_(
    grad_shards: list[torch.Tensor | None],
    max_norm: float,
    process_group: dist.ProcessGroup | None = None,
    stats: CommStats | None = None,
) -> torch.Tensor:
    """Scale disjoint gradient shards so the *global* norm is at most ``max_norm``.

    Returns the global norm before clipping (fp32 scalar, same on every rank).
    """
    shards = [g for g in grad_shards if g is not None]
    partial = torch.zeros((), dtype=torch.float32)
    for g in shards:
        partial += g.detach().float().pow(2).sum().cpu()
    total = partial.reshape(1)
    all_reduce(total, stats, process_group, name="grad_norm")
    norm = total[0].sqrt()
    coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in shards:
        g.mul_(coefficient.to(g.device, g.dtype))
    return norm
