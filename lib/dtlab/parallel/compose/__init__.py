"""Composing parallelisms on one mesh: :func:`compose_gpt` applies tensor, context, pipeline and
data parallelism (DDP, FSDP or HSDP) to the lab GPT from outside, and
:mod:`~dtlab.parallel.compose.placement` says, per parameter, which groups hold it and reduce its
gradient — and clips by the global norm with every element counted once."""

from dtlab.parallel.compose.checks import (
    DATA_PARALLEL,
    check_composed_layout,
    check_composition,
    composed_layout_problems,
)
from dtlab.parallel.compose.gpt import ComposedGPT, compose_gpt
from dtlab.parallel.compose.placement import (
    Placement,
    clip_global_grad_norm_,
    global_grad_norm,
    place_parameters,
)

__all__ = [
    "DATA_PARALLEL",
    "ComposedGPT",
    "Placement",
    "check_composed_layout",
    "check_composition",
    "clip_global_grad_norm_",
    "compose_gpt",
    "composed_layout_problems",
    "global_grad_norm",
    "place_parameters",
]
