"""The Python half of a 2021 list collective, timed on this machine's CPU.

DeepSpeed's stage 3 of 2021 (v0.3.13, ``partition_parameters.py``, ``_allgather_param``) built
one ``narrow`` view of a flat buffer per rank and compared each index with
``torch.distributed.get_rank(group)`` before every parameter's all-gather — a loop over the world
size, ~2,200 times a step for GPT-3 175B. :func:`measure_python_loop_s_per_rank` times that loop
as written, per rank: the measured part of the planner's
:data:`~dtlab.plan.constants.ZERO3_LIST_ENTRY_HOST_S` (:mod:`dtlab.plan.zero3_per_parameter`).

    python -m dtlab.perf.list_collective_loop
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def measure_python_loop_s_per_rank(world_size: int = 1536, repeats: int = 20) -> float:
    """Time ``_allgather_param``'s Python loop here (``narrow`` a flat buffer per rank, compare
    the rank with ``get_rank(group)``, append), per rank: the Python half of
    :data:`~dtlab.plan.constants.ZERO3_LIST_ENTRY_HOST_S`, on whatever CPU runs this (a
    one-rank gloo group stands in for the data-parallel group). Median of ``repeats``."""
    started_here = not dist.is_initialized()
    if started_here:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        store = dist.HashStore()
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        group = dist.new_group([0])
        part = 1024
        flat = torch.zeros(part * world_size, dtype=torch.float16)

        def loop() -> None:
            parts = []
            for i in range(world_size):
                parts.append(flat.narrow(0, part * i, part))
                if i == dist.get_rank(group=group):
                    parts[i].fill_(1)

        loop()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            loop()
            times.append(time.perf_counter() - start)
        return sorted(times)[len(times) // 2] / world_size
    finally:
        if started_here:
            dist.destroy_process_group()


if __name__ == "__main__":
    print(f"Python loop per rank: {measure_python_loop_s_per_rank() * 1e6:.1f} µs")
