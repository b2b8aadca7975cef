"""Parallelism strategies applied to a model from outside, one subpackage per family.

Data parallel (:mod:`dtlab.parallel.data`, lab 02): :class:`NaiveDDP` → :class:`OverlappedDDP` →
:class:`BucketedDDP`, each a small diff on the last; :func:`straggle` and :func:`run_async_sgd`
show what synchronisation costs and buys.

ZeRO and FSDP (:mod:`dtlab.parallel.zero`, lab 03): :class:`ZeroOptimizer` (stages 1 and 2, a
``torch.optim.Optimizer`` that wraps any torch optimizer), :class:`FullyShardedDataParallel`
(stage 3, drops into a plain torch training loop), with :class:`MixedPrecision` (per unit:
:func:`norms_in_fp32`), CPU offload, global-norm clipping and :func:`gather_full_parameters`.
What DDP and ZeRO/FSDP share (the start-up broadcast, the end-of-backward queue,
the bucketing rule) is the one module beside the families, :mod:`dtlab.parallel.gradient_sync`.

Tensor and sequence parallel (lab 04): :func:`parallelize_gpt` shards the lab GPT Megatron-style
(:mod:`dtlab.parallel.tensor`): column/row-parallel linears with f/g, heads split across ranks
(GQA-aware), a vocabulary-parallel embedding and cross-entropy that never gathers the logits, and
LayerNorm/dropout on sequence shards.

Pipeline parallel (:mod:`dtlab.parallel.pipeline`): schedules as data (GPipe, 1F1B, interleaved,
ZB-H1, DualPipeV), a validator, a simulator of timeline, bubble and in-flight activations, and
:func:`pipeline_gpt`, which executes the same schedule on real ranks.

Context parallel (:mod:`dtlab.parallel.context`): blockwise attention with an online softmax,
ring attention (contiguous or zig-zag), Ulysses and all-gather K/V, plugged into the lab GPT's
attention core by :func:`parallelize_context`.

Activation memory (:mod:`dtlab.parallel.activations`, lab 09):
:func:`dtlab.parallel.activations.recompute` and :class:`Recomputed` (full recomputation written
from scratch), :func:`recompute_attention_core` (Megatron's selective),
:func:`checkpoint_saving_matmuls` (PyTorch's op-level selective checkpointing),
:class:`OffloadActivations` (saved tensors to the host) and :func:`accumulate_gradients`
(K micro-batches, ``no_sync``).

Expert parallel (:mod:`dtlab.parallel.expert`, lab 07): the lab GPT gets mixture-of-experts
blocks through its MLP factory (:func:`dtlab.models.moe.moe_mlp_factory`); :func:`parallelize_experts`
shards the experts over the mesh's ``ep`` group — a counted count exchange, then the dispatch and
combine all-to-alls — and dense gradients sync over ``dp``, expert gradients over ``edp``.

Composition (:mod:`dtlab.parallel.compose`): :func:`compose_gpt` applies tensor, context,
pipeline and data parallelism (DDP, FSDP or HSDP) on one mesh, in torchtitan's order, and knows
per parameter which groups reduce its gradient (global-norm clipping counts each element once).

Every wrapper runs its collectives through a :class:`~dtlab.comm.Communicator`: torch's own, or dtlab's
counted rings (``collectives="dtlab"``) when the bytes must be measured.
"""

from dtlab.collectives.stats import CommStats
from dtlab.comm import ring_bytes_sent
from dtlab.parallel import compose, context, expert, pipeline
from dtlab.parallel.activations import (
    AccumulationStep,
    OffloadActivations,
    Recomputed,
    accumulate_gradients,
    checkpoint_saving_matmuls,
    recompute_attention_core,
    split_batch,
)
from dtlab.parallel.compose import compose_gpt
from dtlab.parallel.context import parallelize_context
from dtlab.parallel.data import (
    AsyncSGDResult,
    BucketedDDP,
    DataParallelBase,
    NaiveDDP,
    OverlappedDDP,
    Straggler,
    run_async_sgd,
    straggle,
)
from dtlab.parallel.expert import ExpertParallel, parallelize_experts
from dtlab.parallel.gradient_sync import assign_buckets
from dtlab.parallel.pipeline import pipeline_gpt, simulate, validate
from dtlab.parallel.tensor import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallel,
    VocabParallelEmbedding,
    check_tensor_parallel,
    parallelize_gpt,
    vocab_parallel_cross_entropy,
)
from dtlab.parallel.zero import (
    FullyShardedDataParallel,
    ZeroOptimizer,
    ZeroStageSetup,
    clip_sharded_grad_norm_,
    gather_full_parameters,
    offload_device,
    shard_by_zero_stage,
)
from dtlab.precision.mixed_precision import MixedPrecision, norms_in_fp32

__all__ = [
    "AccumulationStep",
    "OffloadActivations",
    "Recomputed",
    "accumulate_gradients",
    "checkpoint_saving_matmuls",
    "recompute_attention_core",
    "split_batch",
    "ExpertParallel",
    "compose",
    "compose_gpt",
    "expert",
    "parallelize_experts",
    "AsyncSGDResult",
    "BucketedDDP",
    "ColumnParallelLinear",
    "CommStats",
    "DataParallelBase",
    "FullyShardedDataParallel",
    "MixedPrecision",
    "NaiveDDP",
    "OverlappedDDP",
    "RowParallelLinear",
    "Straggler",
    "TensorParallel",
    "VocabParallelEmbedding",
    "ZeroOptimizer",
    "ZeroStageSetup",
    "assign_buckets",
    "check_tensor_parallel",
    "clip_sharded_grad_norm_",
    "context",
    "gather_full_parameters",
    "norms_in_fp32",
    "offload_device",
    "pipeline",
    "pipeline_gpt",
    "parallelize_context",
    "parallelize_gpt",
    "ring_bytes_sent",
    "run_async_sgd",
    "shard_by_zero_stage",
    "simulate",
    "straggle",
    "validate",
    "vocab_parallel_cross_entropy",
]
