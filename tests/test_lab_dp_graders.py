"""The lab 02/03 graders pass a right answer and fail each classic wrong one with a useful hint —
including answers with the right numbers that skip the skill (a bucket waited on inside its
hook, a ZeRO-1 step that all-reduces the gradient on dtlab's rings)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed import all_reduce as sum_everywhere

from dtlab.parallel.gradient_sync import all_gather, reduce_scatter
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


def reduce_bucket_async_then_wait_in_the_hook(params):
    """async_op=True on paper, blocking in fact: backward stalls until the bytes have moved."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, async_op=True).wait()
    flat.div_(dist.get_world_size())
    for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
        p.grad.copy_(g.view_as(p))
    return lambda: None


def reduce_bucket_by_all_gather(params):
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    everyone = flat.new_empty(dist.get_world_size() * flat.numel())
    all_gather_ = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    work = all_gather_(everyone, flat, async_op=True)

    def finish():
        work.wait()
        mean = everyone.view(dist.get_world_size(), -1).mean(0)
        for p, g in zip(params, mean.split([p.numel() for p in params]), strict=True):
            p.grad.copy_(g.view_as(p))

    return finish


def reduce_bucket_async_under_another_name(params):
    """Honest; the all-reduce was imported (before grading began) under another name."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    work = sum_everywhere(flat, async_op=True)

    def finish():
        work.wait()
        flat.div_(dist.get_world_size())
        for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.grad.copy_(g.view_as(p))

    return finish


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


def zero1_step_all_reducing_on_dtlab_rings(flat_params, flat_grad, shard, optimizer):
    """Right numbers, DDP's traffic: 2(N-1)/N·M for the gradient alone, then the all-gather."""
    from dtlab import collectives

    collectives.all_reduce(flat_grad)
    n, r = dist.get_world_size(), dist.get_rank()
    shard.grad = flat_grad.chunk(n)[r] / n
    optimizer.step()
    all_gather(flat_params, shard.detach())


def zero1_step_gathering_every_gradient(flat_params, flat_grad, shard, optimizer):
    n, r = dist.get_world_size(), dist.get_rank()
    everyone = flat_grad.new_empty(n * flat_grad.numel())
    all_gather(everyone, flat_grad)
    shard.grad = everyone.view(n, -1).sum(0).chunk(n)[r] / n
    optimizer.step()
    all_gather(flat_params, shard.detach())


def zero1_step_with_torch_collectives(flat_params, flat_grad, shard, optimizer):
    """Honest, on the backend's own reduce-scatter and all-gather (bytes by the ring convention)."""
    reduce_scatter_ = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    all_gather_ = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    grad_shard = torch.empty_like(shard)
    reduce_scatter_(grad_shard, flat_grad)
    shard.grad = grad_shard.div_(dist.get_world_size())
    optimizer.step()
    shard.grad = None
    all_gather_(flat_params, shard.detach())


# -- the graders, run on real ranks ------------------------------------------------------------
@pytest.mark.parametrize(
    ("exercise", "answer", "praise"),
    [
        ("data_parallel.bucketed_hook", reduce_bucket_async, "torch DDP"),
        ("data_parallel.bucketed_hook", reduce_bucket_async_under_another_name, "torch DDP"),
        ("zero.zero1_step", zero1_step, "sending 2(N-1)/N·M = "),
        ("zero.zero1_step", zero1_step_with_torch_collectives, "single-process"),
    ],
    ids=lambda v: getattr(v, "__name__", None) or "",
)
def test_grader_passes_the_reference_solution(cluster2, exercise, answer, praise):
    result = check_exercise(exercise, answer, cluster2, record=False)
    assert result, result.message
    assert praise in result.message


@pytest.mark.parametrize(
    ("exercise", "wrong_answer", "hint"),
    [
        (
            "data_parallel.bucketed_hook",
            reduce_bucket_without_averaging,
            "divide the sum by the world size",
        ),
        ("data_parallel.bucketed_hook", reduce_bucket_blocking, "async_op=True"),
        ("data_parallel.bucketed_hook", reduce_each_parameter, "ONE all-reduce"),
        (
            "data_parallel.bucketed_hook",
            reduce_bucket_returning_the_work,
            "return a function finish()",
        ),
        (
            "data_parallel.bucketed_hook",
            reduce_bucket_async_then_wait_in_the_hook,
            "wait for it in finish(), not in the hook",
        ),
        (
            "data_parallel.bucketed_hook",
            reduce_bucket_by_all_gather,
            "all_gather_into_tensor is not",
        ),
        ("zero.zero1_step", zero1_step_without_averaging, "divide by the world size"),
        ("zero.zero1_step", zero1_step_all_reducing_on_dtlab_rings, "ZeRO-1 sends exactly"),
        ("zero.zero1_step", zero1_step_gathering_every_gradient, "ZeRO-1 sends exactly"),
        ("zero.zero1_step", zero1_step_with_all_reduce, "reduce-scatter"),
        ("zero.zero1_step", zero1_step_that_never_gathers, "all-gather every rank's shard"),
    ],
    ids=lambda v: getattr(v, "__name__", None) or "",
)
def test_grader_fails_a_classic_mistake_with_its_hint(cluster2, exercise, wrong_answer, hint):
    result = check_exercise(exercise, wrong_answer, cluster2, record=False)
    assert not result
    assert hint in result.message


# -- data_parallel.token_normalised_loss ----------------------------------------------------------
def token_normalised_loss(loss_sum, n_tokens):
    count = torch.tensor([n_tokens], dtype=torch.int64, device=loss_sum.device)
    dist.all_reduce(count)
    return loss_sum * dist.get_world_size() / count.item()


def per_rank_mean(loss_sum, n_tokens):
    return loss_sum / n_tokens


def global_count_without_the_world_size(loss_sum, n_tokens):
    count = torch.tensor([n_tokens], dtype=torch.int64, device=loss_sum.device)
    dist.all_reduce(count)
    return loss_sum / count.item()


def hard_coded_total(loss_sum, n_tokens):
    return loss_sum * dist.get_world_size() / 17


def test_token_normalised_loss_passes_on_three_ranks(cluster3):
    result = check_exercise("data_parallel.token_normalised_loss", token_normalised_loss, cluster3)
    assert result.passed, result.message


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (per_rank_mean, "all-reduce n_tokens"),
        (global_count_without_the_world_size, "multiply by the world size"),
        (hard_coded_total, "all-reduce n_tokens"),
    ],
)
def test_token_normalised_loss_fails_each_classic_mistake_with_its_hint(cluster2, fn, hint):
    result = check_exercise("data_parallel.token_normalised_loss", fn, cluster2, record=False)
    assert not result.passed and hint in result.message, result.message
