"""The two-tier model's topology: one NIC per GPU on rails, or one per node; the spine."""

from __future__ import annotations

import pytest

from dtlab.cost import TwoTierCluster, flat_ring_all_reduce_time, hierarchical_all_reduce_time
from dtlab.cost.hierarchy import (
    all_to_all_spine_bandwidth,
    inter_node_bytes_per_nic,
    inter_node_bytes_per_rank,
)

GIB = float(1 << 30)


def test_rail_optimised_is_the_default_one_nic_per_gpu():
    cluster = TwoTierCluster(nodes=8, gpus_per_node=8)
    assert cluster.nics == 8 and cluster.rail_optimised
    assert cluster.node_network_bytes_per_s == pytest.approx(400e9)


def test_flat_ring_on_rails_carries_one_eighth_per_nic():
    rails = TwoTierCluster(nodes=8, gpus_per_node=8)
    one_nic = TwoTierCluster(nodes=8, gpus_per_node=8, nics_per_node=1)
    n = 64
    wire = 2 * (n - 1) / n * GIB
    assert flat_ring_all_reduce_time(GIB, rails) == pytest.approx(
        2 * (n - 1) * 5e-6 + wire / 8 / 50e9
    )
    assert flat_ring_all_reduce_time(GIB, one_nic) == pytest.approx(
        2 * (n - 1) * 5e-6 + wire / 50e9
    )
    assert inter_node_bytes_per_nic(GIB, rails, hierarchical=False) == pytest.approx(wire / 8)
    assert inter_node_bytes_per_nic(GIB, one_nic, hierarchical=False) == pytest.approx(wire)


def test_a_node_sends_about_2m_in_either_schedule():
    cluster = TwoTierCluster(nodes=16, gpus_per_node=8)
    flat = inter_node_bytes_per_rank(14e9, cluster, hierarchical=False) * 8
    hier = inter_node_bytes_per_rank(14e9, cluster, hierarchical=True) * 8
    assert flat == pytest.approx(2 * 127 / 128 * 14e9)
    assert hier == pytest.approx(2 * 15 / 16 * 14e9)
    assert flat / hier < 1.07


def test_hierarchical_flows_share_the_single_nic():
    one_nic = TwoTierCluster(nodes=4, gpus_per_node=8, nics_per_node=1)
    rails = TwoTierCluster(nodes=4, gpus_per_node=8)
    slow = hierarchical_all_reduce_time(GIB, one_nic) - hierarchical_all_reduce_time(GIB, rails)
    assert slow == pytest.approx(2 * 3 / 4 * GIB / 8 / 50e9 * 7)  # 8 flows at 1/8 vs at full


def test_only_all_to_all_crossing_an_oversubscribed_spine_slows_down():
    inside = TwoTierCluster(nodes=32, gpus_per_node=8, nodes_per_leaf=32, oversubscription=2)
    across = TwoTierCluster(nodes=64, gpus_per_node=8, nodes_per_leaf=32, oversubscription=2)
    blocking_free = TwoTierCluster(nodes=64, gpus_per_node=8, nodes_per_leaf=32)
    assert all_to_all_spine_bandwidth(inside) == pytest.approx(50e9)
    assert all_to_all_spine_bandwidth(across) == pytest.approx(50e9 / (2 * 32 / 63))
    assert all_to_all_spine_bandwidth(blocking_free) == pytest.approx(50e9)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"nodes": 2, "gpus_per_node": 8, "nics_per_node": 9}, "between 1 and"),
        ({"nodes": 2, "gpus_per_node": 8, "oversubscription": 0.5}, "down:up"),
        ({"nodes": 0, "gpus_per_node": 8}, ">= 1 node"),
    ],
)
def test_impossible_clusters_say_what_to_change(kwargs, words):
    with pytest.raises(ValueError, match=words):
        TwoTierCluster(**kwargs)
