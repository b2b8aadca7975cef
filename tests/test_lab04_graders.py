"""The lab 04 graders pass a right answer written more than one way, and fail each classic wrong
one with its hint — including answers with the right numbers that skip the skill: the library's
own layers, gathered weights or logits, a logit "gather" disguised as an all-reduce, an extra
collective in the pass that should move nothing."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from dtlab.quiz import check_exercise

COLUMN, ROW = "tensor_parallel.column_parallel_linear", "tensor_parallel.row_parallel_linear"
LOSS = "tensor_parallel.vocab_parallel_cross_entropy"


# -- Megatron's f and g, as the lab's solution writes them ----------------------------------------
class CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class AllReduceBothWays(torch.autograd.Function):
    """f and g fused by mistake: sums in forward and in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


# -- column-parallel ---------------------------------------------------------------------------
def column_parallel_linear(x, weight, bias, group):
    return F.linear(CopyToGroup.apply(x, group), weight, bias)


def column_with_a_hook_on_x(x, weight, bias, group):
    """Honest another way: f as a gradient hook that all-reduces dL/dx."""

    def summed(grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=group)
        return grad

    x = x.view_as(x)
    x.register_hook(summed)
    return F.linear(x, weight, bias)


def column_without_f(x, weight, bias, group):
    return F.linear(x, weight, bias)


def column_all_reducing_in_forward(x, weight, bias, group):
    return F.linear(AllReduceBothWays.apply(x, group), weight, bias)


def column_with_a_spare_forward_all_reduce(x, weight, bias, group):
    """Right numbers, and an all-reduce in forward that the column layer never needs."""
    check = x.detach().clone()
    dist.all_reduce(check, group=group)
    return F.linear(CopyToGroup.apply(x, group), weight, bias)


def column_from_the_library(x, weight, bias, group):
    from dtlab.comm import Communicator
    from dtlab.parallel.tensor import ColumnParallelLinear

    return ColumnParallelLinear(weight, bias, Communicator(group))(x)


def column_by_gathering_the_weight(x, weight, bias, group):
    n = dist.get_world_size(group)
    full_w = weight.new_empty(n * weight.shape[0], weight.shape[1])
    dist.all_gather_into_tensor(full_w, weight.detach(), group=group)
    out = F.linear(x, full_w)
    return out.chunk(n, -1)[dist.get_rank(group)] + bias


# -- row-parallel ------------------------------------------------------------------------------
def row_parallel_linear(x, weight, bias, group):
    return ReduceFromGroup.apply(F.linear(x, weight), group) + bias


def row_with_a_plain_all_reduce(x, weight, bias, group):
    """Honest: g's backward is the identity, so an all-reduce autograd cannot see is right here."""
    partial = F.linear(x, weight)
    dist.all_reduce(partial, group=group)
    return partial + bias


def row_adding_the_bias_before_the_sum(x, weight, bias, group):
    return ReduceFromGroup.apply(F.linear(x, weight, bias), group)


def row_without_g(x, weight, bias, group):
    return F.linear(x, weight) + bias


def row_all_reducing_both_ways(x, weight, bias, group):
    return AllReduceBothWays.apply(F.linear(x, weight), group) + bias


def row_from_the_library(x, weight, bias, group):
    from dtlab.comm import Communicator, reduce_from_group

    return reduce_from_group(F.linear(x, weight), Communicator(group)) + bias


def row_by_gathering_the_input(x, weight, bias, group):
    n = dist.get_world_size(group)
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.detach(), group=group)
    return F.linear(x, weight) + bias + 0 * torch.cat(parts, -1).sum()


# -- vocabulary-parallel cross-entropy ---------------------------------------------------------
class VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, vocab_start, group):
        local = targets - vocab_start
        mine = (local >= 0) & (local < logits.shape[-1])
        local = local.masked_fill(~mine, 0)
        token_max = logits.amax(-1)
        dist.all_reduce(token_max, op=dist.ReduceOp.MAX, group=group)
        exp = (logits - token_max.unsqueeze(-1)).exp()
        sum_exp = exp.sum(-1)
        dist.all_reduce(sum_exp, group=group)
        target = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1) - token_max
        target = target.masked_fill(~mine, 0.0)
        dist.all_reduce(target, group=group)
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), local, mine)
        return sum_exp.log() - target

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local, mine = ctx.saved_tensors
        grad = softmax.scatter_add(-1, local.unsqueeze(-1), -mine.to(softmax.dtype).unsqueeze(-1))
        return grad * grad_loss.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits, targets, vocab_start, group):
    return VocabParallelCrossEntropy.apply(logits, targets, vocab_start, group).mean()


