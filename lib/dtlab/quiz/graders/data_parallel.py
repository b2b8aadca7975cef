"""Graders for lab 02 (data parallel): a gradient bucket's all-reduce, from DDP's hooks.

The exercise is the one piece of the mechanism that moves bytes; the grader supplies the rest of
a training loop around the learner's function, runs it on real ranks, and compares the
parameters after a few steps with a reference that shares the seed and the data.

``data_parallel.bucketed_hook`` — ``fn(bucket_params)`` is called from gradient hooks the moment
the last gradient of a bucket exists (buckets from :func:`~dtlab.parallel.assign_buckets`, in
index order). It must flatten the bucket's gradients, launch **one asynchronous** all-reduce and
return ``finish()``, which waits, divides by N and writes the averages back into each ``.grad``.
Reference: ``torch.nn.parallel.DistributedDataParallel`` on the same ranks, same model, same
data, SGD with momentum (which, unlike Adam, notices a gradient N times too large).

Right parameters are not enough. While the learner's code runs the grader watches the wire
(:func:`~dtlab.quiz.graders.watch.watching`, which sees a call under any imported name): only
``dist.all_reduce`` is allowed, and it must be exactly **one per bucket**, carrying the whole
flattened bucket, and **not yet waited on** when the hook returns (else the communication cannot
overlap the rest of backward); the collectives per step must equal the buckets.

Tolerance: :data:`~dtlab.parallel.data.equivalence.FP32_STEP_TOLERANCE` (1e-5 absolute after 4 fp32
steps), the room that a different summation order leaves; a missing average or a stale gradient
is off by orders of magnitude more. The ZeRO-1 grader (:mod:`~dtlab.quiz.graders.zero`) shares it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.watch import watching

STEPS = 4
BUCKET_CAP_MB = 600 / 2**20  # ~600 bytes: the toy model's gradients fall into several buckets
LR, MOMENTUM = 0.1, 0.9
ONE_ALL_REDUCE_PER_BUCKET = (
    "each bucket's gradients are averaged by ONE dist.all_reduce of the flattened bucket, "
    "launched with async_op=True (what DDP does)"
)


def step_tolerance() -> float:
    from dtlab.parallel.data.equivalence import FP32_STEP_TOLERANCE

    return FP32_STEP_TOLERANCE


# -- data_parallel.bucketed_hook ----------------------------------------------------------------
class _LearnerBuckets:
    """The BucketedDDP bookkeeping around the learner's ``fn``: count, launch in order, finish."""

    def __init__(self, fn: Callable, params: list, wire) -> None:
        from dtlab.parallel import assign_buckets

        self.fn, self.buckets, self.wire = fn, assign_buckets(params, BUCKET_CAP_MB), wire
        self.where = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self.issued: list[list[list[tuple]]] = []  # per step, per bucket: (kind, bytes, waited)
        self.reset()
        for p in params:
            p.register_post_accumulate_grad_hook(self.on_gradient_ready)

    def reset(self) -> None:
        self.missing = [len(b) for b in self.buckets]
        self.launched: list[Any] = []
        self.issued.append([])

    def on_gradient_ready(self, p) -> None:
        self.missing[self.where[id(p)]] -= 1
        # Buckets launch in index order on every rank: collectives are matched by issue order.
        while len(self.launched) < len(self.buckets) and self.missing[len(self.launched)] == 0:
            before = len(self.wire.collectives)
            self.launched.append(self.fn(list(self.buckets[len(self.launched)])))
            self.issued[-1].append(
                [(c.kind, c.payload_bytes, c.waited) for c in self.wire.collectives[before:]]
            )

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
    from dtlab.parallel.data.equivalence import (
        TiedToyModel,
        lm_loss,
        max_abs_difference,
        parameters_by_name,
        rank_slice,
        toy_batches,
    )
    from dtlab.parallel.gradient_sync import trainable_parameters

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
    opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    with watching({"all_reduce"}, ONE_ALL_REDUCE_PER_BUCKET, dtlab_collectives=False) as wire:
        buckets = _LearnerBuckets(fn, params, wire)
        for step, (tokens, targets) in enumerate(batches):
            if step:
                buckets.reset()
            opt.zero_grad(set_to_none=True)
            loss = lm_loss(model(rank_slice(tokens, rank, world)), rank_slice(targets, rank, world))
            loss.backward()
            buckets.finish()
            opt.step()
    return {
        "difference": max_abs_difference(parameters_by_name(model), parameters_by_name(reference)),
        "issued": buckets.issued,
        "collectives": len(wire.collectives),
        "bucket_bytes": [sum(p.numel() * p.element_size() for p in b) for b in buckets.buckets],
    }


def _bucketing_problem(result: dict) -> str | None:
    """Why the collectives issued are not one async all-reduce per bucket (None if they are)."""
    sizes, issued = result["bucket_bytes"], result["issued"]
    if result["collectives"] == 0:
        return (
            "no all-reduce was issued, so every rank trained on its own gradients only; "
            "flatten the bucket's gradients into one tensor and all-reduce it"
        )
    for step, per_bucket in enumerate(issued):
        for b, calls in enumerate(per_bucket):
            if len(calls) != 1:
                return (
                    f"step {step}: bucket {b} issued {len(calls)} collectives (expected ONE "
                    "all-reduce): flatten the whole bucket into one tensor and launch ONE "
                    "all-reduce for it, the moment its hook fires — fewer, larger messages are "
                    "the point of buckets"
                )
            (_, nbytes, waited), want = calls[0], sizes[b]
            if nbytes != want:
                return (
                    f"step {step}: bucket {b} holds {want} B of gradients but your all-reduce "
                    f"carried {nbytes} B: flatten every gradient of the bucket into ONE tensor"
                )
            if waited:
                return (
                    "launch the all-reduce with async_op=True and wait for it in finish(), not "
                    "in the hook: a call that is waited on inside the gradient hook stalls "
                    "backward until the bytes have moved, so the communication no longer hides "
                    "behind the rest of backward"
                )
    if result["collectives"] != len(sizes) * len(issued):
        return (
            f"{result['collectives']} collectives in {len(issued)} steps for {len(sizes)} "
            "buckets per step: launch ONE all-reduce per bucket and nothing else (finish() "
            "only waits, divides and copies back)"
        )
    return None


@exercise("data_parallel.bucketed_hook", title="All-reduce one gradient bucket", world_size=2)
def grade_bucketed_hook(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(bucket_params) -> finish``: one async all-reduce per bucket, averaged into ``.grad``."""
    results = cluster.run(_train_bucketed_on_rank, fn)
    tolerance = step_tolerance()
    worst = max(r["difference"] for r in results)
    for result in results:
        problem = _bucketing_problem(result)
        if problem:  # right parameters reached some other way are "not the skill"
            raise (NotTheSkill if worst <= tolerance else AssertionError)(problem)
    sizes = [nbytes // 4 for nbytes in results[0]["bucket_bytes"]]
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
