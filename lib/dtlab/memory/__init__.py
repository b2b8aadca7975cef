"""Memory per rank: the closed-form accounting (ZeRO, activations) and exact measurements.

* :mod:`~dtlab.memory.formulas` — bytes/param recipes, ZeRO stages, activation formulas.
* :mod:`~dtlab.memory.measure` — :class:`MemoryReport` by category; exact tensor accounting.
* :mod:`~dtlab.memory.activations` — :class:`ActivationMeter`: bytes saved for backward.
* :mod:`~dtlab.memory.peak` — :func:`peak_bytes_of`: the high-water mark of one step, CPU or GPU.
"""

from dtlab.memory.activations import ActivationMeter
from dtlab.memory.formulas import (
    RECIPES,
    ZERO_STAGES,
    Recipe,
    StateBytes,
    activation_bytes,
    activation_bytes_per_layer,
    activation_checkpointing_bytes,
    fsdp2_state_bytes,
    model_state_bytes,
    resolve_recipe,
    shard_numel,
    zero_comm_bytes_per_rank,
)
from dtlab.memory.measure import CATEGORIES, MemoryReport, cuda_memory_report, measure_model_state
from dtlab.memory.peak import WorkPeak, peak_bytes_of

__all__ = [
    "Recipe",
    "RECIPES",
    "resolve_recipe",
    "StateBytes",
    "ZERO_STAGES",
    "shard_numel",
    "fsdp2_state_bytes",
    "model_state_bytes",
    "zero_comm_bytes_per_rank",
    "activation_bytes_per_layer",
    "activation_bytes",
    "activation_checkpointing_bytes",
    "CATEGORIES",
    "MemoryReport",
    "measure_model_state",
    "cuda_memory_report",
    "ActivationMeter",
    "WorkPeak",
    "peak_bytes_of",
]
