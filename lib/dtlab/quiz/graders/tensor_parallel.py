"""Graders for lab 04 (tensor parallelism): column- and row-parallel Linear, vocab-parallel loss.

Megatron-LM (Shoeybi et al. 2019, §3) splits ``Y = X·Wᵀ + b`` over the ``t`` ranks of a
tensor-parallel group two ways, and wraps each pair in the conjugate operators ``f`` (identity
forward, all-reduce backward) and ``g`` (all-reduce forward, identity backward):

``tensor_parallel.column_parallel_linear`` — ``fn(x, weight, bias, group)``: ``x`` (…, in) is
the full input, the same on every rank; ``weight`` (out/t, in) and ``bias`` (out/t,) are this
rank's rows. Returns this rank's (…, out/t) columns of ``Y``. Forward moves nothing; backward
must all-reduce ``dL/dx`` once (``f``): every rank's rows contributed a partial ``dL/dx``.

``tensor_parallel.row_parallel_linear`` — ``fn(x, weight, bias, group)``: ``x`` (…, in/t) is
this rank's slice of the input's last dimension; ``weight`` (out, in/t) this rank's columns;
``bias`` (out,) replicated. Returns the full (…, out) ``Y`` on every rank: one all-reduce of the
partial products in forward (``g``), the bias added once after it, nothing in backward.

``tensor_parallel.vocab_parallel_cross_entropy`` — ``fn(logits, targets, vocab_start, group)``:
``logits`` (n, V/t) is this rank's vocabulary slice, starting at token id ``vocab_start``;
``targets`` (n,) the full ids. Returns the mean cross-entropy, equal to ``F.cross_entropy`` of the
full logits, on every rank — without ever assembling them. Per token three numbers cross the
wire (the max, the sum of exp, the target's logit); backward is local (softmax − one-hot).

Every reference is one process computing the unsharded thing on the same inputs (fp64 for the
linears, where only the order of sums differs; the loss from fp32 logits against fp64).

The skill, not only the numbers. While the learner's code runs (:mod:`.watch`) every collective
but ``dist.all_reduce`` is refused — gathering weights, activations or logits is not how these
layers talk — and a call into the library's own answer (``ColumnParallelLinear``,
``copy_to_group``, ``vocab_parallel_cross_entropy``, …) or torch's functional collectives, which
the watcher cannot count, fails with :class:`~dtlab.quiz.exercises.NotTheSkill`. Bytes are
counted per pass by the ring convention (``2(t-1)/t · M`` per all-reduce of ``M`` bytes) and must
be exact: column ``0`` forward and ``2(t-1)/t · bytes(x)`` backward; row the reverse with
``bytes(Y)``; the loss the same at two vocabulary sizes, nothing in backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtlab.quiz.exercises import GradeResult, exercise
from dtlab.quiz.graders.tensor_parallel_checks import _calls as _calls
from dtlab.quiz.graders.tensor_parallel_checks import (
    _check_pass,
    _gap,
    _library_answers,
    _refuse_library,
)
from dtlab.quiz.graders.tensor_parallel_checks import _sent as _sent
from dtlab.quiz.graders.watch import noticing_calls, watching

LINEAR_TOLERANCE = 1e-12  # fp64: t partial products summed in another order
LOSS_TOLERANCE = 1e-4  # fp32 logits near ±100 against fp64
GRAD_TOLERANCE = 1e-6  # (softmax − one-hot)/n, entries below 1/n
BATCH, SEQ, NARROW, WIDE = 2, 3, 8, 12  # the linear's x is (2, 3, in); 12 splits over 2, 3, 4
TOKENS, VOCABS = 24, (48, 192)  # the loss runs at two vocabulary sizes, same tokens
# Per-token logit offsets: exp(100) overflows fp32, and one max shared by all tokens underflows.
LOGIT_OFFSETS = (100.0, -100.0, 0.0, 40.0)

ONLY_F_AND_G = (
    "a column- or row-parallel layer talks only through Megatron's f and g, each one "
    "dist.all_reduce (of dL/dx in the column layer's backward, of the partial Y in the row "
    "layer's forward); gathering weights or activations is not tensor parallelism"
)
NEVER_THE_LOGITS = (
    "the loss needs three numbers per token — the max, the sum of exp and the target's logit — "
    "each summed (or maxed) with dist.all_reduce; the logits themselves never leave their rank"
)


# -- the column- and row-parallel Linear ---------------------------------------------------------
def _linear_on_rank(fn: Callable, split: str) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import dtlab
    from dtlab.mesh import Mesh

    rank, t, device = dist.get_rank(), dist.get_world_size(), dtlab.device()
    group = Mesh(tp=t).tp_group
    width_in, width_out = (NARROW, WIDE) if split == "column" else (WIDE, NARROW)
    g = torch.Generator().manual_seed(4)

    def draw(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(device)

    x, w, b, dy = (
        draw(BATCH, SEQ, width_in),
        draw(width_out, width_in),
        draw(width_out),
        draw(BATCH, SEQ, width_out),
    )
    ref = [v.clone().requires_grad_() for v in (x, w, b)]
    y_ref = F.linear(*ref)
    y_ref.backward(dy)
    dx_ref, dw_ref, db_ref = (v.grad for v in ref)

    def mine(v, dim):
        return v.chunk(t, dim)[rank].contiguous()

    if split == "column":  # full x; rows of W and b; this rank's columns of Y
        inputs = [x, mine(w, 0), mine(b, 0)]
        want_y, upstream = mine(y_ref.detach(), -1), mine(dy, -1)
        want_grads = [dx_ref, mine(dw_ref, 0), mine(db_ref, 0)]
        partial_dx = upstream @ inputs[1]  # what a rank has before f's all-reduce
    else:  # this rank's slice of x's features; columns of W; the whole bias
        inputs = [mine(x, -1), mine(w, 1), b]
        want_y, upstream = y_ref.detach(), dy
        want_grads = [mine(dx_ref, -1), mine(dw_ref, 1), db_ref]
        partial_y = F.linear(inputs[0], inputs[1])
    leaves = [v.clone().requires_grad_() for v in inputs]
    with (
        watching({"all_reduce"}, ONLY_F_AND_G) as forward,
        noticing_calls(_library_answers()) as used,
    ):
        y = fn(*leaves, group)
    if used:
        return {"library": used}
    result = {"library": [], "y": _gap(y, want_y), "y_shape": tuple(getattr(y, "shape", ()))}
    result["forward"] = forward.summary()
    if result["y"] == float("inf") or not y.requires_grad:
        return {**result, "y": float("inf"), "detached": True}
    if split == "row":
        result["bias_every_rank"] = _gap(y, want_y + (t - 1) * b)
        result["unsummed"] = _gap(y, partial_y + b)
    with watching({"all_reduce"}, ONLY_F_AND_G) as backward:
        y.backward(upstream)
    for name, leaf, want in zip(("dx", "dweight", "dbias"), leaves, want_grads, strict=True):
        result[name] = _gap(leaf.grad, want)
    if split == "column":
        result["dx_is_partial"] = _gap(leaves[0].grad, partial_dx) < LINEAR_TOLERANCE
    else:
        result["dx_times_t"] = _gap(leaves[0].grad, t * want_grads[0]) < LINEAR_TOLERANCE
    result["backward"] = backward.summary()
    result["x_bytes"] = x.numel() * x.element_size()
    result["y_bytes"] = y_ref.numel() * y_ref.element_size()
    return result


def _check_output_tracked(r: dict, rank: int) -> None:
    if r.get("detached") and len(r["y_shape"]):
        raise AssertionError(
            f"rank {rank}: the output carries no gradient (made under torch.no_grad, detached, "
            "or a new tensor): autograd must see the matmul so backward reaches x, W and b"
        )


def _check_gradients(r: dict, rank: int, hint: str) -> None:
    for name in ("dx", "dweight", "dbias"):
        if r[name] > LINEAR_TOLERANCE:
            raise AssertionError(
                f"rank {rank}: the gradient {name} differs from one process's by {r[name]:.3g} "
                f"(tolerance {LINEAR_TOLERANCE:g}). {hint}"
            )


@exercise(
    "tensor_parallel.column_parallel_linear", title="Column-parallel Linear with f", world_size=2
)
def grade_column_parallel_linear(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(x, weight, bias, group)``: this rank's output columns; backward all-reduces dL/dx."""
    results = cluster.run(_linear_on_rank, fn, "column")
    t = cluster.world_size
    for rank, r in enumerate(results):
        _refuse_library(r["library"], "f and the column-parallel matmul")
        _check_output_tracked(r, rank)
        if r["y"] > LINEAR_TOLERANCE:
            talked = (
                " The forward pass needs no communication at all."
                if r["forward"]["collectives"]
                else ""
            )
            raise AssertionError(
                f"rank {rank}: the output (shape {r['y_shape']}) is not this rank's columns of "
                f"X·Wᵀ + b (off by {r['y']:.3g}). Each rank multiplies the full x by its own "
                f"rows of W and adds its slice of b: Y_r = x·W_rᵀ + b_r, shape (…, out/t).{talked}"
            )
        if r["dx_is_partial"]:
            raise AssertionError(
                f"rank {rank}: dL/dx is only this rank's partial sum dY_r·W_r. Every rank's rows "
                "of W used the same x, so the true dL/dx is the SUM over ranks: f must all-reduce "
                "the gradient in backward. A dist.all_reduce in forward is invisible to autograd; "
                "put it in the backward of a torch.autograd.Function"
            )
        _check_gradients(r, rank, "dL/dW_r and dL/db_r are local; dL/dx is summed over the group")
    for rank, r in enumerate(results):
        _check_pass(r, rank, t, "forward", 0, "the column-parallel forward moves nothing")
        sent = _check_pass(
            r, rank, t, "backward", r["x_bytes"],
            "f's backward is ONE all-reduce of dL/dx (the size of x)",
        )  # fmt: skip
    return GradeResult(
        True,
        f"On {t} ranks each computed its {WIDE // t} of {WIDE} output columns with no "
        f"communication; backward all-reduced dL/dx once ({sent:,.0f} B = 2(t-1)/t·bytes(x) per "
        f"rank), and every gradient matches one process within {LINEAR_TOLERANCE:g}.",
        {"forward bytes per rank": "0", "backward bytes per rank": f"{sent:,.0f}"},
    )


