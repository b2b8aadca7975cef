"""Gradient accumulation: one optimizer step from K micro-batches run one after another.

A global batch of ``K·b`` samples that does not fit is run as ``K`` micro-batches of ``b``. Each
micro-batch's mean loss is scaled by ``1/K`` and its gradient *added* into ``.grad``; after the
K-th backward ``.grad`` is the big batch's mean-loss gradient (exactly in real arithmetic; in
floating point up to the order of the sums) and the optimizer steps once. Memory: activations of
one micro-batch at a time; time: K forwards and backwards in sequence.

**What the data-parallel wrappers do with the K backwards** (Ψ gradient elements of ``b``
bytes, N ranks). Skipping a reduction is never free: the gradient that is not reduced must be
kept *whole* until it is, so each row trades bytes sent against gradient memory held.

=======================  ===============================  ===================================
wrapper                  sent per optimizer step          gradient held between micro-batches
=======================  ===============================  ===================================
DDP + ``no_sync``        1 all-reduce (2(N-1)/N·Ψb)       full Ψ (DDP holds it anyway); the last
                                                          backward averages the sum (Li et al.
                                                          2020, §3.2.4)
DDP, no no_sync          K all-reduces (K× the bytes)     full Ψ; K-1 reductions wasted
ZeRO-1                   1 reduce-scatter, then 1        full Ψ, reduced once at ``step()``
                         all-gather of the parameters
ZeRO-2                   K reduce-scatters                the Ψ/N shard only: each backward
                                                          reduces and frees the full gradient
ZeRO-3 / FSDP            K reduce-scatters + 2K           the Ψ/N shard only; parameters are
                         all-gathers                      re-gathered for every micro-batch's
                                                          forward and backward
FSDP + ``no_sync``       1 reduce-scatter + 2K            full Ψ (in the reduce dtype) *on top
                         all-gathers                      of* the shards
=======================  ===============================  ===================================

So ZeRO-2 and FSDP *can* skip the per-micro-batch reduce-scatter, at the price of a full
unsharded gradient per rank — the memory they exist to save. torch's FSDP1 ``no_sync()`` and
FSDP2's ``set_requires_gradient_sync(False)`` offer exactly that; dtlab's
:meth:`~dtlab.parallel.FullyShardedDataParallel.no_sync` does the same. For ZeRO-2 the same trade
is ZeRO stage 1 (``ZeroOptimizer(stage=1)`` keeps ``.grad`` whole and reduces at ``step()``), so
dtlab's stage 2 offers no ``no_sync`` of its own. Which to pick: reduce every micro-batch when
the full gradient does not fit, skip when it fits and bandwidth is the bottleneck. In a pipeline
the micro-batches are the accumulation (:mod:`dtlab.parallel.pipeline.execute` scales each loss
by ``1/m``), and DP reduces once after the flush.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from dtlab import trace

__all__ = ["AccumulationStep", "accumulate_gradients"]


@dataclass
class AccumulationStep:
    """What one accumulated optimizer step did: its loss, micro-batches and traffic."""

    loss: float
    micro_batches: int
    synced_backwards: int
    comm_bytes: int = 0
    losses: list[float] = field(default_factory=list)


def _stats_bytes(model: nn.Module) -> int | None:
    stats = getattr(model, "comm_stats", None)
    return None if stats is None else int(stats.bytes_sent)


def accumulate_gradients(
    model: nn.Module,
    micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]] | Iterable,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    no_sync: bool = True,
) -> AccumulationStep:
    """Forward and backward every ``(inputs, targets)`` micro-batch, each loss scaled by ``1/K``.

    Leaves the accumulated gradient in ``.grad`` (the caller zeroes before and steps after). With
    ``no_sync`` (default) every backward but the last runs inside ``model.no_sync()``, so DDP
    and FSDP reduce once (FSDP holding a full gradient meanwhile, see the module docstring);
    ``model`` without ``no_sync`` (a plain module, e.g. under a ZeRO-1/2 optimizer) needs
    ``no_sync=False``. ``comm_bytes`` is the change in ``model.comm_stats.bytes_sent`` (0 when
    the model counts nothing).
    """
    batches = list(micro_batches)
    k = len(batches)
    if k == 0:
        raise ValueError("accumulate_gradients needs at least one micro-batch")
    if no_sync and not hasattr(model, "no_sync"):
        raise ValueError(
            f"{type(model).__name__} has no no_sync(): pass no_sync=False. A plain module "
            "reduces nothing in backward; under ZeroOptimizer(stage=2) each micro-batch "
            "reduce-scatters so only the Ψ/N gradient shard is kept, and reducing once per step "
            "instead means keeping the full gradient, which is ZeroOptimizer(stage=1). DDP and "
            "FullyShardedDataParallel have no_sync() (FSDP's holds a full gradient per rank)."
        )
    before = _stats_bytes(model)
    losses, synced = [], 0
    for i, (inputs, targets) in enumerate(batches):
        last = i == k - 1
        skip = no_sync and not last
        context = model.no_sync() if skip else contextlib.nullcontext()
        with context, trace.labels(micro_batch=i):
            with trace.span(f"forward[{i}]", kind="compute"):
                loss = loss_fn(model(inputs), targets) / k
            with trace.span(f"backward[{i}]", kind="compute"):
                loss.backward()
        synced += 0 if skip else 1
        losses.append(float(loss.detach()) * k)
    after = _stats_bytes(model)
    moved = 0 if before is None or after is None else after - before
    return AccumulationStep(sum(losses) / k, k, synced, moved, losses)


def split_batch(
    inputs: torch.Tensor, targets: torch.Tensor, micro_batches: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Cut a batch into ``micro_batches`` equal micro-batches along dim 0 (refused otherwise)."""
    n = inputs.shape[0]
    if micro_batches < 1 or n % micro_batches:
        raise ValueError(
            f"batch of {n} does not split into {micro_batches} equal micro-batches; choose a "
            f"divisor of {n}"
        )
    return list(zip(inputs.chunk(micro_batches), targets.chunk(micro_batches), strict=True))
