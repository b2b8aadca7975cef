"""The lab 02/03 graders pass a right answer and fail each classic wrong one with a useful hint."""

from __future__ import annotations

import torch
import torch.distributed as dist

from dtlab.parallel.ddp_common import all_gather, reduce_scatter
from dtlab.quiz import check_exercise


# -- data_parallel.bucketed_hook ----------------------------------------------------------------
def reduce_bucket_async(params):
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    work = dist.all_reduce(flat, async_op=True)

    def finish():
        work.wait()
        flat.div_(dist.get_world_size())
        for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.grad.copy_(g.view_as(p))

    return finish


def reduce_bucket_without_averaging(params):
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    work = dist.all_reduce(flat, async_op=True)

    def finish():
        work.wait()
        for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.grad.copy_(g.view_as(p))

    return finish


def reduce_bucket_blocking(params):
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    flat.div_(dist.get_world_size())
    for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
        p.grad.copy_(g.view_as(p))
    return lambda: None


def reduce_each_parameter(params):
    works = [dist.all_reduce(p.grad, async_op=True) for p in params]

    def finish():
        for p, w in zip(params, works, strict=True):
            w.wait()
            p.grad.div_(dist.get_world_size())

    return finish


def reduce_bucket_returning_the_work(params):
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    return dist.all_reduce(flat, async_op=True)


def test_bucketed_hook_grader_passes_the_reference_solution(cluster2):
    result = check_exercise(
        "data_parallel.bucketed_hook", reduce_bucket_async, cluster2, record=False
    )
    assert result, result.message
    assert "torch DDP" in result.message


def test_bucketed_hook_grader_fails_a_sum_that_is_never_averaged(cluster2):
    result = check_exercise(
        "data_parallel.bucketed_hook", reduce_bucket_without_averaging, cluster2, record=False
    )
    assert not result
    assert "divide the sum by the world size" in result.message


def test_bucketed_hook_grader_fails_a_blocking_all_reduce(cluster2):
    result = check_exercise(
        "data_parallel.bucketed_hook", reduce_bucket_blocking, cluster2, record=False
    )
    assert not result
    assert "async_op=True" in result.message


def test_bucketed_hook_grader_fails_one_all_reduce_per_parameter(cluster2):
    result = check_exercise(
        "data_parallel.bucketed_hook", reduce_each_parameter, cluster2, record=False
    )
    assert not result
    assert "ONE all-reduce" in result.message


def test_bucketed_hook_grader_asks_for_a_finish_function(cluster2):
    result = check_exercise(
        "data_parallel.bucketed_hook", reduce_bucket_returning_the_work, cluster2, record=False
    )
    assert not result
    assert "return a function finish()" in result.message


# -- zero.zero1_step ----------------------------------------------------------------------------
def zero1_step(flat_params, flat_grad, shard, optimizer):
    grad_shard = torch.empty_like(shard)
    reduce_scatter(grad_shard, flat_grad)
    shard.grad = grad_shard.div_(dist.get_world_size())
    optimizer.step()
    shard.grad = None
    all_gather(flat_params, shard.detach())


def zero1_step_without_averaging(flat_params, flat_grad, shard, optimizer):
    grad_shard = torch.empty_like(shard)
    reduce_scatter(grad_shard, flat_grad)
    shard.grad = grad_shard
    optimizer.step()
    all_gather(flat_params, shard.detach())


def zero1_step_with_all_reduce(flat_params, flat_grad, shard, optimizer):
    dist.all_reduce(flat_grad)
    n, r = dist.get_world_size(), dist.get_rank()
    shard.grad = flat_grad.chunk(n)[r] / n
    optimizer.step()
    all_gather(flat_params, shard.detach())


def zero1_step_that_never_gathers(flat_params, flat_grad, shard, optimizer):
    grad_shard = torch.empty_like(shard)
    reduce_scatter(grad_shard, flat_grad)
    shard.grad = grad_shard.div_(dist.get_world_size())
    optimizer.step()


def test_zero1_grader_passes_the_reference_solution(cluster2):
    result = check_exercise("zero.zero1_step", zero1_step, cluster2, record=False)
    assert result, result.message
    assert "single-process" in result.message


def test_zero1_grader_fails_a_gradient_that_is_never_averaged(cluster2):
    result = check_exercise("zero.zero1_step", zero1_step_without_averaging, cluster2, record=False)
    assert not result
    assert "divide by the world size" in result.message


def test_zero1_grader_refuses_an_all_reduce(cluster2):
    result = check_exercise("zero.zero1_step", zero1_step_with_all_reduce, cluster2, record=False)
    assert not result
    assert "reduce-scatter" in result.message


def test_zero1_grader_fails_when_other_shards_are_never_gathered(cluster2):
    result = check_exercise(
        "zero.zero1_step", zero1_step_that_never_gathers, cluster2, record=False
    )
    assert not result
    assert "all-gather every rank's shard" in result.message
