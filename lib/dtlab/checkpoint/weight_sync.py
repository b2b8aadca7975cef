"""RL weight sync on ranks: the trainer's FSDP shards become the inference engine's TP shards.

In on-policy RL post-training (PPO, GRPO) an inference engine generates rollouts with the latest
policy, so after each optimizer step the trainer's weights must reach it. The trainer holds them
sharded for training (FSDP: rank ``t`` of ``T`` holds a flat range of each weight); the engine
wants them sharded for inference (tensor parallel: engine rank ``i`` of ``I`` holds rows or
columns ``i/I`` of each matrix). This is a checkpoint that never touches storage — the same
boxes and overlaps as a resharding load (:mod:`~.slices`), moved over the network. Three ways,
for ``P`` parameters of ``b`` bytes:

``"funnel"`` (rank-0 funnel)
    The trainers send their shards to trainer 0, which assembles the whole model and sends a
    whole copy to each engine rank; each engine keeps its slice. Trainer 0 sends ``I·P·b``:
    the sync takes ``I`` times one copy's time on its link, and it must hold the whole model.

``"broadcast"`` (gather + broadcast)
    The same gather to trainer 0, then one broadcast over a group of trainer 0 and the engine
    ranks (OpenRLHF builds such a NCCL group spanning both jobs). A pipelined broadcast
    puts ``P·b`` on each link, whatever ``I`` is (here dtlab's chain: each rank but the last
    forwards ``P·b``); every engine rank still receives the whole model and throws ``(I−1)/I``
    of it away.

``"reshard"`` (resharded point to point)
    Each trainer sends each engine rank exactly the elements its shard shares with that engine
    rank's slice. Every element crosses the network once: ``P·b`` in all, ``P·b/T`` per trainer
    rank, ``P·b/I`` into each engine rank, no rank ever holding the whole model.
    It needs both sides to know both layouts.

:func:`sync_weights` runs one of them on real ranks, counting every byte from the messages
(``collectives="dtlab"``); :func:`dtlab.cost.weight_sync.weight_sync_bytes` is the formula the
counts are held to (``tests/test_checkpoint_weight_sync.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dtlab.checkpoint.slices import Box, flat_indices, flat_range, positions_in, split_along
from dtlab.comm import Communicator
from dtlab.runtime import context

METHODS = ("funnel", "broadcast", "reshard")


@dataclass(frozen=True)
class SyncLayout:
    """Who trains, who serves, and how each side shards every weight.

    ``shapes``: weight name → global shape; ``engine_dims``: weight name → the dimension the
    engine's tensor parallelism splits (0: column-parallel rows, 1: row-parallel columns)."""

    trainers: tuple[int, ...]
    engines: tuple[int, ...]
    shapes: dict[str, tuple[int, ...]]
    engine_dims: dict[str, int]

    def __post_init__(self) -> None:
        if set(self.trainers) & set(self.engines):
            raise ValueError(
                "a rank cannot be trainer and engine here: this is the disaggregated layout "
                "(colocated engines receive the weights in device memory, not over the network)"
            )
        for name, shape in self.shapes.items():
            dim = self.engine_dims[name]
            if shape[dim] % len(self.engines):
                raise ValueError(
                    f"{name}: dimension {dim} of {shape} does not split over {len(self.engines)} "
                    "engine ranks; choose an engine TP degree that divides it"
                )

    def trainer_box(self, name: str, t: int) -> Box:
        """Trainer ``t``'s FSDP shard of ``name``: a flat range, ``⌈numel/T⌉`` per rank."""
        numel = math.prod(self.shapes[name])
        chunk = -(-numel // len(self.trainers))
        return flat_range(self.shapes[name], min(t * chunk, numel), min((t + 1) * chunk, numel))

    def engine_box(self, name: str, i: int) -> Box:
        """Engine rank ``i``'s tensor-parallel slice of ``name``."""
        shape = self.shapes[name]
        return split_along(shape, self.engine_dims[name], i, len(self.engines))

    @property
    def num_params(self) -> int:
        return sum(math.prod(s) for s in self.shapes.values())


def _overlap(dest: Box, src: Box) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions in ``dest``, positions in ``src``) of the elements the two boxes share."""
    where = positions_in(src, flat_indices(dest))
    hit = where >= 0
    return hit.nonzero().reshape(-1), where[hit]


def sync_weights(
    layout: SyncLayout,
    method: str,
    shards: dict[str, torch.Tensor],
    dtype: torch.dtype = torch.float32,
) -> dict:
    """Every rank: move the trainers' ``shards`` (this trainer's flat pieces; ``{}`` on engines)
    into the engines' TP slices with ``method``. Returns ``{"slices": {name: tensor}}`` (filled on
    engine ranks) and ``"bytes_sent"``, counted from the messages this rank posted."""
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not a way to sync; choose one of {METHODS}")
    import torch.distributed as dist

    rank, device = dist.get_rank(), context.device()  # where engines receive (NCCL: the GPU)
    world = Communicator(collectives="dtlab", dim="world")
    slices: dict[str, torch.Tensor] = {}
    extra_bytes = 0
    if method == "reshard":
        for name in layout.shapes:
            for t, trainer in enumerate(layout.trainers):
                src = layout.trainer_box(name, t)
                for i, engine in enumerate(layout.engines):
                    dest = layout.engine_box(name, i)
                    at_dest, at_src = _overlap(dest, src)
                    if not len(at_dest):
                        continue
                    if rank == trainer:
                        world.send(shards[name].reshape(-1)[at_src].contiguous(), engine)
                    elif rank == engine:
                        out = slices.setdefault(
                            name, torch.empty(dest.lengths, dtype=dtype, device=device)
                        )
                        piece = torch.empty(len(at_dest), dtype=out.dtype, device=device)
                        world.recv(piece, trainer)
                        out.view(-1)[at_dest] = piece
        return {"slices": slices, "bytes_sent": world.comm_stats.bytes_sent}
    whole = _gather_to_first_trainer(layout, shards, world, rank)
    if method == "funnel":
        for name in layout.shapes:
            for i, engine in enumerate(layout.engines):
                if rank == layout.trainers[0]:
                    world.send(whole[name], engine)
                elif rank == engine:
                    full = torch.empty(layout.shapes[name], dtype=dtype, device=device)
                    world.recv(full, layout.trainers[0])
                    slices[name] = _slice(full, layout.engine_box(name, i))
    else:
        group = [layout.trainers[0], *layout.engines]
        others = [[r] for r in layout.trainers[1:]]
        bcast = Communicator.among([group, *others], collectives="dtlab", dim="sync")
        if rank in group:
            for name in layout.shapes:
                full = (
                    whole[name]
                    if rank == group[0]
                    else torch.empty(layout.shapes[name], dtype=dtype, device=device)
                )
                bcast.broadcast(full, name=f"sync {name}")
                if rank != group[0]:
                    slices[name] = _slice(full, layout.engine_box(name, layout.engines.index(rank)))
            extra_bytes = bcast.comm_stats.bytes_sent
    return {"slices": slices, "bytes_sent": world.comm_stats.bytes_sent + extra_bytes}


def _gather_to_first_trainer(layout: SyncLayout, shards, world: Communicator, rank: int) -> dict:
    """Trainers send their flat shards to trainer 0, which assembles each whole weight."""
    first = layout.trainers[0]
    whole: dict[str, torch.Tensor] = {}
    for name, shape in layout.shapes.items():
        for t, trainer in enumerate(layout.trainers):
            box = layout.trainer_box(name, t)
            if rank == first:
                mine = shards[name]
                full = whole.setdefault(
                    name, torch.empty(shape, dtype=mine.dtype, device=mine.device)
                )
                lo, n = box.offsets[0], box.lengths[0]
                if trainer == first:
                    full.view(-1)[lo : lo + n] = shards[name].reshape(-1)
                elif n:
                    world.recv(full.view(-1)[lo : lo + n], trainer)
            elif rank == trainer and box.numel:
                world.send(shards[name].reshape(-1).contiguous(), first)
    return whole


def _slice(full: torch.Tensor, box: Box) -> torch.Tensor:
    index = tuple(slice(o, o + n) for o, n in zip(box.offsets, box.lengths, strict=True))
    return full[index].clone()


def trainer_shards(layout: SyncLayout, weights: dict[str, torch.Tensor], rank: int) -> dict:
    """This rank's FSDP shards of ``weights`` (``{}`` if it is not a trainer)."""
    if rank not in layout.trainers:
        return {}
    t = layout.trainers.index(rank)
    out = {}
    for name, w in weights.items():
        box = layout.trainer_box(name, t)
        out[name] = w.reshape(-1)[box.offsets[0] : box.offsets[0] + box.lengths[0]].clone()
    return out


def engine_slice(layout: SyncLayout, weights: dict[str, torch.Tensor], rank: int) -> dict:
    """What engine ``rank`` must end with: its TP slice of each whole weight (the reference)."""
    i = layout.engines.index(rank)
    return {name: _slice(w, layout.engine_box(name, i)) for name, w in weights.items()}
