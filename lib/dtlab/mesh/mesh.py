"""The device mesh on a running rank: one process group per dimension, and this rank's place.

Built on torch's ``DeviceMesh`` (``init_device_mesh``) rather than beside it, for two reasons: its
groups *are* the ones DTensor, FSDP2 (``fully_shard(mesh=...)``) and ``parallelize_module`` use,
so every parity test against PyTorch runs on the same ranks as ours; and torch creates the
groups in one agreed order on every rank, which is what keeps collectives from deadlocking.
What this class adds is the teaching surface: sentence-like names (``mesh.tp_group``,
``mesh.is_first_pp_stage``), plain rank lists for :mod:`dtlab.collectives` (which needs no
``new_group``), the expert-parallel groups carved out of ``dp`` (not a ``DeviceMesh``
dimension), a layout checked by :class:`~dtlab.mesh.layout.Layout` before anything starts, and a
refusal of a TP group that leaves a node (``ranks_per_node``, torchrun's ``LOCAL_WORLD_SIZE`` by
default) unless ``allow_tp_across_nodes=True``; ``mesh.describe()`` prints every group and the
nodes it spans (:mod:`~dtlab.mesh.rank_arithmetic`).

    mesh = Mesh(dp=2, tp=2)                 # inside cluster.run(...) on 4 ranks
    mesh.tp_ranks, mesh.tp_rank             # e.g. [2, 3], 1
    dist.all_reduce(x, group=mesh.tp_group)
    C.all_reduce(x, group=mesh.tp_ranks)    # the same ranks, on dtlab's counted rings

For every dimension ``d`` in ``pp, dp, cp, tp, ep, edp`` a mesh has ``d_group`` (the process
group), ``d_ranks`` (its global ranks, in coordinate order), ``d_rank`` (this rank's index in
it) and ``d_size``; ``edp`` is the expert-data-parallel group (see :mod:`~dtlab.mesh.layout`).
"""

from __future__ import annotations

import torch.distributed as dist

from dtlab.mesh.layout import ORDER, Layout
from dtlab.mesh.layout_rules import divisors
from dtlab.mesh.rank_arithmetic import rank_table, tp_leaves_node_problems
from dtlab.runtime.context import cached_groups, device, group_of, rank, world_size

DIMS = (*ORDER, "ep", "edp")


def _build_groups(layout: Layout, device_type: str):
    """A layout's ``DeviceMesh`` and its process group per dimension (collective: every rank
    builds the same ones in the same order; :class:`Mesh` caches them per process)."""
    from torch.distributed.device_mesh import init_device_mesh

    device_mesh = init_device_mesh(device_type, layout.shape, mesh_dim_names=ORDER)
    groups = {name: device_mesh.get_group(name) for name in ORDER}
    if layout.ep > 1:  # every rank enumerates every group, in the same order
        for dim in ("ep", "edp"):
            groups[dim], _ = dist.new_subgroups_by_enumeration(layout.groups(dim))
    else:  # one expert per rank group: EP is trivial, expert data parallel is plain dp
        groups["ep"], _ = dist.new_subgroups_by_enumeration(layout.groups("ep"))
        groups["edp"] = groups["dp"]
    return device_mesh, groups


class _Along:
    """``mesh.<dim>_<what>``: one descriptor per (dimension, attribute) pair."""

    def __init__(self, dim: str, what: str) -> None:
        self.dim, self.what = dim, what

    def __get__(self, mesh, owner=None):
        if mesh is None:
            return self
        return mesh._along(self.dim, self.what)


