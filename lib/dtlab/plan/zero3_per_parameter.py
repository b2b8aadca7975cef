"""ZeRO-3 as DeepSpeed ran it in 2021: one list collective per parameter tensor, each behind a
device-wide synchronize, with host work that grows with the number of ranks.

Megatron-LM 2021's ZeRO-3 rows (Narayanan et al. 2021, Table 2: GPT-3 175B, no model
parallelism, 384 / 768 / 1,536 A100 at 144 / 88 / 44 TFLOP/s) ran DeepSpeed's stage 3 of that
time (v0.3.13, March 2021, through v0.5.4). Its code, read at tag v0.3.13
(``deepspeed/runtime/zero/partition_parameters.py`` and ``stage3.py``):

* **a collective per parameter tensor**: ``fetch_sub_module`` gathers a submodule's parameters
  one at a time (``Init._all_gather`` loops over them, ``_allgather_param`` each); gradients are
  reduce-scattered one parameter at a time (``_reduce_scatter_gradients``);
* **a device-wide synchronize before every gather** (``torch.cuda.synchronize()`` in
  ``_allgather_param``; DeepSpeed PR #1188, v0.5.5: "the async version is not async at all,
  because each all_gather calls torch.cuda.synchronize()"), so the GPU is drained while the host
  prepares the next collective;
* **host work linear in the world size**: a Python loop builds one ``narrow`` view per rank
  (and calls ``get_rank(group)`` each pass), and PyTorch's list ``all_gather`` copies each rank's
  part out of its flat buffer with one kernel per rank (the list ``reduce_scatter``, in);
* **small tensors persist** (under ``param_persistence_threshold`` = 1e5 elements: a GPT layer's
  biases and LayerNorms), and after the optimizer step all of them are gathered again through a
  loop of ``tensors × N`` copies (``_post_step`` → ``_allgather_params``).

Per micro-batch and layer, for a GPT layer (four weight matrices — QKV, projection, two MLP —
plus four biases and two LayerNorms' scale and shift): the four weights are gathered for
forward; with full recomputation again for the rerun, and then three of them for backward —
the last one the rerun used is first in backward and still held, because its reuse distance is
0 while the others' (2·4h² elements for the MLP's first matrix) exceed ``max_reuse_distance`` =
1e9, true for h ≳ 11,200 (GPT-3's 12,288); without a rerun the forward is far from the backward
and all four are gathered again. Every one of the twelve tensors is reduce-scattered.

**The exposure is this module's assumption**, not read from the code: each collective costs,
on the critical path, ``N ·`` :data:`~dtlab.plan.constants.ZERO3_LIST_ENTRY_HOST_S` of host work
(the synchronize before each gather drains the GPU while the host loops) plus NCCL's ring
latency (:func:`~dtlab.plan.zero3_gap.nccl_ring_latency_s`, all-gather and reduce-scatter being
rings only), and the bandwidth stays hidden as the planner's data-parallel model prices it. Two
things pull the other way and are not modelled: a prefetched gather is issued before the
current module's compute, so its latency can overlap that compute as its bandwidth does (with
every gather's latency hidden the rows would be 0.90 / 0.83 / 0.97 — the 768-GPU row out of
±15 %); and the reduce-scatters run from backward hooks while queued kernels execute, but each
later synchronize also waits for them, bandwidth included. So the step is ``C/N + k·N``:
compute shrinks with more GPUs while the exposed part grows. The published 768- and 1,536-GPU
steps are equal (67 s, 74 training days each); the model gives 59 and 72 s.

How much rests on the one constant: the three rows stay within ±15 % for a host cost of
8.0–10.1 µs per rank and collective; 9 µs is the midpoint of the 7–11 µs the mechanism's parts
give (the constant's source), 0.92 / 0.88 / 1.07 of the published steps. FSDP and torch's
``all_gather_into_tensor`` gather a flat buffer per layer with no device sync (DeepSpeed itself
kept a collective per parameter after v0.5.5, with one synchronize per submodule fetch instead
of one per gather): plans default to ``zero3_collectives="per_layer"``, and the planner's own
candidates never use this style.
"""

from __future__ import annotations

import math

from dtlab.plan.constants import ZERO3_LIST_ENTRY_HOST_S
from dtlab.plan.job import Requirements
from dtlab.plan.parallel_plan import ParallelPlan
from dtlab.plan.zero3_gap import nccl_ring_latency_s

WEIGHTS_PER_LAYER = 4  # QKV, attention projection, MLP up and down (a GPT layer)
SMALL_TENSORS_PER_LAYER = 8  # four biases, two LayerNorms' scale and shift (persistent)


def list_collectives_per_micro_batch(req: Requirements, plan: ParallelPlan) -> tuple[int, int]:
    """(all-gathers, reduce-scatters) per micro-batch on one GPU: per layer ``4 + 4 + 3``
    gathers with full recomputation, ``4 + 4`` without, and ``12`` reduce-scatters (module
    docstring)."""
    layers = math.ceil(req.n_layers / plan.pp)
    weights = WEIGHTS_PER_LAYER + int(req.gated_mlp)
    rerun = plan.recompute == "full"  # the rerun gathers all, backward then all but the last
    gathers = 3 * weights - 1 if rerun else 2 * weights
    return layers * gathers, layers * (weights + SMALL_TENSORS_PER_LAYER)


def persistent_tensors(req: Requirements, plan: ParallelPlan) -> int:
    """Small tensors re-gathered once per step after the optimizer (per layer, plus the final
    LayerNorm's two)."""
    return math.ceil(req.n_layers / plan.pp) * SMALL_TENSORS_PER_LAYER + 2


def per_parameter_exposed_s(req: Requirements, plan: ParallelPlan, micro_batches: int) -> float:
    """Exposed seconds per step of per-parameter ZeRO-3 (module docstring): every list
    collective's ``N``-rank host loop and ring latency, and the persistent re-gather's loop."""
    if plan.zero_stage != 3 or plan.zero3_collectives != "per_parameter":
        return 0.0
    ranks = plan.dp * plan.cp
    per_rank = ranks * ZERO3_LIST_ENTRY_HOST_S
    gathers, reduce_scatters = list_collectives_per_micro_batch(req, plan)
    per_collective = per_rank + nccl_ring_latency_s(ranks, req.gpus_per_node)
    return (
        micro_batches * (gathers + reduce_scatters) * per_collective
        + persistent_tensors(req, plan) * per_rank
    )
