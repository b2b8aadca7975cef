"""Every crossover threshold balances compute time against the collective's own α-β time."""

from __future__ import annotations

import math

import pytest

from dtlab.cost import Link, TwoTierCluster, collective_time, flat_ring_all_reduce_time
from dtlab.cost.crossover import (
    comm_hidden_fraction,
    cp_min_block_tokens,
    critical_intensity,
    dp_bus_bandwidth,
    dp_min_tokens_per_gpu,
    ep_compute_to_comm_ratio,
    ep_min_expert_ffn,
    pp_compute_to_p2p_ratio,
    tp_max_degree,
)
from dtlab.cost.hardware import H100_SXM, IB_NDR_400, NVLINK4_H100

C = H100_SXM.bf16_dense_flops


def _no_latency(link: Link) -> Link:
    return Link(0.0, link.bandwidth_bytes_per_s)


def test_critical_intensity_is_peak_over_bandwidth():
    assert critical_intensity("h100_sxm", "nvlink4") == pytest.approx(989.4e12 / 450e9)
    assert critical_intensity(H100_SXM, 50e9) == pytest.approx(19_788)


@pytest.mark.parametrize("nodes, nics", [(1, None), (16, None), (16, 1)])
def test_dp_threshold_equals_backward_and_the_cluster_all_reduce(nodes, nics):
    cluster = TwoTierCluster(
        nodes, 8, _no_latency(NVLINK4_H100), _no_latency(IB_NDR_400), nics_per_node=nics
    )
    params = 7e9
    tokens = dp_min_tokens_per_gpu("h100_sxm", cluster, grad_bytes=2)
    backward = 4 * params * tokens / C
    assert backward == pytest.approx(flat_ring_all_reduce_time(2 * params, cluster))


def test_rails_cut_the_dp_threshold_eightfold_and_fp32_doubles_it():
    rails, one_nic = TwoTierCluster(16, 8), TwoTierCluster(16, 8, nics_per_node=1)
    assert dp_bus_bandwidth(rails) == pytest.approx(400e9)
    assert dp_min_tokens_per_gpu("h100_sxm", one_nic) == pytest.approx(
        8 * dp_min_tokens_per_gpu("h100_sxm", rails)
    )
    assert dp_min_tokens_per_gpu("h100_sxm", rails, grad_bytes=4) == pytest.approx(
        2 * dp_min_tokens_per_gpu("h100_sxm", rails)
    )


def test_tp_max_degree_is_the_last_degree_whose_all_reduce_hides():
    ffn, d, tokens = 28672, 8192, 4096
    link = _no_latency(NVLINK4_H100)

    def hidden(t: int) -> bool:
        compute = 4 * d * ffn / t * tokens / C
        return compute >= collective_time("all_reduce", "ring", 2 * d * tokens, t, link)

    best = tp_max_degree(ffn, "h100_sxm", NVLINK4_H100)
    assert hidden(best) and not hidden(best + 1)
    assert tp_max_degree(ffn, "h100_sxm", "ib_ndr_400") < best


def test_cp_block_balances_scores_against_the_next_kv_block():
    d, kv = 4096, 1024
    q = cp_min_block_tokens(d, kv, "h100_sxm", "nvlink4")
    k = 8192
    assert 4 * q * k * d / C == pytest.approx(2 * k * kv * 2 / 450e9)
    assert cp_min_block_tokens(d, kv, "h100_sxm", "nvlink4", causal=True) == pytest.approx(2 * q)


def test_ep_ratio_is_one_at_the_minimum_expert_width():
    width = ep_min_expert_ffn(64, "h100_sxm", "ib_ndr_400", act_bytes=1)
    assert ep_compute_to_comm_ratio(width, 64, "h100_sxm", "ib_ndr_400", 1) == pytest.approx(1)
    per_token_flops = 2 * 3 * 7168 * width
    per_token_bytes = 2 * 7168 * 1 * 63 / 64
    assert per_token_flops / C == pytest.approx(per_token_bytes / 50e9)
    assert math.isinf(ep_compute_to_comm_ratio(2048, 1, "h100_sxm", "nvlink4"))


def test_pp_ratio_counts_a_stage_forward_against_one_activation_send():
    ratio = pp_compute_to_p2p_ratio(8192, 10, "h100_sxm", "ib_ndr_400")
    assert ratio == pytest.approx((24 * 10 * 8192**2 / C) / (2 * 8192 / 50e9))


def test_hidden_fraction_and_bad_input():
    assert comm_hidden_fraction(2.0, 1.0) == 1.0
    assert comm_hidden_fraction(1.0, 4.0) == 0.25
    with pytest.raises(ValueError, match="must be > 0"):
        tp_max_degree(0, "h100_sxm", "nvlink4")
    with pytest.raises(KeyError, match="choose one of"):
        critical_intensity("h100_sxm", "nvlink9")
