"""dtlab.cost: alpha-beta links, hardware presets, busbw, FLOPs/MFU, bubbles, reliability."""

from __future__ import annotations

import math

import pytest

from dtlab import cost
from dtlab.cost import hardware
from dtlab.cost.alpha_beta import Link, ring_allreduce_time


def test_link_time_is_latency_per_message_plus_bytes_over_bandwidth():
    link = Link(alpha_s=1e-5, bandwidth_bytes_per_s=1e9)
    assert link.beta_s_per_byte == pytest.approx(1e-9)
    assert link.time(1_000_000) == pytest.approx(1e-5 + 1e-3)
    assert link.time(1_000_000, messages=4) == pytest.approx(4e-5 + 1e-3)
    assert link.crossover_bytes() == pytest.approx(1e4)


def test_ring_allreduce_time_is_2_n_minus_1_alphas_plus_2_n_minus_1_over_n_bytes():
    link = Link(alpha_s=2e-6, bandwidth_bytes_per_s=100e9)
    nbytes, n = 1 << 30, 8
    expected = 2 * 7 * 2e-6 + 2 * 7 / 8 * nbytes / 100e9
    assert ring_allreduce_time(nbytes, n, link) == pytest.approx(expected)
    assert ring_allreduce_time(nbytes, 1, link) == 0.0
    # The bandwidth term tends to 2·nbytes·β however many ranks join the ring.
    big_ring = ring_allreduce_time(nbytes, 4096, Link(0.0, 100e9))
    assert big_ring == pytest.approx(2 * nbytes / 100e9, rel=1e-3)


def test_link_rejects_nonpositive_bandwidth_with_an_example():
    with pytest.raises(ValueError, match="50e9"):
        Link(alpha_s=1e-6, bandwidth_bytes_per_s=0)


def test_nvlink4_preset_is_450_gb_per_direction_not_the_900_bidirectional_headline():
    assert hardware.NVLINK4_H100.bandwidth_bytes_per_s == 450e9
    assert hardware.NVLINK3_A100.bandwidth_bytes_per_s == 300e9
    assert hardware.link("ib_ndr_400").bandwidth_bytes_per_s == 400e9 / 8
    assert hardware.link("ethernet_100g").bandwidth_bytes_per_s == 12.5e9
    assert hardware.link("ethernet_200g").bandwidth_bytes_per_s == 25e9
    assert 60e9 < hardware.PCIE_GEN5_X16.bandwidth_bytes_per_s < 64e9
    assert "fit" in hardware.CPU_GLOO_LOOPBACK.name


def test_gpu_table_quotes_dense_bf16_and_knows_sparse_is_double():
    h100, h200 = hardware.gpu("h100_sxm"), hardware.gpu("h200_sxm")
    assert h100.bf16_dense_flops == pytest.approx(989e12, rel=1e-3)
    assert h100.bf16_sparse_flops == pytest.approx(2 * h100.bf16_dense_flops, rel=1e-4)
    assert h100.fp8_dense_flops == pytest.approx(1979e12, rel=1e-3)
    assert hardware.gpu("a100_80gb").bf16_dense_flops == 312e12
    assert hardware.gpu("a100_40gb").fp8_dense_flops is None
    assert h200.bf16_dense_flops == h100.bf16_dense_flops
    assert [
        hardware.gpu(n).hbm_bytes for n in ("a100_40gb", "a100_80gb", "h100_sxm", "h200_sxm")
    ] == [
        40960 * 2**20,  # HBM capacities: nvidia-smi's totals in MiB (the module docstring)
        81920 * 2**20,
        81559 * 2**20,
        143771 * 2**20,
    ]
    assert h200.hbm_bandwidth_bytes_per_s > h100.hbm_bandwidth_bytes_per_s


def test_the_fabric_presets_carry_gpu_nics_and_their_speed():
    selene = hardware.fabric("dgx_a100_hdr200")
    assert (selene.gpu, selene.nics_per_node, selene.nic.bandwidth_bytes_per_s) == (
        "a100_80gb",
        8,
        25e9,
    )
    h800 = hardware.gpu(hardware.fabric("h800_ib400").gpu)
    assert h800.nvlink.bandwidth_bytes_per_s == 200e9  # 400 GB/s bidirectional
    assert h800.bf16_dense_flops == hardware.H100_SXM.bf16_dense_flops
    assert hardware.gpu("b200").bf16_dense_flops > 2 * hardware.H100_SXM.bf16_dense_flops
    with pytest.raises(KeyError, match="dgx_h100_ndr400"):
        hardware.fabric("dgx_h100")


def test_unknown_preset_names_the_choices():
    with pytest.raises(KeyError, match="nvlink4"):
        hardware.link("nvlink6")
    with pytest.raises(KeyError, match="h100_sxm"):
        hardware.gpu("gb300")


@pytest.mark.parametrize(
    "op, n, factor",
    [
        ("all_reduce", 8, 2 * 7 / 8),
        ("allreduce", 4, 1.5),
        ("all_gather", 8, 7 / 8),
        ("reduce_scatter", 4, 3 / 4),
        ("all_to_all", 8, 7 / 8),
        ("alltoall", 2, 1 / 2),
        ("broadcast", 8, 1.0),
        ("reduce", 8, 1.0),
        ("send_recv", 2, 1.0),
        ("all_reduce", 1, 0.0),
    ],
)
def test_busbw_factor_follows_nccl_tests(op, n, factor):
    assert cost.busbw_factor(op, n) == pytest.approx(factor)


