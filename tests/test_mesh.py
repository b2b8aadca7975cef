"""The mesh: layouts checked before start, and groups that match torch's ``init_device_mesh``."""

from __future__ import annotations

import pytest

import dtlab
from dtlab.mesh import Layout, Mesh, layouts_of


def test_every_layout_of_eight_ranks_partitions_the_ranks_along_every_dimension():
    layouts = layouts_of(8)
    assert len(layouts) == 35  # 20 ways to factor 8 over (pp, dp, cp, tp), ep dividing dp
    for layout in layouts:
        for dim in ("pp", "dp", "cp", "tp", "ep", "edp"):
            groups = layout.groups(dim)
            assert sorted(r for g in groups for r in g) == list(range(8)), (layout, dim)
            size = layout.dp // layout.ep if dim == "edp" else getattr(layout, dim)
            assert {len(g) for g in groups} == {size}
        for rank in range(8):
            assert layout.rank_at(**layout.coordinates(rank)) == rank


def test_tp_is_innermost_and_pp_outermost():
    layout = Layout(pp=2, dp=2, tp=2)
    assert layout.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]  # consecutive: one node
    assert layout.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize(
    ("layout", "world", "message"),
    [
        (dict(dp=2, tp=3), 8, "uses 6 ranks, not 8; the degrees must multiply to 8"),
        (dict(dp=2, tp=2), 8, "with these tp, pp and cp, dp=4 fills 8 ranks"),
        (dict(dp=3, ep=2), 6, r"ep=2 does not divide dp=3.*choose ep from \[1, 3\]"),
        (dict(dp=0), 1, "every degree is a whole number"),
    ],
)
def test_impossible_layouts_are_refused_before_any_process_starts(layout, world, message):
    with pytest.raises(ValueError, match=message):
        Layout(**layout).check(world)


def _meshes_side_by_side_with_torch(layouts: list[Layout]) -> list[str]:
    import torch.distributed as dist

    mismatches = []
    for layout in layouts:
        mesh = Mesh(layout)
        for dim in ("pp", "dp", "cp", "tp", "ep", "edp"):
            torch_ranks = dist.get_process_group_ranks(getattr(mesh, f"{dim}_group"))
            ours = getattr(mesh, f"{dim}_ranks")
            if torch_ranks != ours or ours[getattr(mesh, f"{dim}_rank")] != dist.get_rank():
                mismatches.append(f"{layout} {dim}: torch {torch_ranks}, ours {ours}")
        if mesh.is_first_pp_stage != (mesh.pp_prev_rank is None):
            mismatches.append(f"{layout}: pipeline neighbours")
    return mismatches


def test_mesh_groups_match_torch_init_device_mesh_for_every_layout_of_eight_ranks():
    with dtlab.Cluster(8, device="cpu", timeout=240) as cluster:
        for mismatches in cluster.run(_meshes_side_by_side_with_torch, layouts_of(8)):
            assert mismatches == []


def _threads_after_meshes(n: int) -> int:
    import os

    from dtlab.mesh import Mesh

    for _ in range(n):
        Mesh(dp=2, tp=2)
    return len(os.listdir(f"/proc/{os.getpid()}/task"))


def test_building_the_same_mesh_again_makes_no_new_groups(cluster4):
    """A warm cluster's ranks build meshes for a whole session: every new gloo group opens
    connections and a polling thread that live as long as the rank, so a mesh built anew per
    run leaked threads until idle ranks used most of a core. The groups are built once."""
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("counts threads in /proc")
    first = cluster4.run(_threads_after_meshes, 1)
    again = cluster4.run(_threads_after_meshes, 10)
    assert [a <= f for f, a in zip(first, again, strict=True)] == [True] * 4, (first, again)


# -- rank arithmetic: which ranks form each group, and the reversed shape -----------------------


def test_reversed_shape_puts_every_tp_group_across_nodes_without_an_error():
    from dtlab.mesh.rank_arithmetic import (
        cross_node_peer_share,
        groups_leaving_a_node,
        row_major_groups,
    )

    right = row_major_groups((2, 8), ("dp", "tp"))  # two nodes of 8: tp innermost
    wrong = row_major_groups((8, 2), ("tp", "dp"))  # the same degrees, the shape reversed
    assert right["tp"] == [list(range(8)), list(range(8, 16))]
    assert wrong["tp"] == [list(range(0, 16, 2)), list(range(1, 16, 2))]
    assert groups_leaving_a_node((2, 8), ("dp", "tp"), "tp", 8) == 0
    assert groups_leaving_a_node((8, 2), ("tp", "dp"), "tp", 8) == 2
    assert cross_node_peer_share((8, 2), ("tp", "dp"), "tp", 8) == 2 / 8  # 2 of 8 ring hops


def test_rank_table_marks_only_the_groups_that_span_nodes():
    from dtlab.mesh import rank_table

    table = rank_table((2, 4), ("tp", "dp"), ranks_per_node=4)
    assert "  [0, 4]   <- spans 2 nodes" in table
    assert "  [0, 1, 2, 3]\n" in table  # dp, inside node 0, unmarked
    assert table.count("<- spans") == 4


def _torch_groups_of_a_reversed_mesh() -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("tp", "dp"))
    return {d: dist.get_process_group_ranks(mesh.get_group(d)) for d in ("tp", "dp")}


def test_row_major_groups_are_the_groups_torch_init_device_mesh_builds(cluster4):
    from dtlab.mesh.rank_arithmetic import group_containing

    for rank, groups in enumerate(cluster4.run(_torch_groups_of_a_reversed_mesh)):
        for dim in ("tp", "dp"):
            assert groups[dim] == group_containing((2, 2), ("tp", "dp"), dim, rank)


def _mesh_with_tp(tp: int, ranks_per_node: int, allow: bool) -> list[int]:
    from dtlab.mesh import Mesh

    mesh = Mesh(dp=4 // tp, tp=tp, ranks_per_node=ranks_per_node, allow_tp_across_nodes=allow)
    return mesh.tp_ranks


def test_mesh_refuses_a_tp_group_that_leaves_a_node_unless_asked(cluster4):
    from dtlab.runtime.errors import RankError

    with pytest.raises(RankError, match=r"1 tp group\(s\) span nodes of 2 ranks.*allow_tp"):
        cluster4.run(_mesh_with_tp, 4, 2, False)
    assert cluster4.run(_mesh_with_tp, 4, 2, True) == [[0, 1, 2, 3]] * 4
    assert cluster4.run(_mesh_with_tp, 2, 2, False) == [[0, 1], [0, 1], [2, 3], [2, 3]]
