"""Grader for lab 03 (ZeRO and FSDP): the ZeRO-1 optimizer step.

``zero.zero1_step`` — ``fn(flat_params, flat_grad, shard, optimizer)``: ``flat_grad`` is this
rank's local (un-averaged) gradient, flat and padded to a multiple of N; ``shard`` is this rank's
fp32 master chunk of the parameters (``optimizer`` steps only it). The learner reduce-scatters
the gradient, averages it, steps the shard and all-gathers every rank's shard into
``flat_params`` (the buffer the model's parameters are views of). Reference: one process
training on the whole global batch, same seed and data (Rajbhandari et al., "ZeRO", SC 2020,
Sec. 5.1: P_os, the optimizer state partitioned).

Right parameters are not enough: all-reducing the gradient and slicing gets them too. While the
learner's code runs (:func:`~dtlab.quiz.graders.watch.watching`) every collective but
reduce-scatter and all-gather is refused — ``dist.all_reduce`` with the reason — and each step
must send exactly ``2 (N-1)/N · M`` bytes per rank (``M`` the flat gradient): ``(N-1)/N · M`` to
reduce-scatter the gradient, the same to all-gather the parameters. Bytes are counted from the
real messages on dtlab's rings (the lab's helpers) and by the ring convention for torch's own
collectives; an all-reduce built any other way costs at least ``(N-1)/N · M`` more, and fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.data_parallel import LR, MOMENTUM, STEPS, step_tolerance
from dtlab.quiz.graders.watch import P2P, watching

NO_ALL_REDUCE = (
    "ZeRO-1 does not all-reduce the gradient: each rank steps only its own shard, so it needs "
    "only the averaged gradient of that shard — a reduce-scatter, half the bytes of an "
    "all-reduce — and then all-gathers the parameters"
)
_RING_SHARE = {"reduce_scatter": 1, "all_gather": 1}  # × (N-1)/N · M, the ring convention


def _bytes_sent(wire, world: int) -> float:
    """Bytes this rank sent: counted messages, plus torch's collectives by the ring convention."""
    conventional = sum(
        _RING_SHARE.get(kind, 2) * (world - 1) / world * nbytes
        for _, kind, nbytes, _ in wire.summary()["collectives"]
    )
    return wire.p2p_bytes_sent + conventional


def _train_zero1_on_rank(fn: Callable) -> dict:
    import torch
    import torch.distributed as dist
    from torch import nn

    import dtlab
    from dtlab.parallel.data.equivalence import (
        TiedToyModel,
        lm_loss,
        max_abs_difference,
        parameters_by_name,
        rank_slice,
        toy_batches,
        train_single_process,
    )
    from dtlab.parallel.gradient_sync import trainable_parameters
    from dtlab.parallel.zero.flat_segment import FlatSegment

    rank, world, device = dist.get_rank(), dist.get_world_size(), dtlab.device()
    batches = [(x.to(device), y.to(device)) for x, y in toy_batches(STEPS)]
    reference = TiedToyModel(seed=0).to(device)
    want = train_single_process(
        reference, torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM), batches
    )

    model = TiedToyModel(seed=0).to(device)
    segment = FlatSegment(trainable_parameters(model), rank, world)
    flat_params = segment.flatten([p.detach() for p in segment.params], torch.float32, device)
    segment.point_params_at(flat_params)  # the model's parameters are views of flat_params
    lo, hi = segment.my_range
    shard = nn.Parameter(flat_params[lo:hi].clone())
    optimizer = torch.optim.SGD([shard], lr=LR, momentum=MOMENTUM)
    sent, allowed = [], {"reduce_scatter", "all_gather", P2P}
    for tokens, targets in batches:
        for p in segment.params:
            p.grad = None
        lm_loss(model(rank_slice(tokens, rank, world)), rank_slice(targets, rank, world)).backward()
        flat_grad = segment.flatten([p.grad for p in segment.params], torch.float32, device)
        with watching(allowed, NO_ALL_REDUCE) as wire, torch.no_grad():
            fn(flat_params, flat_grad, shard, optimizer)
        sent.append(_bytes_sent(wire, world))
    return {
        "difference": max_abs_difference(parameters_by_name(model), want),
        "padded": segment.padded_numel,
        "shard": segment.shard_numel,
        "sent": sent,
    }


@exercise("zero.zero1_step", title="The ZeRO-1 optimizer step", world_size=2)
def grade_zero1_step(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(flat_params, flat_grad, shard, optimizer)``: reduce-scatter, step the shard, all-gather."""
    results = cluster.run(_train_zero1_on_rank, fn)
    tolerance = step_tolerance()
    worst = max(r["difference"] for r in results)
    if worst > tolerance:
        raise AssertionError(
            f"after {STEPS} steps the parameters differ from one process training on the whole "
            f"batch by up to {worst:.3g} (tolerance {tolerance:g}). Check, in order: "
            "reduce-scatter flat_grad so this rank gets the SUM of its chunk; divide by the "
            "world size; set shard.grad before optimizer.step(); all-gather every rank's "
            "shard into flat_params"
        )
    n, m = cluster.world_size, results[0]["padded"] * 4
    want = 2 * (n - 1) / n * m
    for rank, result in enumerate(results):
        wrong = [b for b in result["sent"] if b != want]
        if wrong:
            raise NotTheSkill(
                f"rank {rank} sent {wrong[0]:,.0f} B in one step; ZeRO-1 sends exactly "
                f"2(N-1)/N·M = {want:,.0f} B (M = {m:,} B, the flat gradient): (N-1)/N·M to "
                "reduce-scatter the gradient, the same to all-gather the parameters. "
                "All-reducing the gradient alone already costs 2(N-1)/N·M; move only the shards"
            )
    return GradeResult(
        True,
        f"Each of {n} ranks stepped {results[0]['shard']} of {results[0]['padded']} elements and "
        f"all-gathered the rest, sending 2(N-1)/N·M = {want:,.0f} B per step; after {STEPS} "
        f"steps the model matches single-process training within {worst:.1e} "
        f"(tolerance {tolerance:g}).",
        {"max |Δparam|": f"{worst:.2e}", "bytes sent per rank per step": f"{want:,.0f}"},
    )
