"""Sharded, verified, atomic and asynchronous checkpoints (lab 10).

* :mod:`~dtlab.checkpoint.slices` — which box of a global tensor a piece holds; copy overlaps.
* :mod:`~dtlab.checkpoint.state` — a rank's pieces under FSDP, tensor parallel or no sharding;
  RNG states.
* :mod:`~dtlab.checkpoint.dedup` — who writes a replicated tensor: every replica, rank 0, or the
  rank with the smallest plan so far (DCP's default); :func:`plan_writers`.
* :mod:`~dtlab.checkpoint.storage` — rank files of raw bytes with a CRC-32 per piece.
* :mod:`~dtlab.checkpoint.metadata` — ``metadata.json``, sealed by a CRC-32 of its own bytes.
* :mod:`~dtlab.checkpoint.commit` — temporary directory, fsync, rename, ``COMPLETE`` last.
* :mod:`~dtlab.checkpoint.plain` — a plain ``state_dict()`` (model and optimizer) as the state.
* :mod:`~dtlab.checkpoint.save_load` — :func:`save` and :func:`load` (resharding on load).
* :mod:`~dtlab.checkpoint.async_save` — :class:`AsyncCheckpointer`: snapshot, then write in the
  background; ``save`` returns a :class:`SaveHandle` (``.result()`` once it is committed).
"""

from dtlab.checkpoint.async_save import AsyncCheckpointer, SaveHandle, snapshot
from dtlab.checkpoint.commit import complete_checkpoints
from dtlab.checkpoint.dedup import WritePlan, plan_writers
from dtlab.checkpoint.metadata import read_metadata
from dtlab.checkpoint.save_load import LoadResult, load, plan_reads, save
from dtlab.checkpoint.slices import Box, copy_overlap, flat_range, split_along, whole
from dtlab.checkpoint.state import (
    Local,
    ShardedState,
    fsdp_state,
    prepare_optimizer_state,
    replicated_state,
    rng_states,
    set_rng_states,
    tensor_parallel_state,
)
from dtlab.checkpoint.storage import CheckpointError, CheckpointNotFound

__all__ = [
    "AsyncCheckpointer",
    "Box",
    "CheckpointError",
    "CheckpointNotFound",
    "Local",
    "LoadResult",
    "SaveHandle",
    "WritePlan",
    "ShardedState",
    "complete_checkpoints",
    "copy_overlap",
    "flat_range",
    "fsdp_state",
    "load",
    "plan_reads",
    "plan_writers",
    "prepare_optimizer_state",
    "read_metadata",
    "replicated_state",
    "rng_states",
    "save",
    "set_rng_states",
    "snapshot",
    "split_along",
    "tensor_parallel_state",
    "whole",
]
