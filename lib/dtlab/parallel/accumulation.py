"""Gradient accumulation: one optimizer step from K micro-batches run one after another.

A global batch of ``K·b`` samples that does not fit is run as ``K`` micro-batches of ``b``. Each
micro-batch's mean loss is scaled by ``1/K`` and its gradient *added* into ``.grad``; after the
K-th backward ``.grad`` is the big batch's mean-loss gradient (exactly in real arithmetic; in
floating point up to the order of the sums) and the optimizer steps once. Memory: activations of
one micro-batch at a time; time: K forwards and backwards in sequence.

**What the data-parallel wrappers do with the K backwards** (Ψ gradient elements, N ranks):

==================  ==============================  =========================================
wrapper             per optimizer step              why
==================  ==============================  =========================================
DDP + ``no_sync``   1 all-reduce (2(N-1)/N·Ψ)       ``.grad`` sums locally; the last backward
                                                    averages the sum (Li et al. 2020, §3.2.4)
DDP, no no_sync     K all-reduces (K× the bytes)     the same update, K-1 reductions wasted
ZeRO-2              K reduce-scatters               the full gradient is freed after each
                                                    backward; only the Ψ/N shard accumulates
ZeRO-3 / FSDP       K reduce-scatters + K·2         parameters are re-gathered for every
                    all-gathers                     micro-batch's forward and backward
==================  ==============================  =========================================

ZeRO-2/3 *must* reduce each micro-batch: skipping it would mean keeping the full Ψ gradient,
which is the memory stage 2 exists to save (torch's FSDP ``no_sync`` does exactly that). In a
pipeline the micro-batches are the accumulation (:mod:`dtlab.parallel.pipeline.execute` scales
each loss by ``1/m``), and DP reduces once after the flush.
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
    ``no_sync`` (default) every backward but the last runs inside ``model.no_sync()``, so a DDP
    wrapper reduces once; ``model`` without ``no_sync`` (a plain module, ZeRO-3/FSDP) needs
    ``no_sync=False``. ``comm_bytes`` is the change in ``model.comm_stats.bytes_sent`` (0 when
    the model counts nothing).
    """
    batches = list(micro_batches)
    k = len(batches)
    if k == 0:
        raise ValueError("accumulate_gradients needs at least one micro-batch")
    if no_sync and not hasattr(model, "no_sync"):
        raise ValueError(
            f"{type(model).__name__} has no no_sync(): pass no_sync=False (ZeRO-2/3 and FSDP "
            "reduce-scatter every micro-batch by design; a plain module needs no sync)"
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
