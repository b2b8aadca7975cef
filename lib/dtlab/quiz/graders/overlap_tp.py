"""Grader for lab 12 (overlap): a column-parallel Linear whose backward hides its all-reduce.

``overlap.tp_backward_async`` — ``fn(x, weight, bias, group)``, the column-parallel Linear of
lab 04 (``x`` (…, in) the full input, the same on every rank; ``weight`` (out/t, in) and ``bias``
(out/t,) this rank's rows; returns this rank's (…, out/t) columns of ``Y``), whose backward
*launches* the all-reduce of the partial ``dL/dx`` (``dist.all_reduce(..., async_op=True)``)
right after computing it, computes the weight gradient ``dL/dW_r = dY_rᵀ·x`` (and ``dL/db_r``)
while the transfer runs, and only then waits — Megatron-LM's
``LinearWithGradAccumulationAndAsyncCommunication`` (a code optimisation, see
:mod:`dtlab.parallel.tensor.backward_overlap`; not a section of Narayanan et al., SC 2021).

What is checked, on every rank of a 2-rank group, against one process in fp64:

* the output and the three gradients (``dx`` summed over the group, ``dW_r``, ``db_r``), within
  :data:`~dtlab.quiz.graders.tensor_parallel.LINEAR_TOLERANCE`;
* the traffic: nothing in forward, exactly one all-reduce of ``bytes(x)`` in backward, and no
  other collective (:mod:`.watch` refuses any);
* the **order** in backward, from one log of what ran: the all-reduce was launched before the
  weight-gradient GEMM (a matmul whose result has the weight's shape) and its ``wait()`` came
  after that GEMM. A blocking ``dist.all_reduce`` waits inside the call, before wgrad, and
  fails with a hint. Time is not graded: on a shared CPU a wall-clock "exposed time" is noise,
  while the order is what makes the overlap possible on any machine (the lab measures the time
  with :func:`dtlab.parallel.tensor.measure_tp_backward_overlap`).

Refused (:class:`~dtlab.quiz.exercises.NotTheSkill`): the library's answer —
:func:`dtlab.parallel.tensor.column_parallel_linear` and its helpers, the lab 04 layers and
operators, :class:`dtlab.comm.Communicator`'s collectives — and torch's functional collectives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.tensor_parallel import (
    LINEAR_TOLERANCE,
    NARROW,
    WIDE,
    _check_pass,
    _gap,
    _library_answers,
    _refuse_library,
)
from dtlab.quiz.graders.watch import noticing_calls, watching

BATCH, SEQ = 2, 5  # 10 tokens: no GEMM of dgrad (10, in) has the weight's (out/t, in) shape
ASYNC_ALL_REDUCE = (
    "the backward talks once: dist.all_reduce of the partial dL/dx, launched with "
    "async_op=True and waited after the weight gradient; nothing else crosses the wire"
)


def _overlap_library_answers() -> dict[Callable, str]:
    from dtlab.comm import Communicator
    from dtlab.parallel.tensor import backward_overlap as bo

    answers = _library_answers()
    answers.update(
        {
            bo.column_parallel_linear: "dtlab.parallel.tensor.column_parallel_linear",
            bo._ColumnParallelOverlapped.forward: "dtlab.parallel.tensor.column_parallel_linear",
            bo.launch_input_grad_reduction: "dtlab.parallel.tensor.backward_overlap",
            bo.weight_gradients: "dtlab.parallel.tensor.backward_overlap",
            Communicator.all_reduce: "dtlab.comm.Communicator.all_reduce",
        }
    )
    return answers


class _OrderLog:
    """What ran in backward, in order: GEMMs (with their result's shape), collective launches
    and waits. GEMMs come from a dispatch mode; launches and waits from wrappers installed on
    top of :func:`.watch.watching`'s, so its refusals still apply."""

    GEMMS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear")

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def __enter__(self) -> _OrderLog:
        import torch.distributed as dist
        from torch.utils._python_dispatch import TorchDispatchMode

        log = self

        class Gemms(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func.overloadpacket.__name__ in _OrderLog.GEMMS and hasattr(out, "shape"):
                    # size-1 dimensions dropped: einsum reaches bmm with a batch of one
                    log.events.append(("gemm", tuple(d for d in out.shape if d != 1)))
                return out

        self._launch, self._wait = dist.ProcessGroup.allreduce, dist.Work.wait
        launch, wait = self._launch, self._wait

        def logged_launch(pg, *args, **kwargs):
            work = launch(pg, *args, **kwargs)
            log.events.append(("launch", id(work)))
            return work

        def logged_wait(work, *args, **kwargs):
            log.events.append(("wait", id(work)))
            return wait(work, *args, **kwargs)

        dist.ProcessGroup.allreduce, dist.Work.wait = logged_launch, logged_wait
        self._mode = Gemms()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        import torch.distributed as dist

        self._mode.__exit__(*exc)
        dist.ProcessGroup.allreduce, dist.Work.wait = self._launch, self._wait

    def order_problem(self, weight_shape: tuple) -> str | None:
        """Why the all-reduce did not overlap the weight-gradient GEMM, or ``None``."""
        launches = [i for i, (kind, _) in enumerate(self.events) if kind == "launch"]
        wgrads = [
            i
            for i, (kind, shape) in enumerate(self.events)
            if kind == "gemm" and shape in (weight_shape, weight_shape[::-1])
        ]
        if not launches:
            return "no all-reduce was launched in backward"
        if not wgrads:
            return (
                f"no matmul produced the weight gradient's shape {weight_shape}: compute "
                "dL/dW_r = dY_rᵀ·x yourself in backward (grad.reshape(-1, out).t() @ x.reshape"
                "(-1, in)), between launching the all-reduce and waiting for it"
            )
        launch, wgrad = launches[0], wgrads[0]
        work = self.events[launch][1]
        waits = [i for i, (kind, w) in enumerate(self.events) if kind == "wait" and w == work]
        if launch > wgrad:
            return (
                "the all-reduce was launched after the weight-gradient matmul, so nothing ran "
                "while it travelled: launch it as soon as the partial dL/dx exists"
            )
        if not waits:
            return "the all-reduce was never waited for: call .wait() before returning dL/dx"
        if waits[0] < wgrad:
            return (
                "the all-reduce was waited for before the weight-gradient matmul (a blocking "
                "dist.all_reduce waits inside the call): pass async_op=True, keep the handle, "
                "compute dL/dW_r and dL/db_r, then handle.wait()"
            )
        return None


def _on_rank(fn: Callable) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import dtlab
    from dtlab.mesh import Mesh

    rank, t, device = dist.get_rank(), dist.get_world_size(), dtlab.device()
    group = Mesh(tp=t).tp_group
    g = torch.Generator().manual_seed(12)

    def draw(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(device)

    x, w, b, dy = draw(BATCH, SEQ, NARROW), draw(WIDE, NARROW), draw(WIDE), draw(BATCH, SEQ, WIDE)
    ref = [v.clone().requires_grad_() for v in (x, w, b)]
    y_ref = F.linear(*ref)
    y_ref.backward(dy)

    def mine(v, dim):
        return v.chunk(t, dim)[rank].contiguous()

    leaves = [v.clone().requires_grad_() for v in (x, mine(w, 0), mine(b, 0))]
    wants = [ref[0].grad, mine(ref[1].grad, 0), mine(ref[2].grad, 0)]
    with (
        watching({"all_reduce"}, ASYNC_ALL_REDUCE) as forward,
        noticing_calls(_overlap_library_answers()) as used,
    ):
        y = fn(*leaves, group)
    if used:
        return {"library": used}
    result = {"library": [], "y": _gap(y, mine(y_ref.detach(), -1)), "forward": forward.summary()}
    if result["y"] == float("inf") or not y.requires_grad:
        return {**result, "y": float("inf"), "detached": True}
    with (
        watching({"all_reduce"}, ASYNC_ALL_REDUCE) as backward,
        noticing_calls(_overlap_library_answers()) as used,
        _OrderLog() as log,
    ):
        y.backward(mine(dy, -1))
    for name, leaf, want in zip(("dx", "dweight", "dbias"), leaves, wants, strict=True):
        result[name] = _gap(leaf.grad, want)
    result.update(
        library=used,
        backward=backward.summary(),
        order=log.order_problem(tuple(leaves[1].shape)),
        x_bytes=x.numel() * x.element_size(),
    )
    return result


@exercise(
    "overlap.tp_backward_async",
    title="Column-parallel backward: all-reduce dL/dx behind the weight gradient",
    world_size=2,
)
def grade_tp_backward_async(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(x, weight, bias, group)``: lab 04's column-parallel Linear whose backward launches
    the dL/dx all-reduce asynchronously and waits for it after the weight-gradient GEMM."""
    results = cluster.run(_on_rank, fn)
    t = cluster.world_size
    for rank, r in enumerate(results):
        _refuse_library(r["library"], "the column-parallel backward with its async all-reduce")
        if r.get("detached"):
            raise AssertionError(
                f"rank {rank}: the output is not this rank's columns x·W_rᵀ + b_r with a "
                "gradient: return the result of your torch.autograd.Function's apply"
            )
        for name in ("y", "dx", "dweight", "dbias"):
            if r[name] > LINEAR_TOLERANCE:
                raise AssertionError(
                    f"rank {rank}: {name} differs from one process's by {r[name]:.3g} "
                    f"(tolerance {LINEAR_TOLERANCE:g}). dL/dx is the partial dY_r·W_r summed "
                    "over the group (wait for the all-reduce before returning it); dL/dW_r and "
                    "dL/db_r are local"
                )
    for rank, r in enumerate(results):
        _check_pass(r, rank, t, "forward", 0, "the column-parallel forward moves nothing")
        sent = _check_pass(
            r, rank, t, "backward", r["x_bytes"], "backward is ONE all-reduce of dL/dx"
        )
        if r["order"] is not None:
            raise NotTheSkill(f"rank {rank}: the values are right, but {r['order']}")
    return GradeResult(
        True,
        f"On {t} ranks backward launched the all-reduce of dL/dx ({sent:,.0f} B per rank) "
        "before the weight-gradient matmul and waited for it after: the transfer had the wgrad "
        f"GEMM to hide under. Every gradient matches one process within {LINEAR_TOLERANCE:g}.",
        {"backward bytes per rank": f"{sent:,.0f}", "order": "launch → wgrad GEMM → wait"},
    )
