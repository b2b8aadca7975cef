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


# -- data_parallel.token_normalised_loss ---------------------------------------------------------
# ``fn(loss_sum, n_tokens) -> loss``: this rank's summed token losses and token count in, the loss
# to call backward on out, such that DDP's gradient AVERAGE over N ranks is the single-process
# gradient of the mean over all T tokens: all-reduce the count, return N · loss_sum / T. The
# grader runs a per-token linear model in fp64 on ranks holding different numbers of tokens
# (twice, with different counts, so a hard-coded total fails), averages the gradients as DDP does,
# and compares with one process over all tokens (1e-12). On the wire: the learner's function may
# issue only all-reduces, and one of them must carry the count (a few bytes, not the tokens).
TOKEN_LENGTHS = ((3, 9, 5), (6, 2, 7))
ONE_COUNT_ALL_REDUCE = "all-reduce the token count (one small integer tensor); nothing else moves"


def _tokens(total: int):
    import torch

    g = torch.Generator().manual_seed(11)
    x = torch.randn(total, 4, generator=g, dtype=torch.float64)
    return x, torch.randn(total, generator=g, dtype=torch.float64)


def _normalised_gradient_on_rank(fn: Callable, lengths: tuple) -> dict:
    import torch
    import torch.distributed as dist

    import dtlab

    rank, world, device = dist.get_rank(), dist.get_world_size(), dtlab.device()
    x, y = (t.to(device) for t in _tokens(sum(lengths)))
    start = sum(lengths[:rank])
    x, y = x[start : start + lengths[rank]], y[start : start + lengths[rank]]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False).double().to(device)
    loss_sum = ((model(x).squeeze(-1) - y) ** 2).sum()
    with watching({"all_reduce"}, ONE_COUNT_ALL_REDUCE, dtlab_collectives=False) as wire:
        loss = fn(loss_sum, len(y))
    loss.backward()
    grad = model.weight.grad.detach().clone()
    dist.all_reduce(grad)  # what DDP does after backward: sum, then divide by N
    grad /= world
    return {"grad": grad.cpu(), "moved": [c.payload_bytes for c in wire.collectives]}


def _single_process_gradient(lengths: tuple):
    import torch

    x, y = _tokens(sum(lengths))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False).double()
    ((model(x).squeeze(-1) - y) ** 2).mean().backward()
    return model.weight.grad.detach().clone()


@exercise(
    "data_parallel.token_normalised_loss",
    title="Normalise the loss by the global token count",
    world_size=3,
)
def grade_token_normalised_loss(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(loss_sum, n_tokens) -> loss`` giving DDP's averaged gradient = the all-token mean's."""
    worst, world = 0.0, cluster.world_size
    for base in TOKEN_LENGTHS:  # unequal counts on every rank, whatever the world size
        lengths = tuple(base[r % len(base)] + r // len(base) for r in range(world))
        results = cluster.run(_normalised_gradient_on_rank, fn, lengths)
        want = _single_process_gradient(lengths)
        got = results[0]["grad"]
        ratio = float((got.norm() / want.norm()).item())
        error = float((got - want).abs().max().item())
        if error > 1e-12:
            hint = (
                f"your gradient is {ratio:.3g}× the right one's size: DDP divides the summed "
                f"gradients by N = {len(lengths)}, so multiply by the world size"
                if abs(ratio * len(lengths) - 1) < 1e-6 or abs(ratio / len(lengths) - 1) < 1e-6
                else "each token must weigh 1/T with T = all ranks' tokens: all-reduce n_tokens "
                "(a tensor), then return world_size · loss_sum / T"
            )
            raise AssertionError(
                f"with {lengths} tokens per rank your averaged gradient differs from one process "
                f"over all {sum(lengths)} tokens by up to {error:.3g}; {hint}"
            )
        if not any(0 < b <= 16 for r in results for b in r["moved"]):
            raise NotTheSkill(
                "the gradient is right but no small all-reduce of the token count was seen; "
                + ONE_COUNT_ALL_REDUCE
            )
        worst = max(worst, error)
    return GradeResult(
        True,
        f"on {world} ranks holding different numbers of tokens (two draws), DDP's averaged "
        f"gradient equals one process over all tokens (max |Δ| {worst:.1e}).",
        {"max |Δgrad|": f"{worst:.1e}"},
    )
