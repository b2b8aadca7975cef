"""The timed loop behind ZERO3_LIST_ENTRY_HOST_S runs as DeepSpeed wrote it and cleans up."""

from __future__ import annotations

import math

import torch.distributed as dist

from dtlab.perf.list_collective_loop import measure_python_loop_s_per_rank


def test_the_loop_is_timed_per_rank_and_leaves_no_process_group_behind():
    seconds = measure_python_loop_s_per_rank(world_size=64, repeats=3)
    assert math.isfinite(seconds) and seconds > 0
    assert not dist.is_initialized()
