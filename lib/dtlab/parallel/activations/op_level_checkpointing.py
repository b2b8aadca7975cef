"""PyTorch's op-level selective checkpointing, beside Megatron's region-level selective recompute.

Megatron (Korthikanti et al. 2022) picks a *region* to recompute — the attention core — because
its tensors are ``a·s²·b``-sized but cheap
(:func:`~dtlab.parallel.activations.recomputation.recompute_attention_core`).
PyTorch's selective activation checkpointing (``torch.utils.checkpoint`` with
``context_fn=create_selective_checkpoint_contexts(policy)``, torch ≥ 2.4) picks *ops*: a policy
sees every aten op of a checkpointed region and answers save or recompute. The classic policy
(torchtitan's "op" SAC) saves the outputs of matmuls — the FLOP-heavy ops — and recomputes the
pointwise ones (GELU, LayerNorm, softmax, dropout, adds), which cost bandwidth, not FLOPs.

What that keeps, per block of the lab GPT: every matmul output (q, k, v, the raw scores
``q·kᵀ``, ``weights·v``, out_proj, fc_in, fc_out) plus the region's input — one of the three
``s²``-sized tensors (softmax output, dropout mask and output go), and few of the linear-in-``s``
ones. Op-level SAC never re-runs a matmul; Megatron's selective drops every ``s²`` tensor and
re-runs two. The lab measures both with the allocator (the tensors SAC keeps live in
checkpoint's own cache, out of the saved-tensor hooks' sight).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint

__all__ = ["MATMUL_OPS", "save_matmuls_policy", "checkpoint_saving_matmuls", "has_op_level_sac"]

MATMUL_OPS = frozenset(
    {
        torch.ops.aten.mm.default,
        torch.ops.aten.bmm.default,
        torch.ops.aten.addmm.default,
        torch.ops.aten.baddbmm.default,
    }
)
"""The ops whose outputs the policy saves (everything else is recomputed)."""


def has_op_level_sac() -> bool:
    """Whether this torch build has selective activation checkpointing (torch ≥ 2.4)."""
    return hasattr(torch_checkpoint, "create_selective_checkpoint_contexts") and hasattr(
        torch_checkpoint, "CheckpointPolicy"
    )


def save_matmuls_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any):
    """Save matmul outputs, recompute everything else (a ``CheckpointPolicy`` per op)."""
    policy = torch_checkpoint.CheckpointPolicy
    return policy.MUST_SAVE if op in MATMUL_OPS else policy.PREFER_RECOMPUTE


def checkpoint_saving_matmuls(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` under torch's non-reentrant checkpoint with the matmul policy."""
    if not has_op_level_sac():
        raise RuntimeError(
            f"torch {torch.__version__} lacks create_selective_checkpoint_contexts; "
            "op-level selective checkpointing needs torch >= 2.4"
        )
    context_fn = functools.partial(
        torch_checkpoint.create_selective_checkpoint_contexts, save_matmuls_policy
    )
    return torch_checkpoint.checkpoint(
        fn, *args, use_reentrant=False, context_fn=context_fn, **kwargs
    )
