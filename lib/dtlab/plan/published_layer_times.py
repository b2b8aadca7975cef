"""One measured transformer layer: Korthikanti et al. 2022's Table 4, and the planner beside it.

Korthikanti, Casper, Lym, McAfee, Andersch, Shoeybi, Catanzaro 2022, "Reducing Activation
Recomputation in Large Transformer Models" (MLSys 2023), Table 4 and Sec. 6.2: the forward and
backward time of one transformer layer of their 22B GPT (Table 3: 48 layers, h 6,144, 64 heads,
TP 8, no pipeline, micro-batch 4, sequence 2,048) on Selene's A100s
(:mod:`dtlab.plan.megatron_jobs`), Megatron-LM of 2022:

=============================== ============ =============
experiment                       forward, ms  backward, ms
=============================== ============ =============
baseline, no recomputation       7.7          11.9
sequence parallelism             7.2          11.8
baseline with full recompute     7.7          19.5
selective recomputation          7.7          13.2
selective + sequence parallel    7.2          13.1
=============================== ============ =============

What the rows measure that an iteration time cannot: the layer's own compute and TP
communication, apart from the pipeline, the head and data parallelism. The paper reads two of
them for us: sequence parallelism's 6 % faster forward "comes from the layer-norm and dropout
layers being performed on 1/t of the data" (the redundant work TP without SP does,
:data:`dtlab.plan.constants.REPLICATED_BYTES_PER_TOKEN`), less what SP's collectives cost beyond
one all-reduce's; and full recomputation adds one forward to the backward (19.5 − 11.9 = 7.6 ms
against a 7.7 ms forward), 39 % of the layer rather than the third its FLOPs are, because
forward's TP collectives are exposed where backward's mostly hide behind its GEMMs.

:func:`model_layer_times` is the planner's layer for the same plan: forward ``F`` plus the
forward TP collectives it exposes, backward ``B + W`` plus backward's exposed ones
(:func:`dtlab.plan.compute.layer_compute`, :func:`dtlab.plan.exposed.tp_exposed`), and what
the hidden collectives cost the compute beside them. It comes out within 3 % of every combined
time (1.01–1.02), each forward 3 % fast and each backward 3–6 % slow
(``tests/test_plan_layer_times.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dtlab.plan.job import Requirements
from dtlab.plan.megatron_jobs import selene_gpt
from dtlab.plan.parallel_plan import ParallelPlan

GPT_22B: Requirements = replace(
    selene_gpt("GPT 22B (Korthikanti et al. 2022)", 48, 6144, 64, 8, 4),
    software="megatron-lm-2022",
)
"""Table 3's 22B GPT on one DGX A100: TP 8, micro-batch 4, a batch of 4 sequences."""


@dataclass(frozen=True)
class LayerTimes:
    """One row of Table 4: a layer's measured forward and backward, and the plan it ran."""

    experiment: str
    plan: ParallelPlan
    forward_s: float
    backward_s: float

    @property
    def combined_s(self) -> float:
        return self.forward_s + self.backward_s


def _plan(recompute: str, sequence_parallel: bool) -> ParallelPlan:
    return ParallelPlan(1, 8, 1, 0, 4, recompute=recompute, sequence_parallel=sequence_parallel)


TABLE4: tuple[LayerTimes, ...] = (
    LayerTimes("baseline, no recomputation", _plan("none", False), 7.7e-3, 11.9e-3),
    LayerTimes("sequence parallelism", _plan("none", True), 7.2e-3, 11.8e-3),
    LayerTimes("baseline with full recompute", _plan("full", False), 7.7e-3, 19.5e-3),
    LayerTimes("selective recomputation", _plan("selective", False), 7.7e-3, 13.2e-3),
    LayerTimes("selective + sequence parallel", _plan("selective", True), 7.2e-3, 13.1e-3),
)
"""Korthikanti et al. 2022, Table 4 (module docstring), in seconds."""


def model_layer_times(job: Requirements, plan: ParallelPlan) -> tuple[float, float]:
    """The planner's ``(forward, backward)`` seconds of one layer and micro-batch on one GPU, as
    :func:`~dtlab.plan.step_time.step_time` prices them: compute, the TP collectives the job's
    software leaves exposed, and what the hidden ones cost the compute beside them — for the
    job's layers alone (no embedding or output head: ``12·L·h²`` parameters, no vocabulary)."""
    from dtlab.plan.step_time import micro_batch_seconds

    layers_only = replace(
        job, vocab_size=0, params=12 * job.n_layers * job.d_model**2, n_gpus=plan.tp
    )
    forward, input_grad, weight_grad = micro_batch_seconds(layers_only, plan)
    return forward / job.n_layers, (input_grad + weight_grad) / job.n_layers
