"""Graders for lab 10 (checkpointing): the atomic commit; the resharding read is graded in
:mod:`.checkpoint_read` (its names are importable from here too).

``checkpointing.atomic_commit`` — ``fn(temp, final, metadata: bytes) -> None``: every rank file
is already in the temporary directory ``temp``; publish it as ``final``. Graded on every rank,
each on its own directory, while ``os.fsync``/``os.rename``/``os.replace`` are watched: at the
moment the directory is renamed, ``metadata.json`` must already hold exactly ``metadata`` and
have been ``fsync``'d, and ``COMPLETE`` must not exist yet; the parent directory must be
``fsync``'d after the rename and before ``COMPLETE`` appears; afterwards ``final`` holds both,
``temp`` is gone, and :func:`dtlab.checkpoint.complete_checkpoints` lists the step. Calling the
library's ``commit`` is refused (``dtlab.files.write_atomic`` is allowed: reuse it).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.checkpoint_read import NEW_DEGREES as NEW_DEGREES
from dtlab.quiz.graders.checkpoint_read import SAVED as SAVED
from dtlab.quiz.graders.checkpoint_read import _library_answers
from dtlab.quiz.graders.checkpoint_read import grade_resharding_read as grade_resharding_read
from dtlab.quiz.graders.watch import noticing_calls


def _commit_on_rank(fn: Callable) -> dict:
    import torch.distributed as dist

    from dtlab.checkpoint import complete_checkpoints

    rank = dist.get_rank() if dist.is_initialized() else 0
    root = Path(tempfile.mkdtemp(prefix=f"dtlab-grade-commit-{rank}-"))
    temp, final = root / ".step_00000003.job.partial", root / "step_00000003"
    temp.mkdir()
    (temp / "rank_0.bin").write_bytes(b"\x00" * 64)
    metadata = json.dumps({"step": 3, "rank": rank, "tensors": {}}).encode()
    synced: set[int] = set()
    events: list[str] = []
    problems: list[str] = []
    real = {"fsync": os.fsync, "rename": os.rename, "replace": os.replace}

    root_inode = root.stat().st_ino
    parent_synced: list[bool] = []  # after the rename: was COMPLETE still absent?

    def fsync(fd):
        with contextlib.suppress(OSError):
            inode = os.fstat(fd).st_ino
            synced.add(inode)
            if inode == root_inode and "rename" in events:
                parent_synced.append(not (final / "COMPLETE").exists())
        return real["fsync"](fd)

    def moved(kind):
        def move(src, dst, *args, **kwargs):
            if Path(src) == temp and Path(dst) == final:
                events.append("rename")
                meta = temp / "metadata.json"
                if not meta.exists() or meta.read_bytes() != metadata:
                    problems.append(
                        "when the directory was renamed, metadata.json did not yet hold the "
                        "metadata: write it (and fsync it) first"
                    )
                elif meta.stat().st_ino not in synced:
                    problems.append(
                        "metadata.json was not fsync'd before the rename: after a power cut the "
                        "renamed directory could hold an empty metadata file"
                    )
                if (temp / "COMPLETE").exists():
                    problems.append(
                        "COMPLETE existed before the rename; the marker is written last, in the "
                        "final directory, so it never marks an unpublished checkpoint"
                    )
            return real[kind](src, dst, *args, **kwargs)

        return move

    os.fsync, os.rename, os.replace = fsync, moved("rename"), moved("replace")
    try:
        with noticing_calls(_library_answers()) as noticed:
            try:
                fn(temp, final, metadata)
            except NotImplementedError:
                raise
            except Exception as error:  # noqa: BLE001 - reported to the learner
                problems.append(f"your commit raised {error!r}")
    finally:
        os.fsync, os.rename, os.replace = real["fsync"], real["rename"], real["replace"]
    if not problems:
        if "rename" not in events:
            problems.append(
                "the temporary directory was never renamed to the final name (os.rename or "
                "os.replace): a rename is the one atomic step that publishes the checkpoint"
            )
        elif temp.exists() or not (final / "metadata.json").exists():
            problems.append("after your commit the temporary directory should be gone")
        elif not any(parent_synced):
            problems.append(
                "the parent directory was not fsync'd between the rename and COMPLETE: a rename "
                "is durable only once its directory is, so after a power cut COMPLETE could "
                "survive while the rename is lost — open final.parent and os.fsync it"
            )
        elif not (final / "COMPLETE").exists():
            problems.append("write the COMPLETE marker into the final directory, last")
        elif complete_checkpoints(root) != [3]:
            problems.append("complete_checkpoints does not list the committed step")
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    return {"problems": problems, "used": list(noticed), "rank": rank}


@exercise("checkpointing.atomic_commit", title="The atomic commit", world_size=2)
def grade_atomic_commit(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(temp, final, metadata)``: publish a written checkpoint atomically (module doc)."""
    results = cluster.run(_commit_on_rank, fn)
    for r in results:
        if r["used"]:
            raise NotTheSkill(
                f"your commit calls {r['used'][0]} — the library's answer. Write the three "
                "steps: metadata (fsync), rename, marker"
            )
    for r in results:
        if r["problems"]:
            raise AssertionError(f"on rank {r['rank']}: {r['problems'][0]}")
    return GradeResult(
        True,
        f"Atomic on {cluster.world_size} ranks: metadata.json whole and fsync'd before the "
        "rename, COMPLETE written only after it, and the step listed as complete.",
    )


# -- quiz keys, from the library -----------------------------------------------------------------
def cluster_mtbf_hours_key(per_gpu_mtbf_years: float, n_gpus: int) -> float:
    """Hours between failures of a job on ``n_gpus`` GPUs that each fail once per given years."""
    from dtlab.cost.reliability import cluster_mtbf

    return cluster_mtbf(per_gpu_mtbf_years * 365 * 24 * 3600, n_gpus) / 3600


def async_interval_minutes_key(blocking_s: float, write_s: float, mtbf_hours: float) -> float:
    """Young/Daly interval (minutes) for asynchronous saves, whose cost term is the stall."""
    from dtlab.cost.reliability import young_daly_interval_async

    return young_daly_interval_async(blocking_s, write_s, mtbf_hours * 3600) / 60


def files_overlapping_key(numel: int, saved_ranks: int, new_ranks: int, new_rank: int) -> int:
    """How many files of an even ``saved_ranks``-way flat split a rank of ``new_ranks`` reads."""
    from dtlab.checkpoint.slices import Box, overlaps

    saved = -(-numel // saved_ranks)
    chunk = -(-numel // new_ranks)
    want = Box((numel,), (new_rank * chunk,), (min(chunk, numel - new_rank * chunk),), flat=True)
    return sum(
        overlaps(want, Box((numel,), (r * saved,), (min(saved, numel - r * saved),), flat=True))
        for r in range(saved_ranks)
    )
