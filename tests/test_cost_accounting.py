"""Small cost modules: NCCL protocols, weight sync and local SGD, MFU conventions, checkpoint cost."""

from __future__ import annotations

import math

import pytest

from dtlab.cost import bytes_sent_per_rank, young_daly_interval
from dtlab.cost.checkpoint_cost import (
    CHECKPOINT_BYTES_PER_PARAM,
    async_checkpoint_interval_s,
    async_checkpoint_stall_s,
    async_expected_waste_fraction,
    sync_checkpoint_cost_s,
    waste_if_async_is_priced_as_sync,
)
from dtlab.cost.crossover import dp_tokens_per_replica
from dtlab.cost.flops import flops_per_token
from dtlab.cost.mesh_reduction import mesh_rank
from dtlab.cost.mfu import attention_flops_share, mfu_report
from dtlab.cost.nccl_protocols import in_network_busbw, protocol_bandwidth
from dtlab.cost.weight_sync import local_sgd_bytes_per_step, weight_sync_seconds
from dtlab.mesh import Layout


def test_protocols_pay_their_flags():
    assert protocol_bandwidth("LL", 450e9) == pytest.approx(225e9)
    assert protocol_bandwidth("LL128", 128.0) == pytest.approx(120.0)
    assert protocol_bandwidth("Simple", 50e9) == 50e9
    with pytest.raises(ValueError, match="Simple, LL, LL128"):
        protocol_bandwidth("LL64", 1.0)


def test_in_network_busbw_exceeds_what_each_gpu_sent():
    report = in_network_busbw(1e9, 3.6e-3, 8)
    algbw = 1e9 / 3.6e-3
    assert report["busbw"] == pytest.approx(algbw * 1.75)
    # each GPU sends its whole buffer to be summed, then the 1/8 slice it reduced: 9/8 of it
    assert report["sent_per_gpu"] == pytest.approx(algbw * 9 / 8)
    assert report["busbw_over_sent"] == pytest.approx(14 / 9)


def test_local_sgd_divides_the_ring_bytes_by_the_inner_steps():
    ring = bytes_sent_per_rank("all_reduce", "ring", 4 * 10**6, 8)[0]
    assert local_sgd_bytes_per_step(1e6, 8, 1) == pytest.approx(ring)
    assert local_sgd_bytes_per_step(1e6, 8, 500) == pytest.approx(ring / 500)
    assert weight_sync_seconds(70e9, 400e9) == pytest.approx(0.35)


def test_mfu_conventions_agree_with_flops_per_token():
    report = mfu_report(1e6, 1000, 1e15, 7e9, 32, 4096, 4096)
    assert report["mfu_6n"] == pytest.approx(6 * 7e9 * 1e6 / 1e18)
    causal = flops_per_token(7e9, 32, 4096, 4096)
    assert report["mfu_causal_attention"] == pytest.approx(causal * 1e6 / 1e18)
    assert report["mfu_6n"] < report["mfu_causal_attention"] < report["mfu_full_attention"]
    assert report["hfu_recompute_full_attention"] == pytest.approx(
        report["mfu_full_attention"] * 8 / 6
    )
    share = attention_flops_share(7e9, 32, 4096, 4096)
    assert share == pytest.approx(6 * 32 * 4096 * 4096 / causal)


def test_async_checkpoints_price_the_stall_not_the_write():
    assert CHECKPOINT_BYTES_PER_PARAM == 12
    write = sync_checkpoint_cost_s(70e9, 100e9)
    stall = async_checkpoint_stall_s(70e9, 2048, 63e9)
    assert write == pytest.approx(8.4) and stall == pytest.approx(840e9 / 2048 / 63e9)
    mtbf = 50_000 * 3600 / 2048
    tau = async_checkpoint_interval_s(stall, write, mtbf)
    assert tau == pytest.approx(math.sqrt(2 * stall * mtbf))
    assert async_checkpoint_interval_s(stall, 600.0, mtbf) == 600.0  # one write outlasts tau*
    waste = async_expected_waste_fraction(tau, stall, write, mtbf)
    assert waste == pytest.approx(stall / tau + (tau / 2 + write) / mtbf)
    table = waste_if_async_is_priced_as_sync(70e9, 2048, 50_000 * 3600, 100e9, 63e9)
    assert table["sync_interval_s"] == pytest.approx(young_daly_interval(write, mtbf))
    assert table["async_waste"] < table["async_at_sync_interval_waste"] < table["sync_waste"]


def test_replica_tokens_and_mesh_coordinates():
    assert dp_tokens_per_replica(16 * 2**20, 128) == 131072
    layout = Layout(dp=4, tp=8, pp=2)
    assert mesh_rank(layout, pp=1, dp=2, tp=3) == 32 + 16 + 3
    with pytest.raises(ValueError, match="outside"):
        mesh_rank(layout, tp=8)


def test_tokens_per_second_at_mfu_inverts_model_flops_utilization():
    from dtlab.cost import model_flops_utilization
    from dtlab.cost.flops import tokens_per_second_at_mfu

    tps = tokens_per_second_at_mfu(0.4, 405e9, 16384, 989.4e12)
    assert model_flops_utilization(tps, 405e9, 989.4e12, 16384) == pytest.approx(0.4)
