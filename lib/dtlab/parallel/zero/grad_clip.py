"""Gradient-norm clipping when no rank holds the whole gradient.

``torch.nn.utils.clip_grad_norm_`` computes ``||g|| = sqrt(sum_i g_i^2)`` over local tensors.
Under ZeRO-2/3 each rank holds one shard of the (already averaged) gradient, so a local norm is
only part of the answer. The true global norm is

    ||g||^2 = sum over ranks r of ||shard_r||^2     (shards are disjoint; padding is zero)

so each rank computes its partial sum of squares in fp32, one scalar all-reduce adds them, and
every rank scales its shard by the same ``min(1, max_norm / (||g|| + 1e-6))`` — exactly what
one process clipping the full gradient would do. Gradients that are *replicated* (whole and equal
on every rank, e.g. FSDP's unsharded norms) are added once, after the all-reduce, so no element is
counted N times. The partial sum lives on the gradients' device: NCCL reduces GPU tensors only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dtlab.comm import Communicator
from dtlab.runtime import context


def _sum_of_squares(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    total = torch.zeros(1, dtype=torch.float32, device=device)
    for g in tensors:
        total += g.detach().float().pow(2).sum()
    return total


def clip_sharded_grad_norm_(
    grad_shards: Sequence[torch.Tensor | None],
    max_norm: float,
    comm: Communicator | None = None,
    replicated: Sequence[torch.Tensor] = (),
) -> torch.Tensor:
    """Scale disjoint gradient shards (and replicated gradients) so the *global* norm is at most
    ``max_norm``. ``comm`` carries the one-scalar all-reduce (default: the whole world).

    Returns the global norm before clipping (fp32 scalar, same on every rank).
    """
    shards = [g for g in grad_shards if g is not None]
    everything = shards + list(replicated)
    device = everything[0].device if everything else context.device()  # NCCL: not the CPU
    total = _sum_of_squares(shards, device)
    (comm or Communicator(dim="dp")).all_reduce(total, name="grad_norm")
    total += _sum_of_squares(replicated, device)
    norm = total[0].sqrt()
    coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in everything:
        g.mul_(coefficient.to(g.dtype))
    return norm
