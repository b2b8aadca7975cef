"""The job against the clock: days of compute, and how often to checkpoint against failures.

* **Compute**: training a dense transformer costs ``C ≈ 6·N·D`` FLOPs (Kaplan et al. 2020,
  "Scaling Laws for Neural Language Models", Sec. 2.1: 2 per parameter per token forward, 4
  backward), delivered at ``n_gpus · peak · MFU`` FLOP/s: :func:`days_to_train`.
* **Failures**: ``n`` GPUs that each fail once in ``M`` hours fail together every ``M/n`` hours;
  checkpointing every ``τ* = sqrt(2·C·MTBF)`` balances time spent writing against work redone
  (Young 1974; Daly 2006), where ``C`` is the seconds one checkpoint takes to write:
  :func:`checkpoint_interval_s`.
"""

from __future__ import annotations

from dtlab.cost import cluster_mtbf, gpu, young_daly_interval
from dtlab.cost import training_days as cost_training_days
from dtlab.cost.checkpoint_cost import CHECKPOINT_BYTES_PER_PARAM  # one convention everywhere
from dtlab.plan.job import Requirements


def days_to_train(req: Requirements) -> float:
    """Wall-clock days: ``6·params·tokens / (n_gpus · peak bf16 FLOP/s · MFU) / 86400``."""
    return cost_training_days(
        req.tokens, req.params, req.n_gpus, gpu(req.gpu).bf16_dense_flops, req.mfu
    )


def checkpoint_interval_s(req: Requirements) -> float:
    """Young/Daly for *synchronous* saves: ``sqrt(2·C·MTBF)``, C = the write of
    :data:`~dtlab.cost.checkpoint_cost.CHECKPOINT_BYTES_PER_PARAM` (12 B/param: fp32 master and
    Adam's two moments) ÷ write bandwidth, MTBF = per-GPU MTBF / n. With asynchronous saves the
    cost is the blocking stall instead: :func:`dtlab.cost.checkpoint_cost.async_checkpoint_interval_s`."""
    cost_s = req.params * CHECKPOINT_BYTES_PER_PARAM / req.storage_write_bytes_per_s
    return young_daly_interval(cost_s, cluster_mtbf(req.per_gpu_mtbf_hours * 3600, req.n_gpus))
