"""Composing parallelisms on one mesh, in three stages of work, one file each:

* :mod:`~dtlab.parallel.compose.apply` — :func:`compose_gpt` applies tensor, context, pipeline,
  expert and data parallelism (DDP, FSDP or HSDP) to the lab GPT from outside, in torchtitan's
  order, and names every parameter once;
* :mod:`~dtlab.parallel.compose.step` — the training step (every gradient reduced over its
  groups) and clipping;
* :mod:`~dtlab.parallel.compose.account` — the accounts: placements, traffic by group, the whole
  gradients.

With pipeline stages: :mod:`~dtlab.parallel.compose.stage_fsdp` (FSDP gathering each stage once
per step) and :mod:`~dtlab.parallel.compose.sequence_pipeline` (stages exchanging sequence
shards); :mod:`~dtlab.parallel.compose.folding` is MoE parallel folding's two rank mappings,
:mod:`~dtlab.parallel.compose.fold_experts` trains the MoE layers on them (EP with TP).

Beside them: :mod:`~dtlab.parallel.compose.checks` (what can be composed, before any rank
starts), :mod:`~dtlab.parallel.compose.groups` (HSDP's groups, the one flat all-reduce) and
:mod:`~dtlab.parallel.compose.placement` (per parameter, which groups hold it and reduce its
gradient — and the global norm with every element counted once)."""

from dtlab.parallel.compose.apply import ComposedGPT, compose_gpt
from dtlab.parallel.compose.checks import (
    DATA_PARALLEL,
    check_composed_layout,
    check_composition,
    composed_layout_problems,
)
from dtlab.parallel.compose.folding import FoldedMapping
from dtlab.parallel.compose.placement import (
    Placement,
    clip_global_grad_norm_,
    global_grad_norm,
    place_parameters,
)

__all__ = [
    "DATA_PARALLEL",
    "ComposedGPT",
    "FoldedMapping",
    "Placement",
    "check_composed_layout",
    "check_composition",
    "clip_global_grad_norm_",
    "compose_gpt",
    "composed_layout_problems",
    "global_grad_norm",
    "place_parameters",
]