class Mesh:
    """A :class:`Layout` made real on this rank (every rank must build it, in the same order)."""

    def __init__(
        self,
        layout: Layout | None = None,
        *,
        device_type: str | None = None,
        ranks_per_node: int | None = None,
        allow_tp_across_nodes: bool = False,
        **degrees,
    ):
        if not dist.is_initialized():
            raise RuntimeError("a Mesh needs ranks: build it inside cluster.run(...) or torchrun")
        self.layout = layout if layout is not None else Layout(**degrees)
        self.layout.check(dist.get_world_size())
        self.rank = dist.get_rank()
        self.coordinates = self.layout.coordinates(self.rank)
        self.ranks_per_node = _ranks_per_node(ranks_per_node, dist.get_world_size())
        problems = tp_leaves_node_problems(self.layout.shape, ORDER, self.ranks_per_node)
        if problems and not allow_tp_across_nodes:
            raise ValueError(problems[0])
        if device_type is None:
            device_type = device().type
        key = ("mesh", device_type, self.layout.shape, self.layout.ep)
        self.device_mesh, groups = cached_groups(
            key, lambda: _build_groups(self.layout, device_type)
        )
        self._groups = dict(groups)
        self._ranks = {dim: self.layout.group_of(dim, self.rank) for dim in DIMS}

    def _along(self, dim: str, what: str):
        if what == "group":
            return self._groups[dim]
        if what == "ranks":
            return list(self._ranks[dim])
        if what == "size":
            return len(self._ranks[dim])
        return self.coordinates[dim]  # "rank": this rank's index within the group

    def __repr__(self) -> str:
        degrees = ", ".join(
            f"{n}={getattr(self.layout, n)}" for n in ("dp", "tp", "pp", "cp", "ep")
        )
        return f"Mesh({degrees}; rank {self.rank} at {self.coordinates})"

    def describe(self) -> str:
        """Every group of every dimension with the nodes it spans (:func:`rank_table`)."""
        return rank_table(self.layout.shape, ORDER, self.ranks_per_node)

    # -- nodes ---------------------------------------------------------------------------------
    def node_of(self, rank: int) -> int:
        """The node global ``rank`` runs on: torchrun numbers ranks node by node."""
        return rank // self.ranks_per_node

    def crosses_nodes(self, dim: str) -> bool:
        """Whether this rank's ``dim`` group spans more than one node — its collectives then run
        at the NIC's bandwidth instead of NVLink's. With ``tp`` innermost in the rank order a TP
        group whose size divides ``ranks_per_node`` stays inside a node (one of 3 on nodes of 8
        does not: ranks 6, 7, 8)."""
        return len({self.node_of(r) for r in self._ranks[dim]}) > 1

    # -- pipeline neighbours -------------------------------------------------------------------
    @property
    def is_first_pp_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_pp_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def pp_next_rank(self) -> int | None:
        """Global rank of the next pipeline stage (``None`` on the last)."""
        return None if self.is_last_pp_stage else self.pp_ranks[self.pp_rank + 1]

    @property
    def pp_prev_rank(self) -> int | None:
        """Global rank of the previous pipeline stage (``None`` on the first)."""
        return None if self.is_first_pp_stage else self.pp_ranks[self.pp_rank - 1]

    @property
    def is_first_tp_rank(self) -> bool:
        return self.tp_rank == 0


def split_into_groups(group_size: int) -> tuple[dist.ProcessGroup, list[list[int]]]:
    """Cut the world into consecutive blocks of ``group_size`` ranks (e.g. "nodes").

    Returns this rank's group and the rank lists of all blocks. Every rank must call it.
    The blocks are the TP groups of the mesh layout ``dp = world / group_size``,
    ``tp = group_size`` (:class:`Layout` puts ``tp`` innermost, so each TP group is a block of
    consecutive ranks): a one-dimensional special case of the device mesh.
    """
    n = world_size()
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(
            f"group size {group_size!r} must be a positive whole number; choose one of {divisors(n)}"
        )
    if n % group_size:
        raise ValueError(
            f"group size {group_size} does not divide world size {n}; choose one of {divisors(n)}"
        )
    blocks = Layout(dp=n // group_size, tp=group_size).groups("tp")
    mine = None
    for block in blocks:
        group = group_of(block)
        if rank() in block:
            mine = group
    assert mine is not None
    return mine, blocks


def _ranks_per_node(given: int | None, world: int) -> int:
    """Ranks per node: ``given``, else torchrun's ``LOCAL_WORLD_SIZE``, else all (one node)."""
    import os

    value = given if given is not None else int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if value < 1 or world % value:
        raise ValueError(
            f"ranks_per_node={value} does not divide the world of {world} ranks; every node "
            "must run the same number of ranks"
        )
    return value


for _dim in DIMS:
    for _what in ("group", "ranks", "rank", "size"):
        setattr(Mesh, f"{_dim}_{_what}", _Along(_dim, _what))
