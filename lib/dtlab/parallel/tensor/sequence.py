"""Sequence parallelism's other half: the replicated parameters that now see only a shard.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", §4.2.2).
Outside the tensor-parallel regions — LayerNorms, dropout, residual adds — every rank used to
hold the whole ``(b, s, h)`` activation and do the same work. Sequence parallelism cuts those
activations along the sequence: rank ``r`` keeps tokens ``[r·s/t, (r+1)·s/t)``, so their memory
and work are divided by ``t``. Entering a region all-gathers the sequence, leaving it
reduce-scatters (:func:`~dtlab.parallel.tensor.layers.enter_region` / ``leave_region``).

What the sequence cut costs: a parameter applied outside the regions (LayerNorm scale and shift,
a row-parallel layer's bias, the learned positions of this rank's tokens) is replicated, but each
rank's gradient now sums over *its* tokens only — a partial sum. Summed over the group it is the
full gradient, so after backward :func:`all_reduce_partial_grads` all-reduces those gradients
(one flat buffer, Megatron's ``finalize_model_grads`` does the same) before the optimizer step.
Without sequence parallelism every rank sees every token and the gradients are already whole.

:class:`SequenceShardedPositions` is the learned position table on the sequence shards: the
embedding's reduce-scatter hands rank ``r`` sequence chunk ``r``, so its positions must be those
of chunk ``r`` too.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtlab.comm import Communicator
from dtlab.parallel.tensor.layers import RowParallelLinear


class SequenceShardedPositions(nn.Module):
    """``pos_embed(positions)`` for this rank's sequence chunk only (the table is replicated).

    Not sharded: ``weight`` is the full position table, the same Parameter the model had. Its
    gradient covers only this rank's positions — a partial sum, completed by
    :func:`all_reduce_partial_grads`.
    """

    def __init__(self, weight: nn.Parameter, comm: Communicator) -> None:
        super().__init__()
        self.weight, self.comm = weight, comm

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        seq, t = positions.shape[-1], self.comm.world_size
        if seq % t:
            raise ValueError(
                f"sequence parallelism splits {seq} tokens over {t} ranks; feed sequences "
                f"whose length is a multiple of {t}"
            )
        mine = positions.chunk(t, dim=-1)[self.comm.rank]
        return F.embedding(mine, self.weight)


def partial_grad_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The replicated parameters whose gradients are partial under sequence parallelism: every
    LayerNorm's, each row-parallel layer's bias, and a :class:`SequenceShardedPositions` table."""
    found: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, nn.LayerNorm | SequenceShardedPositions):
            params = list(module.parameters(recurse=False))
        elif isinstance(module, RowParallelLinear) and module.bias is not None:
            params = [module.bias]
        else:
            continue
        found.update((id(p), p) for p in params if p.requires_grad)
    return list(found.values())


def all_reduce_partial_grads(params: Iterable[nn.Parameter], comm: Communicator) -> None:
    """Sum the gradients of ``params`` over the tensor-parallel group, in one all-reduce of a
    flat buffer (``2(t-1)/t`` times its bytes per rank). Parameters without a gradient are
    skipped — the same ones on every rank, since every rank runs the same graph."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    comm.all_reduce(flat, name=f"{comm.dim}.sequence_parallel_grads")
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
