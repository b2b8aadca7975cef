"""Spare pools: the simulated number of nodes out at once follows the Poisson tail that sizes them."""

from __future__ import annotations

import math

import pytest

from dtlab.cost.reliability import (
    elastic_throughput,
    nodes_down_mean,
    poisson_cdf,
    spare_pool_overhead,
    spare_pool_size,
)
from dtlab.faults.spares import share_of_time_above, simulate_nodes_down

HOUR, YEAR = 3600.0, 365 * 24 * 3600.0


def test_poisson_cdf_sums_the_terms():
    assert poisson_cdf(0, 2.0) == pytest.approx(math.exp(-2))
    assert poisson_cdf(2, 2.0) == pytest.approx(math.exp(-2) * (1 + 2 + 2))
    assert poisson_cdf(-1, 2.0) == 0.0


def test_spare_pool_is_the_smallest_count_covering_the_confidence():
    mean = nodes_down_mean(2048, YEAR, 24 * HOUR)  # 5.6 nodes out on average
    k = spare_pool_size(2048, YEAR, 24 * HOUR, 0.99)
    assert poisson_cdf(k, mean) >= 0.99 > poisson_cdf(k - 1, mean)
    assert k == 12 and spare_pool_size(2048, YEAR, 24 * HOUR, 0.999) == 14
    assert spare_pool_overhead(2048, 12) == pytest.approx(12 / 2060)


def test_simulated_fleet_matches_the_poisson_mean_and_tail():
    seen = simulate_nodes_down(512, YEAR, 48 * HOUR, 4 * YEAR, 6 * HOUR, seed=1)
    total = sum(seen.values())
    mean = sum(k * c for k, c in seen.items()) / total
    predicted = nodes_down_mean(512, YEAR, 48 * HOUR)  # 2.8
    assert mean == pytest.approx(predicted, rel=0.1)
    k = spare_pool_size(512, YEAR, 48 * HOUR, 0.99)
    assert share_of_time_above(seen, k) < 0.02  # the pool covers ~99 % of the time
    assert share_of_time_above(seen, 0) > 0.5  # with no spares the job is short most of the time


def test_elastic_shrinking_loses_a_whole_replica_per_node_out():
    assert elastic_throughput(2048, YEAR, 24 * HOUR, 16) == pytest.approx(
        1 - 16 * nodes_down_mean(2048, YEAR, 24 * HOUR) / 2048
    )
    with pytest.raises(ValueError, match="whole number of nodes"):
        elastic_throughput(100, YEAR, HOUR, 16)
