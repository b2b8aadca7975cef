"""The ``overlap.tp_backward_async`` grader passes the overlapped backward, written more than one
way, and fails the same numbers computed in the wrong order, a blocking all-reduce, and the
library's own answer."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dtlab.quiz import check_exercise

EXERCISE = "overlap.tp_backward_async"


def _wgrad(grad, x):
    return grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1])


class Overlapped(torch.autograd.Function):
    """The lab's answer: launch, wgrad, wait."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.save_for_backward(x, weight)
        ctx.group = group
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dx = grad @ weight
        handle = dist.all_reduce(dx, group=ctx.group, async_op=True)
        dweight, dbias = _wgrad(grad, x), grad.reshape(-1, grad.shape[-1]).sum(0)
        handle.wait()
        return dx, dweight, dbias, None


class OverlappedViaEinsum(torch.autograd.Function):
    """Another right answer: einsum for the GEMMs, the bias gradient first."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.save_for_backward(x, weight)
        ctx.group = group
        return torch.einsum("bsi,oi->bso", x, weight) + bias

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dx = torch.einsum("bso,oi->bsi", grad, weight).contiguous()
        work = dist.all_reduce(dx, group=ctx.group, async_op=True)
        dbias = grad.sum((0, 1))
        dweight = torch.einsum("bso,bsi->oi", grad, x)
        work.wait()
        return dx, dweight, dbias, None


class Blocking(Overlapped):
    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dx = grad @ weight
        dist.all_reduce(dx, group=ctx.group)
        return dx, _wgrad(grad, x), grad.reshape(-1, grad.shape[-1]).sum(0), None


class WaitedTooEarly(Overlapped):
    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dx = grad @ weight
        handle = dist.all_reduce(dx, group=ctx.group, async_op=True)
        handle.wait()
        return dx, _wgrad(grad, x), grad.reshape(-1, grad.shape[-1]).sum(0), None


class LaunchedLate(Overlapped):
    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dweight = _wgrad(grad, x)
        dx = grad @ weight
        handle = dist.all_reduce(dx, group=ctx.group, async_op=True)
        handle.wait()
        return dx, dweight, grad.reshape(-1, grad.shape[-1]).sum(0), None


class NeverReduced(Overlapped):
    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad @ weight, _wgrad(grad, x), grad.reshape(-1, grad.shape[-1]).sum(0), None


def overlapped(x, weight, bias, group):
    return Overlapped.apply(x, weight, bias, group)


def overlapped_einsum(x, weight, bias, group):
    return OverlappedViaEinsum.apply(x, weight, bias, group)


def blocking(x, weight, bias, group):
    return Blocking.apply(x, weight, bias, group)


def waited_too_early(x, weight, bias, group):
    return WaitedTooEarly.apply(x, weight, bias, group)


def launched_late(x, weight, bias, group):
    return LaunchedLate.apply(x, weight, bias, group)


def never_reduced(x, weight, bias, group):
    return NeverReduced.apply(x, weight, bias, group)


def library(x, weight, bias, group):
    from dtlab.comm import Communicator
    from dtlab.parallel.tensor import column_parallel_linear

    return column_parallel_linear(x, weight, bias, Communicator(group, dim="tp"))


def test_the_overlapped_backward_passes_written_two_ways(cluster2):
    for fn in (overlapped, overlapped_einsum):
        result = check_exercise(EXERCISE, fn, cluster2)
        assert result.passed, result.message
        assert "launch → wgrad GEMM → wait" in result.details["order"]


def test_a_blocking_all_reduce_fails_with_the_async_op_hint(cluster2):
    result = check_exercise(EXERCISE, blocking, cluster2)
    assert not result.passed and "async_op=True" in result.message


def test_waiting_before_the_weight_gradient_fails(cluster2):
    result = check_exercise(EXERCISE, waited_too_early, cluster2)
    assert not result.passed and "waited for before the weight-gradient" in result.message


def test_launching_after_the_weight_gradient_fails(cluster2):
    result = check_exercise(EXERCISE, launched_late, cluster2)
    assert not result.passed and "launched after the weight-gradient" in result.message


def test_a_backward_that_never_sums_dx_fails_on_the_values(cluster2):
    result = check_exercise(EXERCISE, never_reduced, cluster2)
    assert not result.passed and "dx differs" in result.message


def test_the_library_helper_is_refused(cluster2):
    result = check_exercise(EXERCISE, library, cluster2)
    assert not result.passed and "column_parallel_linear" in result.message
