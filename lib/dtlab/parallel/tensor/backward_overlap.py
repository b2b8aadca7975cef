"""A column-parallel Linear whose backward hides the input-gradient collective behind wgrad.

Megatron-LM's ``LinearWithGradAccumulationAndAsyncCommunication`` (``megatron/core/tensor_parallel/
layers.py``: an optimisation of the code, described in no paper section of its own — Narayanan
et al., SC 2021 §4.1 is the pipeline's scatter/gather, not this); the SP re-gather of the input
overlapped with the input-gradient computation is Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models" (2022), §4.2.2. The backward of ``Y_r = X · A_rᵀ``
computes two GEMMs:

* **dgrad** ``dX_r = dY_r · A_r`` — this rank's *partial* input gradient; the whole ``dL/dX`` is
  their sum over the ``t`` ranks: an **all-reduce** (``2(t-1)/t · b·s·h`` elements per rank), or
  with sequence parallelism a **reduce-scatter** along the sequence (``(t-1)/t · b·s·h``);
* **wgrad** ``dA_r = dY_rᵀ · X`` (and ``db_r = Σ dY_r``) — needs ``X``, not the reduced ``dX``.

Nothing in this layer's wgrad reads the reduced ``dX``, so the collective can be *launched* right
after dgrad and *waited* for after wgrad: the transfer runs under the wgrad GEMM, and the rank
sits in ``wait`` only for what wgrad did not cover. With sequence parallelism the forward kept
only this rank's sequence shard of ``X`` (``1/t`` of the activation memory); backward must
all-gather ``X`` again for wgrad, and launches that gather *before* dgrad, which does not need it,
waiting for it only when wgrad starts. Order, with ``backward_overlap=True``::

    [SP: launch all-gather X]  dgrad  [SP: wait X]  launch reduce(dX)  wgrad  wait reduce(dX)

and with ``backward_overlap=False`` the same operations, each collective waited for as soon as it
is launched — so the two orders give **bit-identical** gradients (the same GEMMs on the same
operands) and differ only in when the rank blocks. Megatron sets
``CUDA_DEVICE_MAX_CONNECTIONS=1`` so the GPU launches the NCCL kernel before the wgrad GEMM;
on gloo the transfer runs on gloo's own threads while this thread computes.

What stays exposed without async TP: the forward collectives (the row-parallel all-reduce, or the
SP all-gather / reduce-scatter) — the next layer needs their result at once — and, with sequence
parallelism, the backward all-gather of ``dL/dY`` before the row-parallel layer's dgrad.
:mod:`~dtlab.parallel.tensor.async_tp` hides those by chunking.

Spans (on the trace of ``cluster.run``): ``tp.dgrad`` and ``tp.wgrad`` (compute), the collective
``tp.input_grad_all_reduce`` / ``tp.input_grad_reduce_scatter`` / ``tp.regather_input`` (comm,
launch to completion) and ``wait:<that name>`` (idle: the *exposed* part). On
``collectives="dtlab"`` the same holds on gloo: the asynchronous collective is queued on the
ranks' background stream (:mod:`dtlab.comm.background`), counted and overlapped, its ``comm`` span
drawn from the worker's start (labelled ``stream="background"``). Only on NCCL does the counted
path run it inside the launch (:class:`~dtlab.comm.OverlapRefused`, warned once): the gradients
are the same, nothing overlaps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dtlab import trace
from dtlab.comm import Communicator, PendingCollective

SEQ_DIM = 1

INPUT_GRAD_NAMES = ("tp.input_grad_all_reduce", "tp.input_grad_reduce_scatter")
REGATHER_NAME = "tp.regather_input"


def _gather_sequence(shard: torch.Tensor, comm: Communicator, name: str, async_op: bool):
    """Launch the all-gather of ``shard`` along the sequence; returns (full, handle or None)."""
    moved = shard.movedim(SEQ_DIM, 0).contiguous()
    full = moved.new_empty((comm.world_size * moved.shape[0], *moved.shape[1:]))
    handle = comm.all_gather(full.view(-1), moved.view(-1), name=name, async_op=async_op)
    return full, handle


def _sequence_major(full: torch.Tensor) -> torch.Tensor:
    # Contiguous, as the plain layer's entry makes it: the GEMM then takes the same path.
    return full.movedim(0, SEQ_DIM).contiguous()


def launch_input_grad_reduction(
    dgrad: torch.Tensor, comm: Communicator, sequence_parallel: bool
) -> tuple[torch.Tensor, PendingCollective | None]:
    """Start summing the partial input gradients over the group; returns (where the result
    lands, the handle to ``wait()`` on before reading it). All-reduce in place of ``dgrad``, or
    with sequence parallelism a reduce-scatter into this rank's sequence shard."""
    if not sequence_parallel:
        return dgrad, comm.all_reduce(dgrad, name=INPUT_GRAD_NAMES[0], async_op=True)
    if dgrad.shape[SEQ_DIM] % comm.world_size:
        raise ValueError(
            f"sequence parallelism splits {dgrad.shape[SEQ_DIM]} tokens over {comm.world_size} "
            f"ranks; feed sequences whose length is a multiple of {comm.world_size}"
        )
    moved = dgrad.movedim(SEQ_DIM, 0).contiguous()
    shard = moved.new_empty((moved.shape[0] // comm.world_size, *moved.shape[1:]))
    handle = comm.reduce_scatter(
        shard.view(-1), moved.view(-1), name=INPUT_GRAD_NAMES[1], async_op=True
    )
    # A view, not a copy: the reduce-scatter is still filling ``shard``.
    return shard.movedim(0, SEQ_DIM), handle


def weight_gradients(
    grad: torch.Tensor, x: torch.Tensor, with_bias: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """wgrad: ``dA_r = dY_rᵀ · X`` over every token, and ``db_r = Σ dY_r``."""
    grad2d, x2d = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
    return grad2d.t().mm(x2d), grad2d.sum(0) if with_bias else None


class _ColumnParallelOverlapped(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, comm, sequence_parallel, overlap):
        if sequence_parallel:
            full, _ = _gather_sequence(x, comm, "tp.all_gather", async_op=False)
            x_full = _sequence_major(full)
        else:
            x_full = x
        ctx.save_for_backward(x, weight)  # with SP: only this rank's sequence shard
        ctx.comm, ctx.sequence_parallel, ctx.overlap = comm, sequence_parallel, overlap
        ctx.with_bias = bias is not None
        return F.linear(x_full, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        comm, sp, overlap = ctx.comm, ctx.sequence_parallel, ctx.overlap
        grad = grad.contiguous()
        gather = None
        if sp:  # wgrad needs the whole X again; dgrad does not
            full, gather = _gather_sequence(x, comm, REGATHER_NAME, async_op=True)
            if not overlap and gather is not None:
                gather.wait()
        with trace.span("tp.dgrad", kind="compute"):
            dgrad = grad.matmul(weight)
        if gather is not None:
            gather.wait()
        x_full = _sequence_major(full) if sp else x
        dx, reduction = launch_input_grad_reduction(dgrad, comm, sp)
        if not overlap and reduction is not None:
            reduction.wait()
        with trace.span("tp.wgrad", kind="compute"):
            dweight, dbias = weight_gradients(grad, x_full, ctx.with_bias)
        if reduction is not None:
            reduction.wait()
        return dx, dweight, dbias, None, None, None


def column_parallel_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    comm: Communicator,
    *,
    sequence_parallel: bool = False,
    backward_overlap: bool = True,
) -> torch.Tensor:
    """Enter the tensor-parallel region and apply this rank's column shard, Megatron-style.

    Forward: identity (``f``), or with ``sequence_parallel`` an all-gather of ``x``'s sequence
    shards, then ``x · weightᵀ + bias``. Backward: see the module docstring; with
    ``backward_overlap`` the input-gradient collective is waited for after the wgrad GEMM (and
    the SP re-gather after dgrad), without it right after its launch. The same gradients either
    way, bit for bit.
    """
    return _ColumnParallelOverlapped.apply(
        x, weight, bias, comm, sequence_parallel, backward_overlap
    )


def exposed_input_grad_seconds(
    tokens: int,
    d_in: int,
    d_out: int,
    t: int,
    link,
    flops_per_second: float,
    dtype_bytes: int = 2,
) -> float:
    """The model of what stays exposed of one column layer's backward all-reduce of ``dL/dX``.

    The ring all-reduce of ``tokens·d_in`` elements on ``t`` ranks over ``link``
    (:func:`dtlab.cost.collectives.collective_time`) runs under the layer's wgrad GEMM,
    ``2·tokens·d_in·d_out/t`` FLOPs at ``flops_per_second``; the rank waits only for the rest:
    ``max(0, all-reduce − wgrad)`` seconds. Without the overlap all of the all-reduce is exposed.
    """
    from dtlab.cost.collectives import collective_time

    comm = collective_time("all_reduce", "ring", tokens * d_in * dtype_bytes, t, link)
    wgrad = 2 * tokens * d_in * d_out / t / flops_per_second
    return max(0.0, comm - wgrad)
