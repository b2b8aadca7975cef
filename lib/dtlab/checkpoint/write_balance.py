"""Measure a save under each ``writers`` policy: bytes each rank wrote, read back from its file's
entries, and the seconds until its file was on disk (lab 10, ``tests/test_checkpoint_dedup.py``).

The bytes are what :func:`~dtlab.checkpoint.storage.write_pieces` recorded for each piece it
wrote (``rank_r.json``), not a formula; :func:`~dtlab.checkpoint.dedup.plan_writers` is the
formula they are held to. The seconds run from the start of the save to the moment this rank's
file is fsync'd (the ``before_flag`` hook), so they include the agreement on the directory and,
for ``"balanced"``, the all-gather of the plan; the save as a whole lasts as long as its slowest
rank.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from dtlab.checkpoint.save_load import SPECIAL, save
from dtlab.checkpoint.state import ShardedState


def measured_save(root: str | Path, step: int, state: ShardedState, writers: str) -> dict:
    """Every rank: save ``state`` with ``writers``; return this rank's written tensor bytes, its
    write seconds and the directory."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    marks: dict[str, float] = {}
    if dist.is_initialized():
        dist.barrier()  # start the clocks together
    start = time.perf_counter()
    path = save(
        root,
        step,
        state,
        before_flag=lambda: marks.setdefault("written", time.perf_counter()),
        writers=writers,
    )
    entries = json.loads((path / f"rank_{rank}.json").read_text())
    return {
        "bytes": sum(e["nbytes"] for e in entries if e["name"] not in SPECIAL),
        "seconds": marks["written"] - start,
        "path": str(path),
    }
