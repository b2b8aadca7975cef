"""ZeRO and FSDP: data parallelism that stops every rank holding everything (lab 03).

Plain DDP holds 16Ψ bytes per rank for mixed-precision Adam (Ψ parameters). ZeRO shards that
state over the N ranks of the dp group, one piece at a time: optimizer state (stage 1), gradients
(stage 2), parameters (stage 3, which PyTorch calls FSDP). Read the files in this order:

1. :mod:`~dtlab.parallel.zero.flat_segment` — :class:`FlatSegment`, the data structure under every
   stage: parameters laid end to end, padded to a multiple of N, rank r owning chunk r (the Ψ/N).
2. :mod:`~dtlab.parallel.zero.master_shards` — :class:`MasterShardOptimizer`: any torch optimizer
   stepping this rank's fp32 master shard, so Adam's m and v exist for 1/N of the elements.
3. :mod:`~dtlab.parallel.zero.optimizer_offload` — where ZeRO-Offload keeps those masters and
   their state: host memory (:func:`offload_device`, pinned :func:`host_buffer` on a GPU).
4. :mod:`~dtlab.parallel.zero.optimizer` — :class:`ZeroOptimizer`, stages 1 and 2: gradients
   reduce-scattered (at ``step()``, or from gradient hooks with the full gradient freed), the
   updated shards all-gathered back: the bytes of one DDP all-reduce, split in two halves.
5. :mod:`~dtlab.parallel.zero.grad_clip` — :func:`clip_sharded_grad_norm_`: the global norm when
   no rank holds the whole gradient (one scalar all-reduce of the partial sums of squares).
6. :mod:`~dtlab.parallel.zero.fsdp_layout` — which FSDP unit owns which parameter (the innermost
   unit that contains it) and the dtype casts at a unit's boundary.
7. :mod:`~dtlab.parallel.zero.fsdp_unit` — :class:`FSDPUnit`: one unit's shards at rest, its
   gathered buffer in use, and the reduce-scatter of its gradients (what a unit can do).
8. :mod:`~dtlab.parallel.zero.fsdp_lifecycle` — the unit's lifecycle as one state machine
   (SHARDED → PREFETCHING → GATHERED_FOR_FORWARD → … → REDUCING → REDUCED): when it does it;
   its states, events and transition table are :mod:`~dtlab.parallel.zero.fsdp_states`, one
   unit's machine (:class:`UnitLifecycle`) is :mod:`~dtlab.parallel.zero.fsdp_unit_machine`.
9. :mod:`~dtlab.parallel.zero.fsdp` — :class:`FullyShardedDataParallel`, stage 3: all-gather a
   unit just before forward and again before backward (with prefetch), reduce-scatter its
   gradients as soon as they exist: 1.5× DDP's bytes for 16Ψ/N bytes held.
    Its knobs: prefetch depth forward and backward, ``reshard_after_forward``.
    Its hook ``gather_cast``: what a unit's all-gather sends and how every rank decodes it
    (:mod:`~dtlab.parallel.zero.gather_cast`, e.g. :func:`fp8_e4m3_gather_cast`: E4M3 bytes).
10. :mod:`~dtlab.parallel.zero.prefetch` — :func:`measure_fsdp_prefetch`: what those knobs cost
    and hide, the exposed all-gather per unit and the peak gathered bytes, beside FSDP2's memory
    (read off the trace on either collectives path: :mod:`~dtlab.parallel.zero.prefetch_spans`).
11. :mod:`~dtlab.parallel.zero.full_state` — :func:`gather_full_parameters`: whole tensors (and
    the bytes held) back from shards, for saving, logging and tests.
12. :mod:`~dtlab.parallel.zero.by_stage` — :func:`shard_by_zero_stage`: one model wrapped the way
    stage 0 (DDP, from :mod:`dtlab.parallel.data`), 1, 2 or 3 holds it, so one loop compares all.

The dp group's communicator, the start-up broadcast, the end-of-backward queue and the bucketing
rule come from :mod:`dtlab.parallel.gradient_sync`, shared with DDP; nothing here imports DDP's
implementation files (only :mod:`~dtlab.parallel.zero.by_stage` uses :class:`BucketedDDP`, through
:mod:`dtlab.parallel.data`'s public names).

Papers: Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models" (SC 2020); Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training"
(USENIX ATC 2021); Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data
Parallel" (VLDB 2023).
"""

from dtlab.parallel.zero.by_stage import ZeroStageSetup, shard_by_zero_stage
from dtlab.parallel.zero.flat_segment import FlatSegment
from dtlab.parallel.zero.fsdp import FullyShardedDataParallel
from dtlab.parallel.zero.fsdp_layout import default_units
from dtlab.parallel.zero.fsdp_unit import FSDPUnit
from dtlab.parallel.zero.full_state import gather_full_parameters
from dtlab.parallel.zero.gather_cast import GatherCast, fp8_e4m3_gather_cast
from dtlab.parallel.zero.grad_clip import clip_sharded_grad_norm_
from dtlab.parallel.zero.master_shards import MasterShardOptimizer
from dtlab.parallel.zero.optimizer import ZeroOptimizer
from dtlab.parallel.zero.optimizer_offload import host_buffer, offload_device
from dtlab.parallel.zero.prefetch import (
    PrefetchSetting,
    all_gathers_per_step,
    forward_peak_gathered_units,
    fsdp_prefetch_figures,
    measure_fsdp_prefetch,
    prefetch_timeline,
)

__all__ = [
    "FSDPUnit",
    "FlatSegment",
    "FullyShardedDataParallel",
    "GatherCast",
    "MasterShardOptimizer",
    "PrefetchSetting",
    "ZeroOptimizer",
    "ZeroStageSetup",
    "all_gathers_per_step",
    "clip_sharded_grad_norm_",
    "default_units",
    "forward_peak_gathered_units",
    "fp8_e4m3_gather_cast",
    "fsdp_prefetch_figures",
    "gather_full_parameters",
    "host_buffer",
    "measure_fsdp_prefetch",
    "offload_device",
    "prefetch_timeline",
    "shard_by_zero_stage",
]
