"""Graders for lab 02 (data parallel) and lab 03 (ZeRO and FSDP): a bucket's all-reduce, a ZeRO-1 step.

Both exercises are the one piece of a mechanism that moves bytes; the grader supplies the rest of a
training loop around the learner's function, runs it on real ranks, and compares the parameters
after a few steps with a reference that shares the seed and the data:

* ``data_parallel.bucketed_hook`` — ``fn(bucket_params)`` is called from gradient hooks the moment
  the last gradient of a bucket exists (buckets from :func:`~dtlab.parallel.assign_buckets`, in
  index order). It must flatten the bucket's gradients, launch **one asynchronous** all-reduce and
  return ``finish()``, which waits, divides by N and writes the averages back into each ``.grad``.
  Reference: ``torch.nn.parallel.DistributedDataParallel`` on the same ranks, same model, same
  data, SGD with momentum (which, unlike Adam, notices a gradient N times too large).
* ``zero.zero1_step`` — ``fn(flat_params, flat_grad, shard, optimizer)``: ``flat_grad`` is this
  rank's local (un-averaged) gradient, flat and padded to a multiple of N; ``shard`` is this rank's
  fp32 master chunk of the parameters (``optimizer`` steps only it). The learner reduce-scatters
  the gradient, averages it, steps the shard and all-gathers every rank's shard into
  ``flat_params`` (the buffer the model's parameters are views of). ``dist.all_reduce`` is switched
  off meanwhile: ZeRO needs only the gradient of the rank's own shard. Reference: one process
  training on the whole global batch.

Tolerance: :data:`~dtlab.parallel.equivalence.FP32_STEP_TOLERANCE` (1e-5 absolute after 4 fp32
steps), the room that a different summation order leaves; a missing average or a stale gradient
is off by orders of magnitude more.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from dtlab.quiz.exercises import GradeResult, exercise

STEPS = 4
BUCKET_CAP_MB = 600 / 2**20  # ~600 bytes: the toy model's gradients fall into several buckets
LR, MOMENTUM = 0.1, 0.9


def _tolerance() -> float:
    from dtlab.parallel.equivalence import FP32_STEP_TOLERANCE

    return FP32_STEP_TOLERANCE


@contextmanager
def _watching_all_reduce(calls: list[tuple[int, bool]], forbid: str | None = None):
    """Record ``(numel, async_op)`` of every ``dist.all_reduce``; with ``forbid``, refuse it."""
    import torch.distributed as dist

    original = dist.all_reduce

    def watched(tensor, *args, **kwargs):
        if forbid is not None:
            raise RuntimeError(forbid)
        async_op = kwargs.get("async_op", args[2] if len(args) > 2 else False)
        calls.append((tensor.numel(), bool(async_op)))
        return original(tensor, *args, **kwargs)

    dist.all_reduce = watched
    try:
        yield
    finally:
        dist.all_reduce = original


# -- data_parallel.bucketed_hook ----------------------------------------------------------------
class _LearnerBuckets:
    """The BucketedDDP bookkeeping around the learner's ``fn``: count, launch in order, finish."""

    def __init__(self, fn: Callable, params: list) -> None:
        from dtlab.parallel import assign_buckets

        self.fn, self.buckets = fn, assign_buckets(params, BUCKET_CAP_MB)
        self.where = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self.reset()
        for p in params:
            p.register_post_accumulate_grad_hook(self.on_gradient_ready)

    def reset(self) -> None:
        self.missing = [len(b) for b in self.buckets]
        self.launched: list[Any] = []

    def on_gradient_ready(self, p) -> None:
        self.missing[self.where[id(p)]] -= 1
        # Buckets launch in index order on every rank: collectives are matched by issue order.
        while len(self.launched) < len(self.buckets) and self.missing[len(self.launched)] == 0:
            self.launched.append(self.fn(list(self.buckets[len(self.launched)])))

    def finish(self) -> None:
        if len(self.launched) != len(self.buckets):
            raise AssertionError(
                f"only {len(self.launched)} of {len(self.buckets)} buckets were launched "
                "during backward (a grader problem: report it)"
            )
        for b, done in enumerate(self.launched):
            if not callable(done):
                raise AssertionError(
                    f"for bucket {b} your function returned {type(done).__name__}; return a "
                    "function finish() that waits for the all-reduce and writes the averages "
                    "back into each parameter's .grad"
                )
            done()


def _train_bucketed_on_rank(fn: Callable) -> dict:
    import torch
    import torch.distributed as dist

    import dtlab
    from dtlab.parallel.ddp_common import trainable_parameters
    from dtlab.parallel.equivalence import (
        TiedToyModel,
        lm_loss,
        max_abs_difference,
        parameters_by_name,
        rank_slice,
        toy_batches,
    )

    rank, world, device = dist.get_rank(), dist.get_world_size(), dtlab.device()
    batches = [(x.to(device), y.to(device)) for x, y in toy_batches(STEPS)]

    reference = TiedToyModel(seed=0).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(reference)
    opt = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM)
    for tokens, targets in batches:
        opt.zero_grad(set_to_none=True)
        lm_loss(ddp(rank_slice(tokens, rank, world)), rank_slice(targets, rank, world)).backward()
        opt.step()

    model = TiedToyModel(seed=0).to(device)
    params = trainable_parameters(model)
    buckets = _LearnerBuckets(fn, params)
    opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    calls: list[tuple[int, bool]] = []
    with _watching_all_reduce(calls):
        for tokens, targets in batches:
            buckets.reset()
            opt.zero_grad(set_to_none=True)
            loss = lm_loss(model(rank_slice(tokens, rank, world)), rank_slice(targets, rank, world))
            loss.backward()
            buckets.finish()
            opt.step()
    return {
        "difference": max_abs_difference(parameters_by_name(model), parameters_by_name(reference)),
        "calls": calls,
        "buckets": [sum(p.numel() for p in b) for b in buckets.buckets],
    }


