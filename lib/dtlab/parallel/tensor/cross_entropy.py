"""Vocabulary-parallel cross-entropy: the loss from logits sharded by vocabulary, never gathered.

Shoeybi et al. 2019 (Megatron-LM, §3): after a column-parallel LM head, rank ``r`` holds
the logits ``z[..., r·V/t : (r+1)·V/t]``. Gathering them would move ``(t-1)/t · b·s·V``
elements per rank — for GPT-2's 50 257-token vocabulary, 65× a hidden state. The loss of
token ``i`` with target ``y`` needs only three numbers per token, each a reduction over the
vocabulary:

.. math::

    \\ell_i = \\log \\sum_v e^{z_{iv} - m_i} - (z_{iy} - m_i), \\qquad m_i = \\max_v z_{iv}

=================  ===========================================  ==============================
step               on each rank                                 communication (per rank)
=================  ===========================================  ==============================
max ``m``          max over its ``V/t`` logits                  all-reduce (max), b·s elements
sum of exp         ``Σ exp(z - m)`` over its logits             all-reduce (sum), b·s elements
target logit       ``z_y - m`` if it owns ``y``, else 0         all-reduce (sum), b·s elements
=================  ===========================================  ==============================

Three all-reduces of ``b·s`` elements, as Megatron's ``_VocabParallelCrossEntropy`` does (the
first with ``op=MAX``): ``3 · 2(t-1)/t · b·s`` elements per rank, whatever the vocabulary. ``m``
only keeps ``exp`` from overflowing — any value equal on every rank gives the same loss — so it
carries no gradient.

Backward needs no communication: ``∂ℓ_i/∂z_{iv} = softmax_{iv} − [v = y]`` for the rank's
own ``v``, and the softmax is ``exp(z - m) / Σ`` with the global sum already known. This module
saves the local softmax (the size of the local logits) for it.

Padding (``vocab_size`` smaller than the ``t`` shards' columns together, as
:func:`~dtlab.parallel.tensor.embedding.pad_vocab` leaves an indivisible vocabulary): the columns of token ids at or past ``vocab_size`` count as ``-inf`` — they add nothing to the
sum of ``exp``, their softmax and so their gradient are exactly zero — so the loss and every
gradient are those of the unpadded vocabulary. A rank whose columns are all padding takes part
in the three all-reduces with ``-inf`` and zeros.
"""

from __future__ import annotations

import torch

from dtlab.comm import Communicator


def _global_max(local_max: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Max over the group of ``local_max`` (any shape): one all-reduce with ``op="max"``."""
    out = local_max.contiguous().clone()
    comm.all_reduce(out, name=f"{comm.dim}.cross_entropy.max", op="max")
    return out


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, vocab_start, comm, vocab_size):
        if vocab_size is not None and vocab_start + logits.shape[-1] > vocab_size:
            logits = logits.clone()  # columns past the real vocabulary: left out of the loss
            logits[..., max(vocab_size - vocab_start, 0) :] = float("-inf")
        local_target = targets - vocab_start
        elsewhere = (local_target < 0) | (local_target >= logits.shape[-1])
        local_target = local_target.masked_fill(elsewhere, 0)

        shifted = logits - _global_max(logits.detach().amax(-1), comm).unsqueeze(-1)
        exp = shifted.exp()
        sum_exp = exp.sum(-1)
        comm.all_reduce(sum_exp, name=f"{comm.dim}.cross_entropy.sum_exp")
        target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1)
        target_logit = target_logit.masked_fill(elsewhere, 0.0)
        comm.all_reduce(target_logit, name=f"{comm.dim}.cross_entropy.target_logit")

        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local_target, elsewhere)
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_target, elsewhere = ctx.saved_tensors
        grad = softmax.clone()
        owned = (~elsewhere).to(grad.dtype)  # subtract the one-hot only where this rank owns y
        grad.scatter_add_(-1, local_target.unsqueeze(-1), -owned.unsqueeze(-1))
        return grad * grad_loss.unsqueeze(-1), None, None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    comm: Communicator,
    vocab_start: int | None = None,
    *,
    vocab_size: int | None = None,
) -> torch.Tensor:
    """Mean next-token cross-entropy from this rank's vocabulary shard of the logits.

    ``logits`` (..., V/t) — this rank's columns, starting at token id ``vocab_start`` (default
    ``rank · V/t``); ``targets`` (...) — full token ids, the same on every rank. Returns the
    same scalar on every rank: ``F.cross_entropy`` of the full logits, without gathering them.
    ``vocab_size``: the real vocabulary when the sharded one is padded (default: no padding);
    columns of ids at or past it are left out. 16-bit logits are upcast to fp32 first.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} disagree: logits "
            "are (..., vocab/t) and targets (...), one token id per logit row"
        )
    if vocab_start is None:
        vocab_start = comm.rank * logits.shape[-1]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return _VocabParallelCrossEntropy.apply(logits, targets, vocab_start, comm, vocab_size).mean()
