"""Normalising the loss across data-parallel ranks when ranks hold different numbers of tokens.

The loss a language model means is the mean over every *real* token of the global batch:
``L = (1/T) Σ_t ℓ_t`` with ``T = Σ_r n_r`` tokens over ``N`` ranks. Sequences differ in length
(padding masked out, packed batches cut at document ends, variable-length SFT examples), so
``n_r`` differs from rank to rank.

**The bug: per-rank means.** Each rank computes ``L_r = (1/n_r) Σ_{t∈r} ℓ_t`` and DDP averages
the gradients, so the step follows ``(1/N) Σ_r L_r``: a token on rank ``r`` weighs
``1/(N·n_r)`` instead of ``1/T``. Tokens on short ranks count more; with ``n = (1000, 3000)``
one of rank 0's tokens weighs three of rank 1's (:func:`token_weights`). The same bug appears
inside one rank across gradient-accumulation micro-batches (each micro-batch's mean, then
divided by the number of micro-batches) — the fix is the same: divide by the global count.

**The fix: all-reduce the token count first.** Each rank sums its token losses, the ranks
all-reduce ``n_r`` (one integer: ``2(N−1)/N · 8`` bytes per rank on a ring, nothing next to the
gradients), and each rank's loss is ``L_r = N · Σ_{t∈r} ℓ_t / T`` — the factor ``N`` because
DDP *averages* gradients over ``N`` ranks, so the averaged gradient is exactly
``(1/T) Σ_t ∇ℓ_t``, the single-process gradient over all tokens. (Megatron-LM does this for its
``calculate_per_token_loss`` option; Hugging Face's ``Trainer`` passes ``num_items_in_batch`` to
the loss for the same reason — the gradient-accumulation loss bug fixed in transformers 4.46.)

:func:`normalised_loss` is the one function: ``how="per_rank"`` (the bug) or ``how="global"``
(the fix); the count moves through the dp :class:`~dtlab.comm.Communicator`, so its bytes are
in ``comm_stats``. :func:`ddp_gradient` runs one backward of a linear per-token model under
:class:`~dtlab.parallel.data.NaiveDDP` on real ranks, for the test and lab 02.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from dtlab.comm import Communicator

HOW = ("per_rank", "global")


def token_weights(tokens_per_rank: Sequence[int], how: str) -> list[float]:
    """The weight one token on each rank gets in the loss the step follows:
    ``1/(N·n_r)`` for per-rank means, ``1/T`` for the global count."""
    if how not in HOW:
        raise ValueError(f"how={how!r}: choose 'per_rank' (the bug) or 'global' (the fix)")
    if not tokens_per_rank or any(n <= 0 for n in tokens_per_rank):
        raise ValueError(f"every rank needs at least one token, got {list(tokens_per_rank)}")
    n, total = len(tokens_per_rank), sum(tokens_per_rank)
    if how == "global":
        return [1 / total] * n
    return [1 / (n * t) for t in tokens_per_rank]


def token_weight_ratio(tokens_per_rank: Sequence[int]) -> float:
    """Under per-rank means, how many times more the most-favoured token weighs than the least:
    ``max n_r / min n_r``."""
    weights = token_weights(tokens_per_rank, "per_rank")
    return max(weights) / min(weights)


def token_overweight(tokens_per_rank: Sequence[int], rank: int) -> float:
    """How many times its right weight a token on ``rank`` gets under per-rank means:
    ``(1/(N·n_r)) / (1/T) = T / (N·n_r)`` (above 1 on short ranks, below on long ones)."""
    per_rank = token_weights(tokens_per_rank, "per_rank")[rank]
    return per_rank / token_weights(tokens_per_rank, "global")[rank]


def count_bytes_per_rank(world_size: int, count_bytes: int = 8) -> float:
    """Bytes one rank sends, on average over the ranks, to all-reduce the token count on a ring:
    ``2(N−1)/N · 8`` (the one element crosses ``N − 1`` links in each phase; it cannot split into
    ``N`` chunks, so single ranks send 0 or 8 bytes per phase)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return 2 * (world_size - 1) / world_size * count_bytes


def normalised_loss(
    loss_sum: torch.Tensor, n_tokens: int, comm: Communicator, how: str = "global"
) -> tuple[torch.Tensor, int]:
    """This rank's loss to call ``backward`` on, given the *sum* of its token losses, and the
    token count it was divided by (``n_r`` or ``T``).

    ``how="global"`` all-reduces the count (an int64, through ``comm``: counted) and returns
    ``N · loss_sum / T``, so DDP's gradient average is the mean over all ``T`` tokens.
    """
    if how not in HOW:
        raise ValueError(f"how={how!r}: choose 'per_rank' (the bug) or 'global' (the fix)")
    if how == "per_rank":
        return loss_sum / n_tokens, n_tokens
    count = torch.tensor([n_tokens], dtype=torch.int64, device=loss_sum.device)
    comm.all_reduce(count, name="token_count")
    total = int(count.item())
    if total == 0:
        raise ValueError("no rank has a token: the global batch is empty")
    return loss_sum * comm.world_size / total, total


def ddp_gradient(
    features: torch.Tensor,
    targets: torch.Tensor,
    how: str,
    collectives: str = "dtlab",
    seed: int = 0,
) -> dict:
    """One backward of a per-token linear model ``ℓ_t = (w·x_t − y_t)²`` on this rank's tokens
    under :class:`~dtlab.parallel.data.NaiveDDP`; returns the averaged gradient, the divisor and
    the bytes the count and the gradients moved (call on every rank; rank slices may differ in
    length)."""
    from dtlab.parallel.data.naive import NaiveDDP

    torch.manual_seed(seed)
    linear = nn.Linear(features.shape[-1], 1, bias=False).double().to(features.device)
    model = NaiveDDP(linear, collectives=collectives)
    model.comm_stats.reset()
    per_token = (model(features).squeeze(-1) - targets) ** 2
    loss, divisor = normalised_loss(per_token.sum(), len(targets), model.comm, how)
    count_bytes = model.comm_stats.bytes_sent
    loss.backward()
    model.finish_gradient_synchronization()
    return {
        "grad": model.module.weight.grad.detach().cpu().clone(),
        "divisor": divisor,
        "count_bytes": count_bytes,
        "gradient_bytes": model.comm_stats.bytes_sent - count_bytes,
    }


def single_process_gradient(features: torch.Tensor, targets: torch.Tensor, seed: int = 0):
    """The reference: the gradient of the mean over *all* tokens, in one process."""
    torch.manual_seed(seed)
    model = nn.Linear(features.shape[-1], 1, bias=False).double()
    ((model(features).squeeze(-1) - targets) ** 2).mean().backward()
    return model.weight.grad.detach().clone()
