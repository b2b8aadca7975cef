"""Closed-form cost models: alpha-beta links, bus bandwidth, FLOPs and MFU, pipeline bubbles.

Everything here is instant arithmetic — no processes, no tensors — so quiz keys and lab
predictions come from here and are printed next to the measured values they predict.

* :mod:`~dtlab.cost.alpha_beta` — :class:`Link` (``α + n·β``) and :func:`ring_allreduce_time`.
* :mod:`~dtlab.cost.hardware` — link and GPU presets with datasheet sources.
* :mod:`~dtlab.cost.bandwidth` — nccl-tests ``algbw`` / ``busbw``.
* :mod:`~dtlab.cost.flops` — ``6N`` FLOPs per token, MFU, training days, GPT parameter count.
* :mod:`~dtlab.cost.bubble` — pipeline bubble in both conventions.
* :mod:`~dtlab.cost.reliability` — cluster MTBF and the Young/Daly checkpoint interval.
* :mod:`~dtlab.cost.collectives`, :mod:`~dtlab.cost.trees`, :mod:`~dtlab.cost.tuner` — every
  collective schedule's α-β time and bytes per rank, the double binary tree's shape, and the
  tuner that picks the fastest schedule (``algorithm="auto"``).
* :mod:`~dtlab.cost.hierarchy` — the two-tier cluster: NVLink inside, one 400 Gb/s NIC per GPU on
  rails between nodes (``nics_per_node=1`` for the one-NIC box), leaves and spine.
* :mod:`~dtlab.cost.crossover` — where communication hides behind compute, for DP, TP, CP, EP, PP.
* :mod:`~dtlab.cost.checkpoint_cost` — 12 B/param checkpoints; Young/Daly for async saves.
* :mod:`~dtlab.cost.mfu`, :mod:`~dtlab.cost.mesh_reduction`, :mod:`~dtlab.cost.nccl_protocols`,
  :mod:`~dtlab.cost.weight_sync` — MFU conventions, which group reduces which gradient, NCCL
  protocols and busbw, RL weight sync and local SGD; :mod:`~dtlab.cost.caching_allocator` models
  PyTorch's caching allocator (reserved vs allocated, fragmentation, expandable segments).
"""

from dtlab.cost.alpha_beta import Link, ring_allreduce_time
from dtlab.cost.bandwidth import BUSBW_OPS, algbw, busbw, busbw_factor
from dtlab.cost.bubble import (
    bubble_fraction_of_total,
    bubble_ratio_to_ideal,
    interleaved_bubble_fraction_of_total,
    interleaved_bubble_ratio_to_ideal,
    micro_batches_for_bubble,
)
from dtlab.cost.flops import (
    flops_per_token,
    gpt_param_count,
    gpt_param_count_approx,
    hardware_flops_utilization,
    model_flops_utilization,
    training_days,
    training_flops,
)
from dtlab.cost.hardware import GPUS, LINKS, GPUSpec, gpu, link
from dtlab.cost.reliability import cluster_mtbf, expected_waste_fraction, young_daly_interval

__all__ = [
    # alpha_beta
    "Link",
    "ring_allreduce_time",
    # hardware
    "LINKS",
    "GPUS",
    "GPUSpec",
    "link",
    "gpu",
    # bandwidth
    "BUSBW_OPS",
    "algbw",
    "busbw",
    "busbw_factor",
    # flops
    "flops_per_token",
    "training_flops",
    "model_flops_utilization",
    "hardware_flops_utilization",
    "training_days",
    "gpt_param_count",
    "gpt_param_count_approx",
    # bubble
    "bubble_fraction_of_total",
    "bubble_ratio_to_ideal",
    "interleaved_bubble_ratio_to_ideal",
    "interleaved_bubble_fraction_of_total",
    "micro_batches_for_bubble",
    # reliability
    "cluster_mtbf",
    "young_daly_interval",
    "expected_waste_fraction",
]

# Collective algorithms (issue 3): alpha-beta time of every schedule, bytes per rank, fitting,
# and the two-tier (NVLink / InfiniBand) model of hierarchical all-reduce.
from dtlab.cost.collectives import (  # noqa: E402
    AlphaBetaTerms,
    bytes_sent_per_rank,
    collective_time,
    crossover_bytes,
)
from dtlab.cost.fit import fit_alpha_beta  # noqa: E402
from dtlab.cost.hierarchy import (  # noqa: E402
    TwoTierCluster,
    flat_ring_all_reduce_time,
    hierarchical_all_reduce_time,
    hierarchical_speedup,
)
from dtlab.cost.tuner import (  # noqa: E402
    best_segments,
    choice_switches,
    fastest_algorithm,
    predicted_times,
)

__all__ += [
    "AlphaBetaTerms",
    "bytes_sent_per_rank",
    "collective_time",
    "crossover_bytes",
    "fit_alpha_beta",
    "best_segments",
    "choice_switches",
    "fastest_algorithm",
    "predicted_times",
    "TwoTierCluster",
    "flat_ring_all_reduce_time",
    "hierarchical_all_reduce_time",
    "hierarchical_speedup",
]

# Bytes on the wire per parallelism axis (DP, TP, SP, PP, CP, EP) and checkpoint sizes.
from dtlab.cost.volumes import (  # noqa: E402
    ExpertParallelVolume,
    LayerCommVolume,
    RingAttentionVolume,
    accumulation_steps_for_batch,
    checkpoint_bytes_per_rank,
    checkpoint_write_seconds,
    dp_allreduce_bytes_per_rank,
    dp_bytes_per_optimizer_step,
    moe_all_to_all_bytes_per_layer,
    parameter_bytes,
    pipeline_p2p_bytes_per_microbatch,
    pipeline_p2p_bytes_per_step,
    ring_attention_kv_bytes,
    sp_collective_volume_per_layer,
    tp_allreduce_volume_per_layer,
    ulysses_all_to_all_bytes,
)

__all__ += [
    "ExpertParallelVolume",
    "LayerCommVolume",
    "RingAttentionVolume",
    "accumulation_steps_for_batch",
    "checkpoint_bytes_per_rank",
    "checkpoint_write_seconds",
    "dp_allreduce_bytes_per_rank",
    "dp_bytes_per_optimizer_step",
    "moe_all_to_all_bytes_per_layer",
    "parameter_bytes",
    "pipeline_p2p_bytes_per_microbatch",
    "pipeline_p2p_bytes_per_step",
    "ring_attention_kv_bytes",
    "sp_collective_volume_per_layer",
    "tp_allreduce_volume_per_layer",
    "ulysses_all_to_all_bytes",
]
