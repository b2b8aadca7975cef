"""Activation memory: what the forward pass keeps for backward, and four ways to hold less (lab 09).

Activations grow with batch and sequence length while parameters do not, so at scale they are
the bill ZeRO does not touch. Read the files in this order:

1. :mod:`~dtlab.parallel.activations.recomputation` — :func:`recompute` and :class:`Recomputed`,
   full recomputation written from scratch (keep a region's inputs, re-run it in backward: one
   more forward, +33 % FLOPs), and :func:`recompute_attention_core`, Megatron's selective
   recomputation (drop the s²-sized attention tensors, re-run two matmuls).
2. :mod:`~dtlab.parallel.activations.op_level_checkpointing` — :func:`checkpoint_saving_matmuls`:
   PyTorch's op-level selective checkpointing, which saves matmul outputs and recomputes the
   pointwise ops, beside Megatron's region-level choice.
3. :mod:`~dtlab.parallel.activations.offload` — :class:`OffloadActivations`: every saved tensor
   copied to host memory in forward and back in backward (2× the saved bytes over the host link).
4. :mod:`~dtlab.parallel.activations.gradient_accumulation` — :func:`accumulate_gradients`: K
   micro-batches, one optimizer step; activations of one micro-batch at a time, and what each
   data-parallel wrapper sends (``no_sync`` or not) for the K backwards.

Papers: Chen et al., "Training Deep Nets with Sublinear Memory Cost" (2016); Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models" (2022); Ren et al., ZeRO-Offload
(USENIX ATC 2021) for the host-memory idea; Li et al., VLDB 2020, §3.2.4 for ``no_sync``.
"""

from dtlab.parallel.activations.gradient_accumulation import (
    AccumulationStep,
    accumulate_gradients,
    split_batch,
)
from dtlab.parallel.activations.offload import OffloadActivations, OffloadStats
from dtlab.parallel.activations.op_level_checkpointing import (
    checkpoint_saving_matmuls,
    has_op_level_sac,
    save_matmuls_policy,
)
from dtlab.parallel.activations.recomputation import (
    RECOMPUTE_MODES,
    Recomputed,
    plain_attention_core,
    recompute,
    recompute_attention_core,
)

__all__ = [
    "RECOMPUTE_MODES",
    "AccumulationStep",
    "OffloadActivations",
    "OffloadStats",
    "Recomputed",
    "accumulate_gradients",
    "checkpoint_saving_matmuls",
    "has_op_level_sac",
    "plain_attention_core",
    "recompute",
    "recompute_attention_core",
    "save_matmuls_policy",
    "split_batch",
]