def loss_with_detached_corrections(logits, targets, vocab_start, group):
    """Honest without an autograd.Function: global values carried in by .detach() corrections."""
    local = targets - vocab_start
    mine = (local >= 0) & (local < logits.shape[-1])
    token_max = logits.detach().amax(-1)
    dist.all_reduce(token_max, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - token_max.unsqueeze(-1)
    local_sum = shifted.exp().sum(-1)
    total = local_sum.detach().clone()
    dist.all_reduce(total, group=group)
    local_sum = local_sum + (total - local_sum).detach()
    picked = shifted.gather(-1, local.masked_fill(~mine, 0).unsqueeze(-1)).squeeze(-1)
    picked = picked * mine
    target = picked.detach().clone()
    dist.all_reduce(target, group=group)
    picked = picked + (target - picked).detach()
    return (local_sum.log() - picked).mean()


def loss_gathering_the_logits(logits, targets, vocab_start, group):
    n = dist.get_world_size(group)
    parts = [torch.empty_like(logits) for _ in range(n)]
    dist.all_gather(parts, logits.detach(), group=group)
    return F.cross_entropy(torch.cat(parts, -1), targets) + 0 * logits.sum()


def loss_gathering_the_logits_by_all_reduce(logits, targets, vocab_start, group):
    """Every rank writes its slice into zeros and all-reduces: the full logits, by another name."""
    n = dist.get_world_size(group)
    full = logits.new_zeros(logits.shape[0], n * logits.shape[1])
    full[:, vocab_start : vocab_start + logits.shape[1]] = logits.detach()
    dist.all_reduce(full, group=group)
    full[:, vocab_start : vocab_start + logits.shape[1]] = logits  # keep this rank's gradient path
    return F.cross_entropy(full, targets)


def loss_without_the_max(logits, targets, vocab_start, group):
    local = targets - vocab_start
    mine = (local >= 0) & (local < logits.shape[-1])
    sum_exp = logits.detach().exp().sum(-1)
    dist.all_reduce(sum_exp, group=group)
    target = logits.detach().gather(-1, local.masked_fill(~mine, 0).unsqueeze(-1)).squeeze(-1)
    target = target * mine
    dist.all_reduce(target, group=group)
    return (sum_exp.log() - target).mean().requires_grad_()


def loss_on_the_local_slice(logits, targets, vocab_start, group):
    local = (targets - vocab_start).clamp(0, logits.shape[-1] - 1)
    return F.cross_entropy(logits, local)


def loss_from_the_library(logits, targets, vocab_start, group):
    from dtlab.comm import Communicator
    from dtlab.parallel.tensor import vocab_parallel_cross_entropy as library_loss

    return library_loss(logits, targets, Communicator(group), vocab_start)


def loss_with_plain_all_reduces(logits, targets, vocab_start, group):
    """Honest: autograd passes an in-place all-reduce's gradient straight through, which is what
    the sum of exp and the target logit need (every rank's loss is the same number)."""
    local = targets - vocab_start
    mine = (local >= 0) & (local < logits.shape[-1])
    token_max = logits.detach().amax(-1)
    dist.all_reduce(token_max, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - token_max.unsqueeze(-1)
    sum_exp = shifted.exp().sum(-1)
    dist.all_reduce(sum_exp, group=group)
    picked = shifted.gather(-1, local.masked_fill(~mine, 0).unsqueeze(-1)).squeeze(-1) * mine
    dist.all_reduce(picked, group=group)
    return (sum_exp.log() - picked).mean()


def loss_with_differentiable_all_reduces(logits, targets, vocab_start, group):
    """Right loss, gradient t times too large: torch.distributed.nn's all-reduce sums the
    gradients in backward, as if each rank's copy of the loss were a different loss."""
    from torch.distributed.nn.functional import all_reduce

    local = targets - vocab_start
    mine = (local >= 0) & (local < logits.shape[-1])
    token_max = logits.detach().amax(-1)
    dist.all_reduce(token_max, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - token_max.unsqueeze(-1)
    sum_exp = all_reduce(shifted.exp().sum(-1), group=group)
    picked = shifted.gather(-1, local.masked_fill(~mine, 0).unsqueeze(-1)).squeeze(-1) * mine
    return (sum_exp.log() - all_reduce(picked, group=group)).mean()


def loss_all_reducing_in_backward(logits, targets, vocab_start, group):
    """Right loss and gradient, and a backward all-reduce the loss never needs."""

    def checked(grad):
        total = grad.sum().reshape(1)
        dist.all_reduce(total, group=group)
        return grad

    logits = logits.view_as(logits)
    logits.register_hook(checked)
    return VocabParallelCrossEntropy.apply(logits, targets, vocab_start, group).mean()


# -- the graders, on real ranks ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("exercise", "answer", "praise"),
    [
        (COLUMN, column_parallel_linear, "backward all-reduced dL/dx once"),
        (COLUMN, column_with_a_hook_on_x, "backward all-reduced dL/dx once"),
        (ROW, row_parallel_linear, "one all-reduce of the partial products"),
        (ROW, row_with_a_plain_all_reduce, "one all-reduce of the partial products"),
        (LOSS, vocab_parallel_cross_entropy, "equals F.cross_entropy of the full logits"),
        (LOSS, loss_with_detached_corrections, "equals F.cross_entropy of the full logits"),
        (LOSS, loss_with_plain_all_reduces, "equals F.cross_entropy of the full logits"),
    ],
    ids=lambda v: getattr(v, "__name__", None) or "",
)
def test_lab04_grader_passes_a_right_answer(cluster2, exercise, answer, praise):
    result = check_exercise(exercise, answer, cluster2, record=False)
    assert result, result.message
    assert praise in result.message


@pytest.mark.parametrize(
    ("exercise", "wrong_answer", "hint"),
    [
        (COLUMN, column_without_f, "f must all-reduce the gradient in backward"),
        (COLUMN, column_all_reducing_in_forward, "needs no communication at all"),
        (
            COLUMN,
            column_with_a_spare_forward_all_reduce,
            "the column-parallel forward moves nothing",
        ),
        (COLUMN, column_from_the_library, "calls dtlab.parallel.tensor.ColumnParallelLinear"),
        (COLUMN, column_by_gathering_the_weight, "all_gather_into_tensor is not allowed"),
        (ROW, row_adding_the_bias_before_the_sum, "add it once, after g's all-reduce"),
        (ROW, row_without_g, "g must all-reduce (sum) the partial products"),
        (ROW, row_all_reducing_both_ways, "g's backward is the identity"),
        (ROW, row_from_the_library, "calls dtlab.comm.reduce_from_group"),
        (ROW, row_by_gathering_the_input, "dist.all_gather is not allowed"),
        (LOSS, loss_gathering_the_logits, "dist.all_gather is not allowed"),
        (LOSS, loss_gathering_the_logits_by_all_reduce, "must not depend on the vocabulary"),
        (LOSS, loss_without_the_max, "subtract each TOKEN's max"),
        (LOSS, loss_on_the_local_slice, "but F.cross_entropy of the full logits is"),
        (LOSS, loss_from_the_library, "calls dtlab.parallel.tensor.vocab_parallel_cross_entropy"),
        (LOSS, loss_with_differentiable_all_reduces, "dL/dlogits is off"),
        (LOSS, loss_all_reducing_in_backward, "backward moves nothing"),
    ],
    ids=lambda v: getattr(v, "__name__", None) or "",
)
def test_lab04_grader_fails_a_classic_mistake_with_its_hint(cluster2, exercise, wrong_answer, hint):
    result = check_exercise(exercise, wrong_answer, cluster2, record=False)
    assert not result, f"{wrong_answer.__name__} passed {exercise}"
    assert hint in result.message, result.message
