"""Save and load a sharded checkpoint: every rank writes only its pieces, reads only what it needs.

``save(root, step, state, extra)`` — called by every rank with its :class:`~.state.ShardedState`,
or with a plain ``{"model": model.state_dict(), "optim": opt.state_dict()}`` (:mod:`~.plain`:
its tensors are replicated, written by rank 0):

1. rank 0 opens the temporary directory (:func:`~.commit.begin`) and tells every rank its name
   (one small broadcast; the only collective of a save);
2. each rank writes ``rank_r.bin``: its sharded pieces, the replicated ones the ``writers`` policy
   gives it (:mod:`~.dedup`: rank 0 by default, spread by planned size with ``"balanced"``) and its
   own ``extra`` (RNG states, data-loader position) — nothing else, so the write is parallel and
   every rank moves 1/N of the sharded bytes;
3. rank 0 commits once every rank is done (:func:`~.commit.commit`).

``load(root, state)`` fills every piece of ``state`` in place. For each wanted piece it consults
``metadata.json`` (verified first: its CRC-32, :mod:`~.metadata`) for the stored pieces whose
boxes overlap it (:func:`plan_reads`), reads exactly
those byte ranges, verifies their CRC-32 and copies the overlap — so a checkpoint saved by FSDP on
4 ranks loads into FSDP on 2, into tensor parallel, or into one process, and a rank reads only
the bytes its slices need (``LoadResult.bytes_read`` counts them).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from dtlab.checkpoint.commit import begin, checked_dir, commit, final_dir, wait_for_ranks
from dtlab.checkpoint.dedup import WRITERS, plan_writers
from dtlab.checkpoint.metadata import NAME, read_metadata
from dtlab.checkpoint.plain import OBJECTS, flatten, load_targets
from dtlab.checkpoint.slices import Box, copy_overlap, overlaps
from dtlab.checkpoint.state import ShardedState
from dtlab.checkpoint.storage import CheckpointError, pickled, read_piece, unpickled, write_pieces
from dtlab.files import write_atomic

EXTRA = "__extra__"
SPECIAL = (EXTRA, OBJECTS)  # pickled pieces that are not tensors of the state


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def pieces_to_write(
    state: ShardedState, rank: int, writers: str = "lowest"
) -> list[tuple[str, torch.Tensor]]:
    """What this rank writes: its sharded pieces, and the replicated ones :mod:`~.dedup`'s
    ``writers`` policy gives it (``"lowest"``: rank 0 writes them all; ``"every"``: every
    replica; ``"balanced"``: DCP's smallest-plan-so-far rule — one small all-gather of every
    rank's item sizes, collective)."""
    if writers not in WRITERS:
        raise ValueError(f"writers={writers!r} is not a policy; choose one of {WRITERS}")
    mine = [(name, local) for name, local in state.items() if local.box.numel]
    if writers == "balanced":
        _, world = _rank_world()
        items = [(_item_key(n, local, rank), local.tensor.nbytes) for n, local in mine]
        plans: list = [None] * world
        if world > 1:
            dist.all_gather_object(plans, items)
        else:
            plans = [items]
        chosen = set(plan_writers(plans, "balanced").keys[rank])
        return [(n, local.tensor) for n, local in mine if _item_key(n, local, rank) in chosen]
    return [
        (name, local.tensor)
        for name, local in mine
        if writers == "every" or rank == 0 or not local.replicated
    ]


def _item_key(name: str, local, rank: int) -> str:
    """Equal on every holder of a replicated piece, unique for a sharded one."""
    return name if local.replicated else f"{name}@{rank}"


def start_save(root: str | Path, step: int) -> Path:
    """Every rank: agree on the temporary directory (rank 0 creates it); return its path."""
    rank, world = _rank_world()
    token = [None]
    if rank == 0:
        token[0] = secrets.token_hex(4)
        begin(Path(root), step, token[0])
    if world > 1:
        dist.broadcast_object_list(token, src=0)
    return Path(root) / f".step_{step:08d}.{token[0]}.partial"


def write_rank(
    temp: Path,
    rank: int,
    pieces: list[tuple[str, torch.Tensor]],
    boxes: dict,
    extra,
    before_flag: Callable[[], None] | None = None,
    extra_is_pickled: bool = False,
    objects: torch.Tensor | None = None,
) -> None:
    """Write ``rank_r.bin`` (fsync'd), then ``rank_r.json`` (atomic): this rank is done.

    ``before_flag`` runs between the two (fault injection kills a rank there: "during a save").
    ``extra`` is any picklable object (``extra_is_pickled``: already :func:`~.storage.pickled`,
    as an async save does during its snapshot). ``objects``: a plain state dict's pickled
    structure (:mod:`~.plain`), written by rank 0 only.
    """
    frozen = extra if extra_is_pickled else pickled(extra)
    more = [(OBJECTS, objects)] if objects is not None and rank == 0 else []
    entries = write_pieces(temp / f"rank_{rank}.bin", [*pieces, (EXTRA, frozen), *more])
    if before_flag is not None:
        before_flag()
    for e in entries:
        e["file"] = f"rank_{rank}.bin"
        if e["name"] not in SPECIAL:
            box, dtype = boxes[e["name"]]
            e["box"], e["global_shape"], e["tensor_dtype"] = box.as_json(), box.global_shape, dtype
    write_atomic(temp / f"rank_{rank}.json", json.dumps(entries))


def finish_save(temp: Path, step: int, world: int, timeout_s: float = 300.0) -> Path:
    """Rank 0: wait for every rank's flag, then merge the metadata and commit."""
    tensors: dict[str, dict] = {}
    extras: dict[str, dict] = {}
    objects: dict | None = None
    for r, entries in enumerate(wait_for_ranks(temp, world, timeout_s)):
        for e in entries:
            if e["name"] == EXTRA:
                extras[str(r)] = e
                continue
            if e["name"] == OBJECTS:
                objects = e
                continue
            t = tensors.setdefault(
                e["name"],
                {"global_shape": e["global_shape"], "dtype": e["tensor_dtype"], "pieces": []},
            )
            if any(p["box"] == e["box"] for p in t["pieces"]):
                continue  # a second copy of a replicated piece (writers="every"): one is enough
            t["pieces"].append(e)
    meta = {"step": step, "world_size": world, "tensors": tensors, "extras": extras}
    if objects is not None:
        meta["objects"] = objects
    return commit(temp, final_dir(temp.parent, step), meta)


def boxes_of(state: ShardedState) -> dict[str, tuple[Box, str]]:
    return {name: (local.box, str(local.tensor.dtype)) for name, local in state.items()}


def save(
    root: str | Path,
    step: int,
    state: ShardedState | Mapping,
    extra=None,
    before_flag: Callable[[], None] | None = None,
    writers: str = "lowest",
) -> Path:
    """Every rank: write this rank's pieces and ``extra``; return once the checkpoint is committed.

    ``state``: a :class:`~.state.ShardedState`, or a plain (nested) state dict (:mod:`~.plain`).
    ``writers``: who writes a replicated piece (:mod:`~.dedup`): ``"lowest"`` (rank 0, the
    default), ``"balanced"`` (DCP's default planner) or ``"every"`` (each replica, the naive save).
    """
    rank, world = _rank_world()
    state, structure = flatten(state)
    objects = None if structure is None else pickled(structure)
    temp = start_save(root, step)
    write_rank(
        temp,
        rank,
        pieces_to_write(state, rank, writers),
        boxes_of(state),
        extra,
        before_flag,
        False,
        objects,
    )
    final = finish_save(temp, step, world) if rank == 0 else final_dir(Path(root), step)
    if world > 1:
        dist.barrier()
    return final


@dataclass
class LoadResult:
    step: int
    extra: object  # this rank's (or, on more ranks than saved, rank r mod N's) extra
    saved_world_size: int
    bytes_read: int
    bytes_in_checkpoint: int
    path: Path


def plan_reads(metadata: dict, name: str, want: Box) -> list[dict]:
    """The stored pieces of ``name`` whose boxes overlap ``want`` (file, offset, box, ...)."""
    tensor = metadata["tensors"][name]
    return [
        e
        for e in tensor["pieces"]
        if overlaps(want, Box.from_json(tensor["global_shape"], e["box"]))
    ]


def load(root: str | Path, state: ShardedState | Mapping, step: int | None = None) -> LoadResult:
    """Fill ``state`` in place from the newest complete checkpoint (or ``step``'s).

    ``state``: a :class:`~.state.ShardedState`, or a plain (nested) state dict, which also
    receives the optimizer state and other values it lacked (:mod:`~.plain`). Two phases: the
    metadata's CRC-32 is checked, every needed piece is read, CRC-checked and assembled into a
    staging copy, and only when all of them are whole are the live tensors overwritten — so a
    failed load raises :class:`CheckpointError` (:class:`~.storage.CheckpointNotFound` when
    there is no checkpoint) and leaves ``state`` untouched.
    """
    rank, _ = _rank_world()
    path = checked_dir(root, step)
    meta = read_metadata(path)
    cache: dict[tuple[str, int], torch.Tensor] = {}
    staged: dict[str, torch.Tensor] = {}
    bytes_read = 0

    def fetch(e: dict) -> torch.Tensor:
        nonlocal bytes_read
        key = (e["file"], e["offset"])
        if key not in cache:
            cache[key] = read_piece(path / e["file"], e)
            bytes_read += e["nbytes"]
        return cache[key]

    def saved_structure() -> dict | None:  # a plain state dict's saved structure, if any
        return unpickled(fetch(meta["objects"])) if "objects" in meta else None

    state, put_into_target = load_targets(state, meta, saved_structure)
    for name in meta["tensors"]:
        if name.startswith("model/") and name not in state:
            raise CheckpointError(
                f"{path / NAME} holds tensor {name!r} that the model you load into "
                "lacks; build the model with the configuration it was saved with"
            )
    for name, local in state.items():
        if name not in meta["tensors"]:
            raise CheckpointError(f"tensor {name!r} is not in the checkpoint at {path}")
        stored = meta["tensors"][name]
        if tuple(stored["global_shape"]) != tuple(local.box.global_shape):
            raise CheckpointError(
                f"shape mismatch for tensor {name!r}: the checkpoint at {path} holds "
                f"{tuple(stored['global_shape'])}, the model wants "
                f"{tuple(local.box.global_shape)}; load into a model of the saved configuration"
            )
        filled, stage = 0, torch.empty_like(local.tensor, memory_format=torch.contiguous_format)
        for e in plan_reads(meta, name, local.box):
            src_box = Box.from_json(stored["global_shape"], e["box"])
            filled += copy_overlap(stage, local.box, fetch(e), src_box)
        if filled != local.box.numel:
            raise CheckpointError(
                f"tensor {name!r}: the pieces at {path} cover {filled} of the "
                f"{local.box.numel} elements this rank needs (a rank file's entry is missing)"
            )
        staged[name] = stage
    saved_world = meta["world_size"]
    extra_entry = meta["extras"].get(str(rank % saved_world))
    extra = None
    if extra_entry is not None:
        extra = unpickled(read_piece(path / extra_entry["file"], extra_entry))
    for name, stage in staged.items():  # every piece verified: now overwrite the live tensors
        state[name].tensor.copy_(stage)
    put_into_target()
    total = sum(e["nbytes"] for t in meta["tensors"].values() for e in t["pieces"])
    return LoadResult(meta["step"], extra, saved_world, bytes_read, total, path)
