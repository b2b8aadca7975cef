"""What data parallelism and ZeRO/FSDP share: when gradients move, and how they travel together.

Both families keep replicas of one model on the data-parallel group and average its gradients
over that group; they differ in what each rank *holds* (:mod:`dtlab.parallel.data`: everything;
:mod:`dtlab.parallel.zero`: a shard). What they share lives here, in one neutral module both
import, so that neither family reaches into the other's files (a test holds ``zero/`` to it):

* :func:`broadcast_module_state` — replicas must *start* equal (rank 0's copy to everyone);
* :func:`queue_end_of_backward` — the hook that completes a step's reductions once autograd has
  produced every gradient (DDP waits for its all-reduces, ZeRO-2 and FSDP for reduce-scatters);
* :func:`assign_buckets` — which parameters travel together in one flat buffer: DDP's gradient
  buckets and ZeRO-1/2's flat segments are cut by the same rule;
* :func:`reduce_scatter` and :func:`all_gather` — the two halves of an all-reduce on the counted
  ring, as exercise helpers (lab 03's graders hold their bytes to the formula).

Both run their collectives on a plain :class:`~dtlab.comm.Communicator` over the dp group
(``Communicator(group, collectives, dim="dp")``; spans labelled ``dp``): there is no data-parallel
kind of communicator, only a communicator on the dp group.

One small module rather than a package: these are a few short functions, and
:mod:`dtlab.comm` is the layer *under* every parallel family, which should not know what a
replica, a bucket or a backward pass is.
"""

from __future__ import annotations

import torch
from torch import nn

from dtlab.comm import Communicator

__all__ = [
    "MB",
    "all_gather",
    "assign_buckets",
    "broadcast_module_state",
    "queue_end_of_backward",
    "reduce_scatter",
    "trainable_parameters",
]

MB = 1024 * 1024


def reduce_scatter(shard: torch.Tensor, full: torch.Tensor, group=None) -> None:
    """Exercise helper: rank r receives the sum of chunk r of every rank's ``full`` in ``shard``.

    Runs on dtlab's counted ring, so a grader can hold the bytes to (N-1)/N · bytes(full).
    """
    Communicator(group, "dtlab", dim="dp").reduce_scatter(shard, full)


def all_gather(full: torch.Tensor, shard: torch.Tensor, group=None) -> None:
    """Exercise helper: every rank's ``shard`` concatenated into ``full`` (counted ring)."""
    Communicator(group, "dtlab", dim="dp").all_gather(full, shard)


def broadcast_module_state(module: nn.Module, comm: Communicator) -> None:
    """Copy group rank 0's parameters and buffers (frozen ones too) to every rank.

    Replicas must *start* equal: identical averaged gradients only keep them equal.
    """
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            comm.broadcast(t.data, name="broadcast_state")


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Parameters that get gradients, each once (a tied weight appears once), in registration order."""
    return [p for p in module.parameters() if p.requires_grad]


def queue_end_of_backward(callback) -> None:
    """Run ``callback`` once the current backward pass has finished (all gradients accumulated)."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def assign_buckets(
    params: list[nn.Parameter], bucket_cap_mb: float, first_bucket_mb: float | None = None
) -> list[list[nn.Parameter]]:
    """Split ``params`` (reverse registration order, grouped by dtype) into bucket-sized lists.

    A parameter larger than the cap gets a bucket of its own. Reverse registration order is
    roughly the order backward produces gradients, so the first bucket fills first; it may be
    smaller (``first_bucket_mb``) so communication starts as early as possible (Li et al.,
    VLDB 2020, §3.2).
    """
    groups: list[list[nn.Parameter]] = []
    open_by_dtype: dict[torch.dtype, tuple[list[nn.Parameter], int]] = {}
    for p in reversed(params):
        current, size = open_by_dtype.get(p.dtype, (None, 0))
        is_first = current is not None and current is groups[0]
        cap = (first_bucket_mb if is_first and first_bucket_mb is not None else bucket_cap_mb) * MB
        p_bytes = p.numel() * p.element_size()
        if current is None or (size + p_bytes > cap and current):
            current, size = [], 0
            groups.append(current)
        current.append(p)
        open_by_dtype[p.dtype] = (current, size + p_bytes)
    return groups
