"""Data parallelism: every rank holds the whole model, sees its own slice of the batch, and the
ranks average their gradients so every replica takes the same step (lab 02).

Read the files in this order; each DDP is a small diff on the one before:

1. :mod:`~dtlab.parallel.data.base` — :class:`DataParallelBase`, the contract all three DDPs keep:
   broadcast rank 0's state at construction, average every gradient by the end of backward,
   ``no_sync()`` for accumulation, ``find_unused_parameters``.
2. :mod:`~dtlab.parallel.data.naive` — :class:`NaiveDDP`: after backward, one all-reduce per
   gradient; nothing overlaps (2(N-1)/N·Ψ·b bytes sent per rank per step, as every DDP).
3. :mod:`~dtlab.parallel.data.overlapped` — :class:`OverlappedDDP`: an async all-reduce per
   parameter the moment its gradient is ready, so layer L's bytes move while L-1 computes.
4. :mod:`~dtlab.parallel.data.bucketed` — :class:`BucketedDDP`: gradients packed into ~25 MB
   buckets, one async all-reduce per full bucket (what ``torch.nn.parallel.DistributedDataParallel``
   does): the same bytes, far fewer latency terms.
5. :mod:`~dtlab.parallel.data.straggler` — :func:`straggle`: one slow rank makes every rank wait,
   because the all-reduce needs everyone's gradient.
6. :mod:`~dtlab.parallel.data.async_sgd` — :func:`run_async_sgd`: a parameter server on rank 0,
   workers push gradients point to point and never wait — at the price of stale gradients.
7. :mod:`~dtlab.parallel.data.equivalence` — the yardstick: does a distributed run train exactly
   like one process (:data:`FP32_STEP_TOLERANCE`, :class:`TiedToyModel`)?
8. :mod:`~dtlab.parallel.data.loss_normalization` — :func:`normalised_loss`: ranks with different
   numbers of tokens divide by the all-reduced global count, not their own (per-rank means
   misweight tokens).

What the DDPs share with ZeRO/FSDP — the start-up broadcast, the end-of-backward queue and the bucketing rule — is in
:mod:`dtlab.parallel.gradient_sync`; ZeRO and FSDP themselves are :mod:`dtlab.parallel.zero`.

Papers: Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training"
(VLDB 2020); Dean et al., "Large Scale Distributed Deep Networks" (NeurIPS 2012, Downpour SGD);
Chen et al., "Revisiting Distributed Synchronous SGD" (2016, stragglers and backup workers).
"""

from dtlab.parallel.data.async_sgd import AsyncSGDResult, run_async_sgd
from dtlab.parallel.data.base import DataParallelBase
from dtlab.parallel.data.bucketed import Bucket, BucketedDDP
from dtlab.parallel.data.equivalence import (
    FP32_STEP_TOLERANCE,
    TiedToyModel,
    lm_loss,
    max_abs_difference,
    parameters_by_name,
    rank_slice,
    toy_batches,
    train_single_process,
)
from dtlab.parallel.data.loss_normalization import normalised_loss
from dtlab.parallel.data.naive import NaiveDDP
from dtlab.parallel.data.overlapped import OverlappedDDP
from dtlab.parallel.data.straggler import Straggler, straggle

__all__ = [
    "FP32_STEP_TOLERANCE",
    "AsyncSGDResult",
    "Bucket",
    "BucketedDDP",
    "DataParallelBase",
    "NaiveDDP",
    "OverlappedDDP",
    "Straggler",
    "TiedToyModel",
    "lm_loss",
    "max_abs_difference",
    "normalised_loss",
    "parameters_by_name",
    "rank_slice",
    "run_async_sgd",
    "straggle",
    "toy_batches",
    "train_single_process",
]
