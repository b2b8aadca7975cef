"""Graders for lab 10 (checkpointing): the resharding read and the atomic commit.

``checkpointing.resharding_read`` — ``fn(pieces, want) -> [(i, start, stop, dest), ...]``:
``pieces`` lists what the checkpoint holds of one tensor as ``(file, first, end)`` flat ranges
(that piece of the file holds elements ``first..end`` of the flattened tensor; a file may hold
several pieces); ``want = (lo, hi)`` is the range this rank needs under its new layout. Return
the reads: from piece ``i`` take its elements ``start..stop`` (0 = the piece's first element)
and place them at offset ``dest`` of this rank's buffer. Graded on every rank: the ranks write a real sharded checkpoint
(:func:`dtlab.checkpoint.save`) of several tensors cut at irregular points, then for every rank
of several new FSDP degrees each cluster rank executes the learner's reads on the real files —
each piece read once, CRC-checked — and the assembled buffer must equal the slice; no read may
be empty or overlap another, so the rank reads exactly what it needs. Calling the library's
``plan_reads``/``copy_overlap`` is refused.

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
from dtlab.quiz.graders.watch import noticing_calls

# (name, numel, cut points of the saved layout: each cluster rank saves the pieces r, r+N, ...)
SAVED = (("w", 23, (0, 7, 12, 23)), ("b", 10, (0, 1, 9, 10)), ("e", 40, (0, 10, 20, 30, 40)))
NEW_DEGREES = (1, 3, 4, 5)


def _library_answers() -> dict[Callable, str]:
    from dtlab.checkpoint import commit, save_load, slices

    return {
        save_load.plan_reads: "dtlab.checkpoint.plan_reads",
        slices.copy_overlap: "dtlab.checkpoint.copy_overlap",
        commit.commit: "dtlab.checkpoint.commit.commit",
    }


def _value(name: str, numel: int):
    import torch

    return torch.arange(numel, dtype=torch.float32) * 10 + len(name)


def _save_irregular(root: str) -> None:
    """Every cluster rank saves its share of the pieces of each tensor in ``SAVED``."""
    import torch.distributed as dist

    from dtlab.checkpoint import Local, flat_range, save

    rank, world = dist.get_rank(), dist.get_world_size()
    state = {}
    for name, numel, cuts in SAVED:
        for i, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
            if i % world == rank:
                state[f"{name}/{i}"] = Local(
                    _value(name, numel)[a:b].clone(), flat_range((numel,), a, b)
                )
    # one tensor per piece keeps the exercise 1-D; the metadata maps them back below
    save(root, 1, state)


def _pieces_of(meta: dict, name: str) -> list[tuple[str, int, int, dict]]:
    """``(file, first, end, entry)`` for every stored piece of ``name``, in a fixed order."""
    pieces = []
    for key, t in meta["tensors"].items():
        if key.split("/")[0] == name:
            for e in t["pieces"]:
                first = e["box"]["offsets"][0]
                pieces.append((e["file"], first, first + e["box"]["lengths"][0], e))
    return sorted(pieces, key=lambda p: (p[0], p[1]))


def _execute(plan, pieces, path: Path, want, name: str):
    """Run the learner's reads on the real files: (buffer, times each element was written) or
    a problem string."""
    import torch

    from dtlab.checkpoint.storage import read_piece

    buf = torch.full((want[1] - want[0],), float("nan"))
    covered = torch.zeros(want[1] - want[0], dtype=torch.int64)
    for item in plan:
        try:
            i, start, stop, dest = (int(v) for v in item)
        except (TypeError, ValueError):
            return f"return (piece index, start, stop, dest) tuples, got {item!r}"
        if not 0 <= i < len(pieces):
            return f"piece index {i} does not exist: there are {len(pieces)} pieces"
        file, first, end, entry = pieces[i]
        if not 0 <= start < stop <= end - first:
            return (
                f"{name}, want {want}: read {item} takes elements {start}..{stop} of piece {i} "
                f"({file} holds {first}..{end}, {end - first} elements); list only non-empty "
                "reads inside a piece"
            )
        if dest < 0 or dest + stop - start > len(buf):
            return (
                f"{name}, want {want}: dest {dest} + {stop - start} elements falls outside "
                f"this rank's {len(buf)}-element buffer"
            )
        buf[dest : dest + stop - start] = read_piece(path / file, entry)[start:stop]
        covered[dest : dest + stop - start] += 1
    return buf, covered


def _read_on_rank(fn: Callable, root: str) -> dict:
    import torch
    import torch.distributed as dist

    from dtlab.checkpoint import read_metadata
    from dtlab.checkpoint.commit import final_dir

    rank, world = dist.get_rank(), dist.get_world_size()
    path = final_dir(Path(root), 1)
    meta = read_metadata(path)
    problems, used, reads = [], [], 0
    for name, numel, _ in SAVED:
        pieces = _pieces_of(meta, name)
        offered = [(f, a, b) for f, a, b, _ in pieces]
        for degree in NEW_DEGREES:
            chunk = -(-numel // degree)
            for target in range(rank, degree, world):
                want = (min(target * chunk, numel), min((target + 1) * chunk, numel))
                with noticing_calls(_library_answers()) as noticed:
                    try:
                        plan = list(fn(list(offered), want))
                    except NotImplementedError:
                        raise
                    except Exception as error:  # noqa: BLE001 - reported to the learner
                        problems.append(f"{name}, want {want}: your function raised {error!r}")
                        continue
                used += noticed
                done = _execute(plan, pieces, path, want, name)
                if isinstance(done, str):
                    problems.append(done)
                    continue
                buf, covered = done
                reads += len(plan)
                if (covered > 1).any():
                    problems.append(
                        f"{name}, want {want}: some elements are read twice; each element of "
                        "the wanted range comes from exactly one piece"
                    )
                elif not torch.equal(buf, _value(name, numel)[want[0] : want[1]]):
                    missing = int((covered == 0).sum())
                    problems.append(
                        f"{name}: rank {target} of {degree} wants elements {want} of {offered}; "
                        f"your reads {plan} fill it wrongly ({missing} elements never written). "
                        "For each piece (file, first, end): overlap = max(first, lo)..min(end, "
                        "hi); read overlap - first, place at overlap - lo"
                    )
    return {"problems": problems, "used": used, "rank": rank, "reads": reads}


@exercise("checkpointing.resharding_read", title="The resharding read", world_size=2)
def grade_resharding_read(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(pieces, want) -> [(i, start, stop, dest)]``: which slices to read (module doc)."""
    root = tempfile.mkdtemp(prefix="dtlab-grade-ckpt-")
    try:
        cluster.run(_save_irregular, root)
        results = cluster.run(_read_on_rank, fn, root)
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    for r in results:
        if r["used"]:
            raise NotTheSkill(
                f"your read calls {r['used'][0]} — the library's answer. Write it: intersect "
                "each stored range with the wanted one"
            )
    for r in results:
        if r["problems"]:
            raise AssertionError(f"on rank {r['rank']}: {r['problems'][0]}")
    total = sum(r["reads"] for r in results)
    return GradeResult(
        True,
        f"Exact: {len(SAVED)} tensors saved by {cluster.world_size} ranks at irregular cuts, "
        f"reloaded for every rank of FSDP degrees {NEW_DEGREES}; {total} piece reads on real "
        "files, CRC-checked, each element read once.",
    )


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
