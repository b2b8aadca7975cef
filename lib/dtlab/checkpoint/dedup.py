"""Who writes a replicated tensor: every replica, the lowest rank, or the rank with the least so far.

Data parallelism replicates the model; tensor parallelism replicates norms and biases; FSDP's
HSDP replicates whole shards across its replica groups. A checkpoint needs each replicated
tensor once, so the save must pick one writer among the ranks that hold it. Three policies:

``"every"`` (naive)
    Every holder writes its copy. Bytes on storage: ``N · R + S`` for ``R`` replicated and ``S``
    sharded bytes; write time ``(R + S_r)/bandwidth`` per rank — the copies run in parallel but
    share the file system's bandwidth, and the metadata must drop the duplicates.

``"lowest"`` (rank 0)
    The lowest-ranked holder writes each tensor (DCP's ``DefaultSavePlanner(
    dedup_save_to_lowest_rank=True)``). ``R + S`` bytes, but rank 0 alone writes all of ``R``:
    the save lasts ``(R + S_0)/bandwidth`` while every other rank waits for it.

``"balanced"`` (planned size)
    What ``torch.distributed.checkpoint``'s default planner does (``dedup_save_plans`` in
    ``torch/distributed/checkpoint/_dedup_save_plans.py``, torch 2.11–2.14): it walks the
    write items of every rank's local plan in order of first appearance (rank 0's list first,
    then items rank 1 adds, ...) and gives each item to the holder whose plan is **smallest so
    far** (ties: the lowest rank), adding the item's bytes to that plan. Replicated bytes then
    spread over the replicas: the slowest rank writes about ``R/N + S_r``. Every rank computes
    the same plan from the same gathered list, so no rank needs to be told.

dtlab's :func:`~dtlab.checkpoint.save` keeps ``"lowest"`` as its default — its documented rule
is that a replicated tensor's saved copy is rank 0's, which matters if replicas ever diverge
(silent data corruption, lab 10) — and takes ``writers="balanced"`` to do what DCP does by
default. :func:`plan_writers` is the pure planning step, held against torch's own function in
``tests/test_checkpoint_dedup.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WRITERS = ("every", "lowest", "balanced")

Item = tuple[str, int]
"""One write item of a rank's local plan: (its key — equal on every rank that holds the same
replicated tensor — and its bytes)."""


@dataclass(frozen=True)
class WritePlan:
    """Which keys each rank writes, and the bytes that makes per rank."""

    keys: list[list[str]]
    bytes_per_rank: list[int]

    @property
    def slowest_rank_bytes(self) -> int:
        """The bytes of the busiest writer: the save's length at equal per-rank bandwidth."""
        return max(self.bytes_per_rank)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_per_rank)


def plan_writers(local_plans: Sequence[Sequence[Item]], writers: str = "balanced") -> WritePlan:
    """Deduplicate the ranks' local plans: each key written by one rank (``"every"``: by all)."""
    if writers not in WRITERS:
        raise ValueError(f"writers={writers!r} is not a policy; choose one of {WRITERS}")
    holders: dict[str, list[int]] = {}
    size: dict[str, int] = {}
    for rank, plan in enumerate(local_plans):
        for key, nbytes in plan:
            if key in size and size[key] != nbytes:
                raise ValueError(
                    f"{key!r} is {size[key]} bytes on one rank and {nbytes} on rank {rank}: a "
                    "replicated tensor must have the same shape and dtype on every holder"
                )
            holders.setdefault(key, []).append(rank)
            size[key] = nbytes
    planned = [0] * len(local_plans)
    keys: list[list[str]] = [[] for _ in local_plans]
    for key, ranks in holders.items():  # dict order = order of first appearance
        if writers == "every":
            chosen = ranks
        elif writers == "lowest":
            chosen = [min(ranks)]
        else:
            chosen = [min(ranks, key=lambda r: (planned[r], r))]
        for r in chosen:
            planned[r] += size[key] or 1  # as DCP: a zero-byte item still counts one
            keys[r].append(key)
    return WritePlan(keys, [sum(size[k] for k in ks) for ks in keys])


def balanced_slowest_bytes(
    replicated_bytes: float, n_ranks: int, sharded_bytes: float = 0
) -> float:
    """The busiest rank's bytes when ``replicated_bytes`` (in many small tensors) spread evenly
    over ``n_ranks`` replicas, each also writing its ``sharded_bytes``: ``R/N + S``."""
    if n_ranks < 1 or replicated_bytes < 0 or sharded_bytes < 0:
        raise ValueError("need n_ranks >= 1 and non-negative byte counts")
    return replicated_bytes / n_ranks + sharded_bytes


def write_seconds(
    writers: str,
    replicated_bytes: float,
    n_ranks: int,
    per_rank_write_bytes_per_s: float,
    sharded_bytes_per_rank: float = 0,
    shared_storage_bytes_per_s: float | None = None,
) -> float:
    """Seconds a save lasts: the busiest rank's bytes over its write bandwidth, and — when a
    shared file system caps the sum — the total bytes over that cap, whichever is longer."""
    if writers not in WRITERS:
        raise ValueError(f"writers={writers!r} is not a policy; choose one of {WRITERS}")
    if per_rank_write_bytes_per_s <= 0 or n_ranks < 1:
        raise ValueError("need a positive per-rank write bandwidth and n_ranks >= 1")
    slowest = {
        "every": replicated_bytes + sharded_bytes_per_rank,
        "lowest": replicated_bytes + sharded_bytes_per_rank,
        "balanced": balanced_slowest_bytes(replicated_bytes, n_ranks, sharded_bytes_per_rank),
    }[writers]
    copies = n_ranks if writers == "every" else 1
    total = copies * replicated_bytes + n_ranks * sharded_bytes_per_rank
    seconds = slowest / per_rank_write_bytes_per_s
    if shared_storage_bytes_per_s is not None:
        seconds = max(seconds, total / shared_storage_bytes_per_s)
    return seconds
