"""Context parallelism applied to the lab GPT from outside: swap each block's attention core.

The model stays as it is. :func:`parallelize_context` checks the layout
(:func:`dtlab.mesh.validate_layout`) and sets every ``block.attn.core`` to a ring or Ulysses
core (or the all-gather-K/V one) over the CP communicator; :func:`shard_batch` hands each rank its tokens and their global
positions, which the model takes as ``model(tokens, positions=positions)`` — the position
embedding and the causal mask both read them. Everything outside attention is per-token, so it
needs no communication; each rank's loss is the mean over its own tokens, and since every rank
holds the same number, averaging the parameter gradients over the CP group
(:func:`average_gradients`) gives the gradient of the full-sequence loss.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from dtlab.comm import Communicator
from dtlab.mesh.layout_rules import CP_STYLES, validate_layout
from dtlab.parallel.context.allgather import allgather_core
from dtlab.parallel.context.ring import AttentionWork, ring_core
from dtlab.parallel.context.sharding import shard_sequence
from dtlab.parallel.context.ulysses import ulysses_core

# CP_STYLES, the styles the layout rules know, is this family's list of cores too: ``ring``
# (contiguous shards, ring attention), ``zigzag`` (head-tail shards, ring attention),
# ``ulysses`` (contiguous shards, all-to-all attention), ``allgather`` (contiguous shards, K/V
# all-gathered, Llama 3).


def _sharding_of(style: str) -> str:
    return "zigzag" if style == "zigzag" else "contiguous"


def parallelize_context(
    model: nn.Module, comm: Communicator, style: str = "zigzag", work: AttentionWork | None = None
) -> nn.Module:
    """Make ``model``'s attention context-parallel over ``comm`` (in place; returns it)."""
    if style not in CP_STYLES:
        raise ValueError(f"style={style!r}; choose one of {CP_STYLES}")
    validate_layout(model.config, cp=comm.world_size, cp_style=style)
    for block in model.blocks:
        if style == "ulysses":
            block.attn.core = ulysses_core(comm)
        elif style == "allgather":
            block.attn.core = allgather_core(comm)
        else:
            block.attn.core = ring_core(comm, work)
    return model


def shard_batch(
    tokens: torch.Tensor, targets: torch.Tensor, comm: Communicator, style: str = "zigzag"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's ``(tokens, targets, positions)`` of a (B, S) batch."""
    sharding = _sharding_of(style)
    local_tokens, positions = shard_sequence(tokens, comm.world_size, comm.rank, sharding, dim=1)
    local_targets, _ = shard_sequence(targets, comm.world_size, comm.rank, sharding, dim=1)
    return local_tokens, local_targets, positions


def average_gradients(model: nn.Module, comm: Communicator) -> None:
    """Average every parameter's gradient over the CP group (one all-reduce each)."""
    for param in model.parameters():
        if param.grad is not None:
            comm.all_reduce(param.grad, name="cp_grad")
            param.grad /= comm.world_size
