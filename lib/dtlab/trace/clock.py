"""One clock for every rank: the offset from each rank's monotonic clock to rank 0's.

Processes on one machine read the same CLOCK_MONOTONIC, so their spans already line up. Two
machines' monotonic clocks start at unrelated moments (boot), so under torchrun across nodes
each rank measures how far its clock runs ahead of rank 0's, once, right after the process
group starts, by reading both clocks as they leave the same barrier. The estimate is good to
the barrier's release skew (microseconds within a rack), far below the milliseconds that a
training step's spans last.
"""

from __future__ import annotations

import socket
import statistics
import time

from dtlab.trace.recorder import set_clock_offset


def calibrate_clock(group=None, rounds: int = 5) -> int:
    """Put this rank's spans on rank 0's clock; returns (and sets) the offset in nanoseconds.

    Collective over ``group`` (default: the world; every member must call it); works on gloo
    and NCCL. Each round, every rank leaves a barrier, reads its raw monotonic clock, and
    ``all_gather_object`` shares ``(hostname, stamp)``. Ranks on the host of the group's first
    rank read the very same clock, so their offset is exactly 0. Elsewhere the offset is
    ``my_stamp - first_rank_stamp``, wrong by how unevenly the barrier releases ranks, so the
    median over ``rounds`` is kept.
    """
    import torch.distributed as dist

    host = socket.gethostname()
    same_host_as_first = True
    offsets = []
    for _ in range(max(1, rounds)):  # every rank runs every round: these are collectives
        dist.barrier(group=group)
        stamp = time.perf_counter_ns()
        gathered: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, (host, stamp), group=group)
        first_host, first_stamp = gathered[0]
        same_host_as_first = first_host == host
        offsets.append(stamp - first_stamp)
    offset = 0 if same_host_as_first else int(statistics.median(offsets))
    set_clock_offset(offset)
    return offset
