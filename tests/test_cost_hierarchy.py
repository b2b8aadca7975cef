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


# -- two levels: NVLink inside, the network between --------------------------------------------
def test_two_level_all_reduce_in_sequence_is_the_hierarchical_all_reduce():
    from dtlab.cost.two_level import two_level_all_reduce

    for nodes in (2, 8, 32):
        cluster = TwoTierCluster(nodes=nodes, gpus_per_node=8)
        levels = two_level_all_reduce(GIB, cluster)
        assert levels.sequential_s == pytest.approx(hierarchical_all_reduce_time(GIB, cluster))
        assert levels.pipelined_s == max(levels.intra_s, levels.inter_s) < levels.sequential_s


def test_nvlink_limits_at_two_nodes_the_network_at_thirty_two():
    from dtlab.cost.two_level import (
        nodes_where_network_limits,
        two_level_all_gather,
        two_level_all_reduce,
    )

    for price in (two_level_all_gather, two_level_all_reduce):
        two = price(GIB, TwoTierCluster(nodes=2, gpus_per_node=8))
        many = price(GIB, TwoTierCluster(nodes=32, gpus_per_node=8))
        assert (two.limiting_level, many.limiting_level) == ("NVLink", "network")
    # β terms: (k-1)/k · M/8 / 50 GB/s > 7/8 · M / 450 GB/s  ⇔  (k-1)/k > 0.78  ⇔  k ≥ 5
    assert nodes_where_network_limits("all_gather", GIB) == 5
    assert nodes_where_network_limits("all_reduce", GIB) == 5
    assert nodes_where_network_limits("all_reduce", GIB, nics_per_node=1) == 2


def test_all_gather_levels_carry_their_share_of_the_bytes():
    from dtlab.cost.two_level import two_level_all_gather

    cluster = TwoTierCluster(nodes=4, gpus_per_node=8)
    levels = two_level_all_gather(GIB, cluster)
    intra_bytes = 7 / 8 * GIB  # each GPU takes in the other 7 GPUs' M/8 blocks
    inter_bytes = 3 / 4 * GIB / 8  # each NIC takes in 3 of its rail's 4 chunks of M/8 / 4
    assert levels.intra_s == pytest.approx(7 * 2e-6 + intra_bytes / 450e9)
    assert levels.inter_s == pytest.approx(3 * 5e-6 + inter_bytes / 50e9)


# -- ECMP: few elephant flows hashed onto many uplinks -----------------------------------------
def test_hashed_flows_leave_the_balls_in_bins_share_of_links_idle():
    from dtlab.cost.ecmp import ecmp_collisions, expected_idle_share

    result = ecmp_collisions(8, 8, trials=20000, seed=1)
    assert expected_idle_share(8, 8) == pytest.approx((7 / 8) ** 8)
    assert result.idle_share == pytest.approx(expected_idle_share(8, 8), abs=0.01)
    assert 2.3 < result.busiest_load < 2.9  # a third of the links idle, one carries ~2.6 flows
    assert result.slowdown == result.busiest_load


def test_more_queue_pairs_adaptive_routing_and_rails_each_cut_the_collision():
    from dtlab.cost.ecmp import ecmp_collisions, expected_idle_share

    hashed = ecmp_collisions(8, 8, seed=2)
    split = ecmp_collisions(8, 8, subflows_per_flow=4, seed=2)
    adaptive = ecmp_collisions(8, 8, placement="adaptive", seed=2)
    rails = ecmp_collisions(8, 8, placement="rail", seed=2)
    assert hashed.slowdown > split.slowdown > adaptive.slowdown == rails.slowdown == 1.0
    assert split.idle_share == pytest.approx(expected_idle_share(8, 8, 4), abs=0.01)
    assert adaptive.idle_share == rails.idle_share == 0.0
    over = ecmp_collisions(16, 8, placement="adaptive", seed=2)  # twice the flows: 2 per link
    assert over.busiest_load == 2.0 and over.slowdown == 1.0


def test_ecmp_rejects_an_unknown_placement():
    from dtlab.cost.ecmp import ecmp_collisions

    with pytest.raises(ValueError, match="choose one of"):
        ecmp_collisions(4, 4, placement="spray")
