"""Mesh order: which dimension's groups stay inside a node, and what the wrong order costs."""

from __future__ import annotations

from dtlab.mesh import Layout
from dtlab.plan.mesh_order import compare_orders, crosses_nodes, groups_in_order, price_order


def test_groups_in_the_default_order_match_the_layout():
    degrees = {"pp": 2, "dp": 2, "tp": 2}
    layout = Layout(**degrees)
    groups = groups_in_order(degrees, ("pp", "dp", "cp", "tp"))
    for dim in ("pp", "dp", "tp"):
        assert sorted(map(sorted, groups[dim])) == sorted(map(sorted, layout.groups(dim)))


def test_tp_innermost_stays_inside_an_8_gpu_node_and_dp_crosses():
    degrees = {"dp": 4, "tp": 8}
    assert crosses_nodes(degrees, ("dp", "tp"), 8) == {"dp": True, "tp": False}
    assert crosses_nodes(degrees, ("tp", "dp"), 8) == {"dp": False, "tp": True}


def test_putting_the_heavy_dimension_across_nodes_runs_it_at_its_members_nics():
    degrees = {"dp": 2, "tp": 8}
    traffic = {"tp": 8e9, "dp": 1e9}  # bytes per rank per step
    right = price_order(traffic, degrees, ("dp", "tp"), 8)
    wrong = price_order(traffic, degrees, ("tp", "dp"), 8)
    assert right.seconds["tp"] == 8e9 / 450e9 and right.seconds["dp"] == 1e9 / 50e9
    # (tp, dp): a tp group strides 2, so 4 of its members share each node: 4 NICs' worth
    assert wrong.seconds["tp"] == 8e9 / (4 * 50e9) and wrong.seconds["dp"] == 1e9 / 450e9
    assert compare_orders(traffic, degrees, 8)[0].order == ("dp", "tp")
