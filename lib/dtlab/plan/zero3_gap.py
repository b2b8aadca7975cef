"""Megatron-LM 2021's ZeRO-3 rows priced as FSDP would run them: what their traffic implies.

Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", Sec. 5.2, Table 2) ran GPT-3 175B with DeepSpeed ZeRO-3 and no model parallelism
on 384 / 768 / 1,536 A100s at a fixed batch of 1,536 (micro-batch 4 / 2 / 1: one micro-batch per
GPU per step) and measured 144 / 88 / 44 TFLOP/s per GPU — the same step time at 768 and 1,536
GPUs (74 training days each for 300B tokens). Priced as a modern ZeRO-3 (``zero3_collectives=
"per_layer"``: each GPU's ``3·Ψ·2`` bytes per micro-batch — two all-gathers and a reduce-scatter
of the whole model, 1,050 GB at 175B — at what eight HDR NICs per node give a TP-1 ring, 200
GB/s, one flat collective per layer, prefetched behind compute), the planner predicts those
steps 1.3–4.1× faster than measured. Neither bandwidth nor latency at that granularity explains
it:

* **Bandwidth** (:func:`implied_zero3_bandwidth`): were nothing hidden, the published steps
  would imply 50 / 29 / 20 GB/s per GPU — falling towards one HDR NIC (25 GB/s) as N grows,
  with the bytes per GPU constant: no bandwidth term falls with N.
* **Ring latency per layer** (:func:`zero3_ring_latency_s`): NCCL runs all-gather and
  reduce-scatter as rings only (no tree), ``N − 1`` steps each, priced with NCCL's own pre-NVLS
  tuning constants (:mod:`dtlab.plan.constants`: 8.4 µs per call, 3.4 µs per NVLink step, 9.6 µs
  per network step) — 1.6 / 3.2 / 6.4 ms per collective at 384 / 768 / 1,536 GPUs. At ``3·L`` =
  288 collectives per micro-batch that is 0.46 / 0.92 / 1.85 s per step: 2–4 % of the gap.

What does explain it is how DeepSpeed's stage 3 of 2021 issued its collectives — one per
parameter tensor, each behind a device-wide synchronize, with host work linear in N — priced by
:mod:`dtlab.plan.zero3_per_parameter` (``zero3_collectives="per_parameter"``, what the published
rows carry): 0.92 / 0.88 / 1.07 of the published steps.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from dtlab.plan.constants import (
    NCCL_RING_BASE_LATENCY_S,
    NCCL_RING_NET_HOP_S,
    NCCL_RING_NVLINK_HOP_S,
)

if TYPE_CHECKING:
    from dtlab.plan.published import PublishedRun


def zero3_bytes_per_gpu(run: PublishedRun) -> float:
    """Bytes one GPU of a ZeRO-3 run sends per step over data parallel: ``3·m`` passes of its
    shard (:func:`dtlab.plan.layout_cost.dp_bytes_per_step`)."""
    from dtlab.plan.layout_cost import dp_bytes_per_step, micro_batches

    plan, job = run.plan, run.job
    shard = int(job.params / (plan.tp * plan.pp))
    return dp_bytes_per_step(shard, plan.dp, 3, int(micro_batches(job, plan)))


def implied_zero3_bandwidth(run: PublishedRun) -> float:
    """Bytes/s per GPU a published ZeRO-3 run's data-parallel traffic effectively got, were
    its step the model's compute plus that traffic, none of it hidden: ``bytes / (published
    step − compute − recompute)`` — ~20 GB/s at 1,536 GPUs, where eight HDR NICs per node
    offer 200 GB/s to a TP-1 ring (module docstring)."""
    from dtlab.plan.step_time import step_time

    t = step_time(run.job, run.plan)
    return zero3_bytes_per_gpu(run) / (run.step_s - t.compute_s - t.recompute_s)


def nccl_ring_latency_s(ranks: int, gpus_per_node: int) -> float:
    """Latency of one NCCL ring all-gather or reduce-scatter over ``ranks`` GPUs, ``gpus_per_node``
    to a node: ``base + (N − 1 − (nodes − 1))·NVLink step + (nodes − 1)·network step`` (NCCL's
    ``ncclTopoTuneModel``, ring, Simple protocol)."""
    if ranks < 2:
        return 0.0
    nodes = math.ceil(ranks / gpus_per_node)
    inter = nodes - 1
    return (
        NCCL_RING_BASE_LATENCY_S
        + (ranks - 1 - inter) * NCCL_RING_NVLINK_HOP_S
        + inter * NCCL_RING_NET_HOP_S
    )


def zero3_ring_latency_s(run: PublishedRun) -> float:
    """Ring latency of a ZeRO-3 step: ``m · 3·L`` collectives (gather for forward, gather for
    backward, gradient reduce-scatter, per layer and micro-batch) at :func:`nccl_ring_latency_s`
    of the data-parallel group."""
    from dtlab.plan.layout_cost import micro_batches

    job, plan = run.job, run.plan
    collectives = micro_batches(job, plan) * 3 * job.n_layers
    return collectives * nccl_ring_latency_s(plan.dp * plan.cp, job.gpus_per_node)


def latency_share_of_gap(run: PublishedRun) -> float:
    """:func:`zero3_ring_latency_s` as a share of ``published − predicted`` step, the run
    priced as a per-layer ZeRO-3: how much of that gap the ring latency could explain were all
    of it exposed."""
    from dtlab.plan.step_time import step_time

    per_layer = replace(run.plan, zero3_collectives="per_layer")
    return zero3_ring_latency_s(run) / (run.step_s - step_time(run.job, per_layer).step_s)