def test_busbw_is_algbw_times_factor():
    nbytes, seconds = 1 << 30, 0.01
    assert cost.algbw(nbytes, seconds) == pytest.approx(nbytes / seconds)
    assert cost.busbw("all_reduce", nbytes, seconds, 8) == pytest.approx(nbytes / seconds * 1.75)


def test_busbw_rejects_unknown_collective_listing_known_ones():
    with pytest.raises(ValueError, match="all_gather"):
        cost.busbw_factor("gather_scatter", 4)


def test_flops_per_token_is_6n_plus_kaplan_attention_and_8n_with_recompute():
    assert cost.flops_per_token(1e9) == 6e9
    assert cost.flops_per_token(1e9, recompute=True) == 8e9
    assert (
        cost.flops_per_token(1e9, n_layers=24, seq_len=2048, d_model=2048)
        == 6e9 + 6 * 24 * 2048 * 2048
    )
    assert cost.training_flops(1e12, 1e9) == 6e21


def test_mfu_counts_model_flops_over_peak_of_all_gpus():
    # 8 GPUs at 1 PFLOP/s each, 6 FLOPs/param/token, N = 1e9: 8e15·0.5 / 6e9 tokens/s gives 50%.
    tokens_per_s = 8e15 * 0.5 / 6e9
    assert cost.model_flops_utilization(tokens_per_s, 1e9, 1e15, n_gpus=8) == pytest.approx(0.5)
    hfu = cost.hardware_flops_utilization(tokens_per_s, 1e9, 1e15, n_gpus=8, recompute=True)
    assert hfu == pytest.approx(0.5 * 8 / 6)


def test_training_days_is_6nd_over_cluster_throughput():
    # 6·1e9·1e12 = 6e21 FLOPs at 1000 GPUs × 1e15 × 0.5 = 5e17 FLOP/s -> 12,000 s.
    assert cost.training_days(1e12, 1e9, 1000, 1e15, 0.5) == pytest.approx(12_000 / 86_400)
    with pytest.raises(ValueError, match="fraction"):
        cost.training_days(1e12, 1e9, 1000, 1e15, 40)


def test_gpt2_small_parameter_count_is_124_439_808():
    assert cost.gpt_param_count(12, 768, 50257, 1024) == 124_439_808
    untied = cost.gpt_param_count(12, 768, 50257, 1024, tie_embeddings=False)
    assert untied - 124_439_808 == 50257 * 768
    approx = cost.gpt_param_count_approx(12, 768, 50257)
    assert abs(approx - 124_439_808) / 124_439_808 < 0.01


def test_bubble_conventions_differ_and_convert_into_each_other():
    p, m = 4, 8
    assert cost.bubble_fraction_of_total(p, m) == pytest.approx(3 / 11)
    assert cost.bubble_ratio_to_ideal(p, m) == pytest.approx(3 / 8)
    f = cost.bubble_fraction_of_total(p, m)
    assert cost.bubble_ratio_to_ideal(p, m) == pytest.approx(f / (1 - f))
    assert cost.bubble_fraction_of_total(1, 5) == 0.0
    assert cost.bubble_ratio_to_ideal(8, 2) > 1  # ratio to ideal can exceed 1; a fraction cannot


def test_interleaving_divides_the_bubble_by_virtual_stages():
    assert cost.interleaved_bubble_ratio_to_ideal(4, 8, 2) == pytest.approx(3 / 16)
    assert cost.interleaved_bubble_fraction_of_total(4, 8, 2) == pytest.approx(3 / 19)
    assert cost.interleaved_bubble_ratio_to_ideal(4, 8, 1) == cost.bubble_ratio_to_ideal(4, 8)


def test_micro_batches_for_bubble_is_the_smallest_m_meeting_the_target():
    assert cost.micro_batches_for_bubble(4, 0.1) == 30
    assert cost.micro_batches_for_bubble(4, 0.1, v=2) == 15
    assert cost.micro_batches_for_bubble(1, 0.01) == 1
    with pytest.raises(ValueError, match=">= 1"):
        cost.bubble_fraction_of_total(0, 4)


def test_young_daly_interval_is_sqrt_2_c_mtbf_and_minimises_waste():
    c, mtbf = 60.0, 86_400.0
    tau = cost.young_daly_interval(c, mtbf)
    assert tau == pytest.approx(math.sqrt(2 * 60 * 86_400))
    best = cost.expected_waste_fraction(tau, c, mtbf)
    assert best < cost.expected_waste_fraction(tau * 0.8, c, mtbf)
    assert best < cost.expected_waste_fraction(tau * 1.25, c, mtbf)


def test_cluster_mtbf_divides_by_gpu_count():
    five_years = 5 * 365 * 86_400
    assert cost.cluster_mtbf(five_years, 16_384) == pytest.approx(five_years / 16_384)
    assert cost.cluster_mtbf(five_years, 16_384) / 3600 == pytest.approx(2.67, abs=0.01)
