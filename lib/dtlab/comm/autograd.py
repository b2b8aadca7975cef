"""Collectives as autograd functions: what a parallel layer calls in forward, and what its
backward then runs by itself.

Megatron-LM (Shoeybi et al., 2019, §3) pairs two conjugate operators around every tensor-parallel
region of ``t`` ranks:

=======================  ================================  ================================
function                 forward                           backward
=======================  ================================  ================================
``copy_to_group`` (f)    identity                          all-reduce the gradient
``reduce_from_group``    all-reduce (sum)                  identity
(g)
``gather_along``         all-gather along ``dim``          reduce-scatter along ``dim``
``reduce_scatter_along`` reduce-scatter along ``dim``      all-gather along ``dim``
``all_to_all_rows``      all-to-all of dim-0 rows          the inverse all-to-all
``slice_along``          keep this rank's slice of ``dim``  all-gather along ``dim``
``gather_slices_along``  all-gather along ``dim``           keep this rank's slice of ``dim``
=======================  ================================  ================================

Sequence parallelism (Korthikanti et al., 2022) replaces ``f``/``g`` with ``gather_along`` /
``reduce_scatter_along`` on the sequence dimension: the same bytes (an all-reduce *is* a
reduce-scatter then an all-gather), but activations outside the region are ``1/t`` as large.
Expert parallelism and Ulysses move tokens with ``all_to_all_rows``. Bytes per rank for a
``M``-byte full tensor: all-reduce ``2(t-1)/t·M``, all-gather and reduce-scatter ``(t-1)/t·M``.

Every collective runs through the :class:`~dtlab.comm.Communicator` passed in, so it is counted
and traced with its group like any other.
"""

from __future__ import annotations

import torch

from dtlab.comm.communicator import Communicator


def _check_divisible(x: torch.Tensor, dim: int, comm: Communicator) -> None:
    if x.shape[dim] % comm.world_size:
        raise ValueError(
            f"dimension {dim} has {x.shape[dim]} elements, which the {comm.world_size}-rank "
            f"{comm.dim} group cannot split evenly; make it a multiple of {comm.world_size}"
        )


def _all_gather_dim(x: torch.Tensor, dim: int, comm: Communicator) -> torch.Tensor:
    moved = x.movedim(dim, 0).contiguous()
    full = moved.new_empty((comm.world_size * moved.shape[0], *moved.shape[1:]))
    comm.all_gather(full.view(-1), moved.view(-1), name=f"{comm.dim}.all_gather")
    return full.movedim(0, dim)


def _reduce_scatter_dim(x: torch.Tensor, dim: int, comm: Communicator) -> torch.Tensor:
    _check_divisible(x, dim, comm)
    moved = x.movedim(dim, 0).contiguous()
    shard = moved.new_empty((moved.shape[0] // comm.world_size, *moved.shape[1:]))
    comm.reduce_scatter(shard.view(-1), moved.view(-1), name=f"{comm.dim}.reduce_scatter")
    return shard.movedim(0, dim)


def _all_reduce(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    out = x.contiguous().clone()
    comm.all_reduce(out, name=f"{comm.dim}.all_reduce")
    return out


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.comm), None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        return _all_reduce(x, comm)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherAlong(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, comm):
        ctx.dim, ctx.comm = dim, comm
        return _all_gather_dim(x, dim, comm)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_dim(grad, ctx.dim, ctx.comm), None, None


class _ReduceScatterAlong(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, comm):
        ctx.dim, ctx.comm = dim, comm
        return _reduce_scatter_dim(x, dim, comm)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_dim(grad, ctx.dim, ctx.comm), None, None


class _SliceAlong(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, comm):
        _check_divisible(x, dim, comm)
        ctx.dim, ctx.comm = dim, comm
        return x.chunk(comm.world_size, dim)[comm.rank].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_dim(grad, ctx.dim, ctx.comm), None, None


class _GatherSlicesAlong(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, comm):
        ctx.dim, ctx.comm = dim, comm
        return _all_gather_dim(x, dim, comm)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.comm.world_size, ctx.dim)[ctx.comm.rank].contiguous(), None, None


class _AllToAllRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, output_splits, input_splits):
        ctx.comm, ctx.splits = comm, (output_splits, input_splits)
        rows = sum(output_splits) if output_splits is not None else x.shape[0]
        out = x.new_empty((rows, *x.shape[1:]))
        comm.all_to_all(out, x.contiguous(), output_splits, input_splits, f"{comm.dim}.all_to_all")
        return out

    @staticmethod
    def backward(ctx, grad):
        output_splits, input_splits = ctx.splits
        rows = sum(input_splits) if input_splits is not None else grad.shape[0]
        out = grad.new_empty((rows, *grad.shape[1:]))
        ctx.comm.all_to_all(
            out, grad.contiguous(), input_splits, output_splits, f"{ctx.comm.dim}.all_to_all"
        )
        return out, None, None, None


def copy_to_group(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Megatron's ``f``: enter a parallel region (identity); its gradient is all-reduced."""
    return _CopyToGroup.apply(x, comm)


def reduce_from_group(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Megatron's ``g``: leave a parallel region by summing the partial results (all-reduce)."""
    return _ReduceFromGroup.apply(x, comm)


def gather_along(x: torch.Tensor, dim: int, comm: Communicator) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` (rank order); backward reduce-scatters."""
    return _GatherAlong.apply(x, dim % x.dim(), comm)


def reduce_scatter_along(x: torch.Tensor, dim: int, comm: Communicator) -> torch.Tensor:
    """Sum ``x`` over ranks and keep this rank's ``1/N`` slice of ``dim``; backward all-gathers."""
    return _ReduceScatterAlong.apply(x, dim % x.dim(), comm)


def all_to_all_rows(
    x: torch.Tensor,
    comm: Communicator,
    output_splits: list[int] | None = None,
    input_splits: list[int] | None = None,
) -> torch.Tensor:
    """Send ``input_splits[j]`` rows of ``x`` to rank j, receive ``output_splits[j]`` from it.

    Splits are Python ints (``counts.tolist()``); without them rows split evenly. The backward
    is the same exchange with the splits swapped, so each gradient row goes home.
    """
    return _AllToAllRows.apply(x, comm, output_splits, input_splits)


def slice_along(x: torch.Tensor, dim: int, comm: Communicator) -> torch.Tensor:
    """This rank's ``1/N`` slice of a tensor every rank holds whole (no message); backward
    all-gathers the slices' gradients. The pair of :func:`gather_slices_along`: work split over
    ranks that hold the same input (each TP rank routes its own slice of the tokens)."""
    return _SliceAlong.apply(x, dim % x.dim(), comm)


def gather_slices_along(x: torch.Tensor, dim: int, comm: Communicator) -> torch.Tensor:
    """All-gather the ranks' slices along ``dim``; backward keeps this rank's slice of a gradient
    that is the same on every rank (unlike :func:`gather_along`, whose gradient is a partial sum
    to reduce-scatter)."""
    return _GatherSlicesAlong.apply(x, dim % x.dim(), comm)
