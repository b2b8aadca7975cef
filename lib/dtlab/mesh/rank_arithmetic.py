"""Which global ranks form each group of a row-major mesh, and which groups leave a node.

A device mesh of shape ``(s_0, …, s_{k-1})`` numbers its ranks **row-major**: the last dimension
is innermost, so rank ``r`` sits at coordinate ``(r // stride_i) % s_i`` along dimension ``i``,
with ``stride_i = s_{i+1} · … · s_{k-1}``. A group along dimension ``i`` holds the ranks that
agree on every other coordinate: ``base + j · stride_i`` for ``j = 0 … s_i − 1``. This is what
torch's ``init_device_mesh(device, shape, mesh_dim_names=names)`` builds (its ``mesh`` is
``arange(world).view(shape)``), and what :class:`~dtlab.mesh.Layout` builds over
``(pp, dp, cp, tp)``.

Launchers number ranks node by node (torchrun: node ``k`` runs ranks ``k·g … k·g + g − 1``), so
only the dimensions with the smallest strides stay inside a node. The silent bug is a **reversed
shape**: ``init_device_mesh("cuda", (8, 2), mesh_dim_names=("tp", "dp"))`` on two nodes of 8 GPUs
runs, trains and gives the right loss — but puts ``tp`` outermost, with stride 2, so every TP
group is ``{0, 2, …, 14}``: half of it on each node, and every layer's all-reduce crosses the
network instead of NVLink (Shoeybi et al. 2019, Sec. 3, keep TP inside a node). Nothing errors;
the step is just several times slower. :func:`rank_table` prints the groups with their nodes so
the mistake is visible, and :class:`~dtlab.mesh.Mesh` refuses a TP group that leaves a node
unless it is asked to allow it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def strides_of(shape: Sequence[int]) -> list[int]:
    """Row-major strides: how far apart in global rank two neighbours along each dimension are."""
    return [math.prod(shape[i + 1 :]) for i in range(len(shape))]


def row_major_groups(shape: Sequence[int], names: Sequence[str]) -> dict[str, list[list[int]]]:
    """Every group along each named dimension of a row-major mesh (``init_device_mesh``'s).

    ``row_major_groups((2, 4), ("dp", "tp"))["tp"] == [[0, 1, 2, 3], [4, 5, 6, 7]]``;
    reversed, ``row_major_groups((4, 2), ("tp", "dp"))["tp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]``.
    """
    if len(shape) != len(names) or len(set(names)) != len(names):
        raise ValueError(
            f"shape {tuple(shape)} and names {tuple(names)} must have one distinct name per "
            "dimension"
        )
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
        raise ValueError(f"every mesh dimension must be a whole number >= 1, got {tuple(shape)}")
    world, strides = math.prod(shape), strides_of(shape)
    groups: dict[str, list[list[int]]] = {}
    for axis, name in enumerate(names):
        stride, size = strides[axis], shape[axis]
        bases = [r for r in range(world) if (r // stride) % size == 0]
        groups[name] = [[base + j * stride for j in range(size)] for base in bases]
    return groups


def group_containing(shape: Sequence[int], names: Sequence[str], dim: str, rank: int) -> list[int]:
    """The global ranks of ``rank``'s group along ``dim``."""
    return next(g for g in row_major_groups(shape, names)[dim] if rank in g)


def rank_in_group(
    shape: Sequence[int], names: Sequence[str], dim: str, rank: int, index: int
) -> int:
    """The global rank at position ``index`` of ``rank``'s group along ``dim``:
    ``rank − c·stride + index·stride`` for ``rank``'s coordinate ``c`` along ``dim``."""
    return group_containing(shape, names, dim, rank)[index]


def nodes_spanned(group: Sequence[int], ranks_per_node: int) -> int:
    """How many nodes a group's ranks sit on (ranks numbered node by node)."""
    if ranks_per_node < 1:
        raise ValueError(f"ranks_per_node must be >= 1, got {ranks_per_node}")
    return len({r // ranks_per_node for r in group})


def groups_leaving_a_node(
    shape: Sequence[int], names: Sequence[str], dim: str, ranks_per_node: int
) -> int:
    """How many of ``dim``'s groups span more than one node."""
    return sum(nodes_spanned(g, ranks_per_node) > 1 for g in row_major_groups(shape, names)[dim])


def cross_node_peer_share(
    shape: Sequence[int], names: Sequence[str], dim: str, ranks_per_node: int
) -> float:
    """Share of a ``dim`` group's neighbouring pairs (ring order) that sit on different nodes:
    the share of a ring collective's hops that run over the network instead of NVLink."""
    groups = row_major_groups(shape, names)[dim]
    hops = [(g[i], g[(i + 1) % len(g)]) for g in groups if len(g) > 1 for i in range(len(g))]
    if not hops:
        return 0.0
    crossing = sum(a // ranks_per_node != b // ranks_per_node for a, b in hops)
    return crossing / len(hops)


def rank_table(shape: Sequence[int], names: Sequence[str], ranks_per_node: int) -> str:
    """A printable table: per dimension its stride and every group, groups that leave a node
    marked ``<- spans N nodes``."""
    if math.prod(shape) % ranks_per_node:
        raise ValueError(
            f"{ranks_per_node} ranks per node does not divide the {math.prod(shape)} ranks of "
            f"mesh {tuple(shape)}"
        )
    groups, strides = row_major_groups(shape, names), strides_of(shape)
    lines = [
        f"mesh {dict(zip(names, shape, strict=True))} (row-major, last innermost), "
        f"{ranks_per_node} ranks per node"
    ]
    for axis, name in enumerate(names):
        lines.append(f"{name}: size {shape[axis]}, stride {strides[axis]}")
        for g in groups[name]:
            spans = nodes_spanned(g, ranks_per_node)
            mark = f"   <- spans {spans} nodes" if spans > 1 else ""
            lines.append(f"  {g}{mark}")
    return "\n".join(lines)


def tp_leaves_node_problems(
    shape: Sequence[int], names: Sequence[str], ranks_per_node: int, dim: str = "tp"
) -> list[str]:
    """A message for each way the ``dim`` (tensor-parallel) groups leave a node ([] when none)."""
    if dim not in names:
        return []
    leaving = groups_leaving_a_node(shape, names, dim, ranks_per_node)
    if not leaving:
        return []
    example = next(
        g for g in row_major_groups(shape, names)[dim] if nodes_spanned(g, ranks_per_node) > 1
    )
    stride = strides_of(shape)[list(names).index(dim)]
    size = shape[list(names).index(dim)]
    if stride > 1:
        why = f"{dim} has stride {stride}: put it last (innermost) in the mesh shape"
    elif size > ranks_per_node:
        why = f"{dim}={size} is larger than a node"
    else:
        why = f"{dim}={size} does not divide a node of {ranks_per_node} ranks"
    return [
        f"{leaving} {dim} group(s) span nodes of {ranks_per_node} ranks, e.g. {example}; "
        f"{why}, or pass allow_tp_across_nodes=True if you mean it"
    ]