@exercise("tensor_parallel.row_parallel_linear", title="Row-parallel Linear with g", world_size=2)
def grade_row_parallel_linear(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(x, weight, bias, group)``: the full output, summed by one all-reduce in forward."""
    results = cluster.run(_linear_on_rank, fn, "row")
    t = cluster.world_size
    for rank, r in enumerate(results):
        _refuse_library(r["library"], "g and the row-parallel matmul")
        _check_output_tracked(r, rank)
        if r["y"] > LINEAR_TOLERANCE:
            if r["bias_every_rank"] < LINEAR_TOLERANCE:
                hint = (
                    "every rank added the bias before the sum, so it counts t times: add it "
                    "once, after g's all-reduce"
                )
            elif r["unsummed"] < LINEAR_TOLERANCE:
                hint = (
                    "each rank returned only its partial product x_r·W_rᵀ: g must all-reduce "
                    "(sum) the partial products over the group"
                )
            else:
                hint = "Y = Σ_r x_r·W_rᵀ + b: local matmul, all-reduce (g), then the bias once"
            raise AssertionError(
                f"rank {rank}: the output (shape {r['y_shape']}) differs from X·Wᵀ + b by "
                f"{r['y']:.3g}: {hint}"
            )
        if r["dx_times_t"]:
            raise AssertionError(
                f"rank {rank}: dL/dx_r is t = {t} times too large: g's backward is the identity "
                "(every rank already holds the whole dL/dY); all-reducing it sums t copies"
            )
        _check_gradients(r, rank, "every gradient of the row-parallel layer is local")
    for rank, r in enumerate(results):
        sent = _check_pass(
            r, rank, t, "forward", r["y_bytes"],
            "g is ONE all-reduce of the partial product (the size of Y)",
        )  # fmt: skip
        _check_pass(r, rank, t, "backward", 0, "g's backward is the identity and moves nothing")
    return GradeResult(
        True,
        f"On {t} ranks each multiplied its {WIDE // t} of {WIDE} input features; one all-reduce "
        f"of the partial products ({sent:,.0f} B = 2(t-1)/t·bytes(Y) per rank) summed them, the "
        f"bias was added once, backward moved nothing, and every gradient matches one process "
        f"within {LINEAR_TOLERANCE:g}.",
        {"forward bytes per rank": f"{sent:,.0f}", "backward bytes per rank": "0"},
    )
