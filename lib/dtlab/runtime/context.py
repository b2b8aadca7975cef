"""Who am I? The per-rank view that user functions see, on the Cluster and under torchrun.

Every helper here reads the live ``torch.distributed`` state, so the same function body works
in a dtlab Cluster worker, a ``torchrun`` process, or a plain single process (rank 0 of 1).

The runtime sits below the mesh (a mesh is groups over the runtime's ranks): this module builds
single groups (:func:`group_of`) and caches them; cutting the world into blocks by a layout
(:func:`dtlab.mesh.split_into_groups`, :class:`dtlab.mesh.Mesh`) lives in :mod:`dtlab.mesh`.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

_groups_by_ranks: dict[tuple[int, ...], dist.ProcessGroup] = {}
# Groups (and device meshes) built once per process and reused: see :func:`cached_groups`.
_cached: dict[tuple, object] = {}


def is_distributed() -> bool:
    """True inside an initialised process group (Cluster worker or torchrun)."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's global rank (0 outside a process group)."""
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    """Number of ranks in the default group (1 outside a process group)."""
    return dist.get_world_size() if is_distributed() else 1


def local_rank() -> int:
    """Rank within this machine: picks the GPU. Set by the Cluster and by torchrun."""
    return int(os.environ.get("LOCAL_RANK", rank()))


def device() -> torch.device:
    """The device this rank computes on: ``cuda:<local_rank>`` under NCCL, else CPU."""
    if is_distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", local_rank())
    return torch.device("cpu")


def barrier(group: dist.ProcessGroup | None = None) -> None:
    """Wait until every rank of ``group`` arrives (no-op outside a process group)."""
    if is_distributed():
        dist.barrier(group=group)


def group_of(ranks: list[int] | tuple[int, ...]) -> dist.ProcessGroup:
    """A process group over ``ranks``, created once and cached.

    ``torch.distributed.new_group`` is collective over the *whole* world: every rank must ask for
    the same groups in the same order, even ranks that are not members.
    """
    key = tuple(sorted(ranks))
    if not key or key[0] < 0 or key[-1] >= world_size() or len(set(key)) != len(key):
        raise ValueError(
            f"group ranks {list(ranks)} must be distinct ranks in 0..{world_size() - 1}"
        )
    if key not in _groups_by_ranks:
        _groups_by_ranks[key] = dist.new_group(list(key))
    return _groups_by_ranks[key]


def cached_groups(key: tuple, build):
    """``build()`` the first time ``key`` is asked for on this process's world group, then the
    same result again.

    Every ``new_group`` on gloo opens connections and a polling thread that live as long as the
    process, and a warm Cluster's ranks live for a whole notebook or test session: building a
    mesh's groups anew for every run leaked hundreds of threads per rank, which together kept
    idle ranks busy. Every rank builds the same meshes in the same order, so every rank hits or
    misses the cache together and the collective ``new_group`` calls stay matched. The key
    includes the world group itself, so a re-initialised world never reuses a dead group.
    """
    world = dist.distributed_c10d._get_default_group()
    full_key = (id(world), *key)
    entry = _cached.get(full_key)
    if entry is None or entry[0] is not world:
        entry = (world, build())
        _cached[full_key] = entry
    return entry[1]


def _forget_groups() -> None:
    """Drop cached groups when the process group is torn down."""
    _groups_by_ranks.clear()
    _cached.clear()
