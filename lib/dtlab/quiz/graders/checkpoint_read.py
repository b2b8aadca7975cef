"""Grader for lab 10's resharding read, and the library answers both lab 10 graders refuse.

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

It stands alone because the read is its own skill (intersecting flat ranges, executed on real
files); only the list of refused library answers is shared, and it lives here so that
:mod:`.checkpoint` (the atomic commit, and the names of both) imports it from below.
"""

from __future__ import annotations

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