@exercise("data_parallel.bucketed_hook", title="All-reduce one gradient bucket", world_size=2)
def grade_bucketed_hook(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(bucket_params) -> finish``: one async all-reduce per bucket, averaged into ``.grad``."""
    results = cluster.run(_train_bucketed_on_rank, fn)
    first = results[0]
    sizes, calls = first["buckets"], first["calls"]
    expected_calls = len(sizes) * STEPS
    if not calls:
        raise AssertionError(
            "no dist.all_reduce was issued, so every rank trained on its own gradients only; "
            "flatten the bucket's gradients into one tensor and all-reduce it"
        )
    if len(calls) != expected_calls:
        raise AssertionError(
            f"{len(calls)} all-reduces in {STEPS} steps for {len(sizes)} buckets per step "
            f"(expected {expected_calls}): flatten the whole bucket into one tensor and launch "
            "ONE all-reduce for it — fewer, larger messages are the point of buckets"
        )
    if not all(async_op for _, async_op in calls):
        raise AssertionError(
            "launch the all-reduce with async_op=True and wait for it in finish(): a blocking "
            "call inside the gradient hook stalls backward until the bytes have moved, so the "
            "communication no longer hides behind the rest of backward"
        )
    tolerance = _tolerance()
    worst = max(r["difference"] for r in results)
    if worst > tolerance:
        raise AssertionError(
            f"after {STEPS} SGD steps your parameters differ from torch DDP's by up to "
            f"{worst:.3g} (tolerance {tolerance:g}). Check: divide the sum by the world size; "
            "copy each slice of the flat buffer back into the right parameter's .grad "
            "(same order and sizes as you flattened them)"
        )
    return GradeResult(
        True,
        f"{len(sizes)} buckets per step, one async all-reduce each; after {STEPS} SGD steps "
        f"every rank matches torch DDP within {worst:.1e} (tolerance {tolerance:g}).",
        {"elements per bucket": sizes, "max |Δparam|": f"{worst:.2e}"},
    )


# -- zero.zero1_step ----------------------------------------------------------------------------
NO_ALL_REDUCE = (
    "ZeRO-1 does not all-reduce the gradient: each rank steps only its own shard, so it needs "
    "only the averaged gradient of that shard — a reduce-scatter, half the bytes of an all-reduce"
)


def _train_zero1_on_rank(fn: Callable) -> dict:
    import torch
    import torch.distributed as dist
    from torch import nn

    import dtlab
    from dtlab.parallel.ddp_common import trainable_parameters
    from dtlab.parallel.equivalence import (
        TiedToyModel,
        lm_loss,
        max_abs_difference,
        parameters_by_name,
        rank_slice,
        toy_batches,
        train_single_process,
    )
    from dtlab.parallel.flat_shard import FlatSegment

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
    for tokens, targets in batches:
        for p in segment.params:
            p.grad = None
        lm_loss(model(rank_slice(tokens, rank, world)), rank_slice(targets, rank, world)).backward()
        flat_grad = segment.flatten([p.grad for p in segment.params], torch.float32, device)
        with _watching_all_reduce([], forbid=NO_ALL_REDUCE), torch.no_grad():
            fn(flat_params, flat_grad, shard, optimizer)
    return {
        "difference": max_abs_difference(parameters_by_name(model), want),
        "padded": segment.padded_numel,
        "shard": segment.shard_numel,
    }


@exercise("zero.zero1_step", title="The ZeRO-1 optimizer step", world_size=2)
def grade_zero1_step(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(flat_params, flat_grad, shard, optimizer)``: reduce-scatter, step the shard, all-gather."""
    results = cluster.run(_train_zero1_on_rank, fn)
    tolerance = _tolerance()
    worst = max(r["difference"] for r in results)
    if worst > tolerance:
        raise AssertionError(
            f"after {STEPS} steps the parameters differ from one process training on the whole "
            f"batch by up to {worst:.3g} (tolerance {tolerance:g}). Check, in order: "
            "reduce-scatter flat_grad so this rank gets the SUM of its chunk; divide by the "
            "world size; set shard.grad before optimizer.step(); all-gather every rank's "
            "shard into flat_params"
        )
    n = cluster.world_size
    return GradeResult(
        True,
        f"Each of {n} ranks stepped {results[0]['shard']} of {results[0]['padded']} elements and "
        f"all-gathered the rest; after {STEPS} steps the model matches single-process training "
        f"within {worst:.1e} (tolerance {tolerance:g}).",
        {"max |Δparam|": f"{worst:.2e}"},
    )
