"""The planner's GEMM model: waves of 128 × 128 output tiles on the SMs plus a fixed latency,
held against the BF16 GEMMs measured on a lent H200 (:data:`dtlab.plan.constants.
H200_GEMM_MEASURED`). Model outputs against recorded measurements, no timing here."""

from __future__ import annotations

import pytest

from dtlab.cost import gpu
from dtlab.plan.constants import (
    FP8_SUSTAINED_SCALE,
    GEMM_KERNEL_LATENCY_S,
    GEMM_MAX_FRACTION,
    H200_GEMM_MEASURED,
    H200_GEMM_MODEL_FACTOR,
)
from dtlab.plan.gemm import gemm_efficiency, gemm_seconds, gemm_waves


@pytest.mark.parametrize("n", sorted(H200_GEMM_MEASURED))
def test_the_wave_model_reproduces_every_measured_h200_gemm(n):
    predicted = gemm_efficiency("h200_sxm", n, n, n)
    for measured in H200_GEMM_MEASURED[n]:
        ratio = predicted / measured
        assert 1 / H200_GEMM_MODEL_FACTOR <= ratio <= H200_GEMM_MODEL_FACTOR, (n, ratio)


def test_the_stated_factor_is_the_models_worst_residual_not_a_loose_bound():
    worst = max(
        max(gemm_efficiency("h200_sxm", n, n, n) / m, m / gemm_efficiency("h200_sxm", n, n, n))
        for n, runs in H200_GEMM_MEASURED.items()
        for m in runs
    )
    assert H200_GEMM_MODEL_FACTOR / 1.05 < worst <= H200_GEMM_MODEL_FACTOR


def test_hoppers_ceiling_is_the_longest_measured_burst():
    """η_max on H100/H800/H200 is the 8192³ burst's typical reading (the sustained regime a
    training step runs in), not the best short-burst reading (4096³ up to 0.79)."""
    longest = max(H200_GEMM_MEASURED)
    typical = sorted(H200_GEMM_MEASURED[longest])[len(H200_GEMM_MEASURED[longest]) // 2]
    assert GEMM_MAX_FRACTION["h200_sxm"] == pytest.approx(typical, abs=0.005)
    assert GEMM_MAX_FRACTION["h200_sxm"] < max(H200_GEMM_MEASURED[4096])
    assert (
        GEMM_MAX_FRACTION["h100_sxm"]
        == GEMM_MAX_FRACTION["h800_sxm"]
        == GEMM_MAX_FRACTION["h200_sxm"]
    )


def test_small_gemms_leave_most_sms_idle():
    assert gemm_waves("h200_sxm", 1024, 1024) == 1  # 64 tiles on 132 SMs
    assert gemm_efficiency("h200_sxm", 256, 256, 256) < 0.02
    assert gemm_efficiency("h200_sxm", 1024, 1024, 1024) < 0.5 * gemm_efficiency(
        "h200_sxm", 4096, 4096, 4096
    )


def test_one_tile_past_a_full_wave_costs_a_whole_wave():
    # 12 × 11 = 132 tiles: one wave on an H100's 132 SMs; one more column: 12 × 12 = 144, two.
    # (A 132·128 × 128 output would be HBM-bound: its 128-wide n reads more than it computes.)
    m, n, k = 12 * 128, 11 * 128, 8192
    assert gemm_waves("h100_sxm", m, n) == 1 and gemm_waves("h100_sxm", m, n + 1) == 2
    assert gemm_seconds("h100_sxm", m, k, n + 1) > 1.9 * gemm_seconds("h100_sxm", m, k, n)


def test_a_partial_tile_costs_a_whole_tile():
    """m or n not a multiple of 128: 129 rows run as two tile rows, like 256."""
    assert gemm_seconds("h100_sxm", 129, 4096, 4096) == gemm_seconds("h100_sxm", 256, 4096, 4096)
    assert gemm_waves("h100_sxm", 37.5, 4096) == gemm_waves("h100_sxm", 128, 4096) == 1


@pytest.mark.parametrize("m", [1, 64, 128])
def test_a_skinny_gemm_is_no_faster_than_reading_its_operands(m):
    """One row (a GEMV) or one tile row against 16384² weights: the waves alone would claim up to
    66 % of an H100's peak, but the 537 MB of weights take longer to read than that."""
    k = n = 16384
    weights_s = k * n * 2 / gpu("h100_sxm").hbm_bandwidth_bytes_per_s
    assert gemm_seconds("h100_sxm", m, k, n) > weights_s
    roofline = 2 * m * k * n / weights_s / gpu("h100_sxm").bf16_dense_flops
    assert gemm_efficiency("h100_sxm", m, k, n) < roofline


SHAPES = [
    (1, 1, 1),
    (1, 1_000_000, 128),
    (1, 16384, 16384),
    (37.5, 7168, 4096),  # an MoE expert's fractional rows under balanced routing
    (129, 1000, 130),
    (8192, 128, 8192),
    (2048, 12288, 4608),
    (16384, 16384, 16384),
    (132 * 128 * 3, 8192, 128 * 2),
]


@pytest.mark.parametrize("preset", ["a100_80gb", "h100_sxm", "h800_sxm", "h200_sxm", "b200"])
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_efficiency_stays_within_zero_and_the_ceiling_for_any_shape(preset, dtype):
    spec = gpu(preset)
    fp8 = dtype == "fp8" and spec.fp8_dense_flops
    ceiling = GEMM_MAX_FRACTION[preset] * (FP8_SUSTAINED_SCALE if fp8 else 1)
    for shape in SHAPES:
        assert 0 < gemm_efficiency(preset, *shape, dtype=dtype) <= ceiling, shape
        assert gemm_seconds(preset, *shape, dtype=dtype) >= GEMM_KERNEL_LATENCY_S


@pytest.mark.parametrize(("m", "n"), [(1, 16384), (128, 128), (1000, 3000), (8192, 2304)])
def test_a_longer_k_never_lowers_the_efficiency(m, n):
    """More work per tile amortises the fixed latency; waves and bytes both grow linearly in k."""
    effs = [gemm_efficiency("h100_sxm", m, k, n) for k in (64, 512, 4096, 32768, 1 << 20)]
    assert effs == sorted(effs)


def test_fp8_runs_on_the_fp8_peak_with_an_unscaled_kernel_latency():
    big = (8192, 8192, 8192)
    bf16, fp8 = gemm_seconds("h100_sxm", *big), gemm_seconds("h100_sxm", *big, dtype="fp8")
    speedup = 2 * FP8_SUSTAINED_SCALE  # FP8 peak 2× BF16, at 0.6 of the BF16 fraction: 1.2×
    assert bf16 / fp8 == pytest.approx(speedup, rel=0.01)
    tiny = (128, 128, 128)
    assert gemm_seconds("h100_sxm", *tiny, dtype="fp8") > GEMM_KERNEL_LATENCY_S
    assert gemm_seconds("h100_sxm", *tiny, dtype="fp8") / gemm_seconds("h100_sxm", *tiny) > 0.9
    # no FP8 tensor cores on an A100: the BF16 kernel, on the BF16 peak
    assert gemm_seconds("a100_80gb", *big, dtype="fp8") == gemm_seconds("a100_80gb", *big)
    with pytest.raises(ValueError, match="dtype must be one of"):
        gemm_seconds("h100_sxm", *big, dtype="fp16")


def test_an_fp8_job_prices_its_layers_at_most_1_2x_the_bf16_path():
    from dataclasses import replace

    from dtlab.plan.compute import gemm_flops_per_second
    from dtlab.plan.published import DEEPSEEK_V3_JOB, DEEPSEEK_V3_PLAN

    fp8 = gemm_flops_per_second(DEEPSEEK_V3_JOB, DEEPSEEK_V3_PLAN)
    bf16 = gemm_flops_per_second(replace(DEEPSEEK_V3_JOB, gemm_dtype="bf16"), DEEPSEEK_V3_PLAN)
    assert 1.15 < fp8 / bf16 <= 2 * FP8_SUSTAINED_SCALE


def test_large_gemms_approach_the_stated_ceiling_and_never_pass_it():
    for preset in ("a100_80gb", "h100_sxm", "b200"):
        big = gemm_efficiency(preset, 16384, 16384, 16384)
        assert 0.9 * GEMM_MAX_FRACTION[preset] < big <= GEMM_MAX_FRACTION[preset]


def test_the_sm_count_comes_from_the_gpu_preset():
    assert (gpu("a100_80gb").sm_count, gpu("h100_sxm").sm_count, gpu("b200").sm_count) == (
        108,
        132,
        148,
    )
    # 120 tiles: one wave on 132 SMs, two on the A100's 108
    assert gemm_waves("h100_sxm", 128 * 120, 128) == 1
    assert gemm_waves("a100_80gb", 128 * 120, 128) == 2


def test_every_gpu_preset_states_its_gemm_ceiling():
    from dtlab.cost.hardware import GPUS

    assert set(GEMM_MAX_FRACTION) == set(GPUS)  # no silent default for a preset


def test_gemm_sizes_must_be_positive():
    with pytest.raises(ValueError, match="must be > 0"):
        gemm_efficiency("h100_sxm", 0, 128, 128)


def test_each_backward_gemm_is_priced_at_its_own_shape():
    """dgrad ``dY·Wᵀ`` and wgrad ``Xᵀ·dY`` carry a forward GEMM's FLOPs with their own outputs:
    for GPT-3 175B at TP 8 on an A100 (108 SMs) the forward QKV output (2,048 × 4,608, 576
    tiles) runs 5.3 waves as 6, its wgrad output (12,288 × 4,608, 3,456 tiles) exactly 32 — so
    the micro-batch's weight-gradient seconds come out below its forward linear seconds."""
    from dataclasses import replace

    from dtlab.plan.compute import (
        PASSES,
        layer_efficiency,
        layer_gemms,
        micro_batch_compute,
        pass_gemms,
    )
    from dtlab.plan.megatron_jobs import GPT3_175B
    from dtlab.plan.parallel_plan import ParallelPlan

    job = replace(GPT3_175B, n_gpus=384)
    plan = ParallelPlan(4, 8, 12, 0, 1, 2, recompute="full", sequence_parallel=False)
    forward = layer_gemms(job, plan)
    qkv = forward[0]
    assert pass_gemms([qkv], "input_grad") == [(2048, 4608, 12288)]
    assert pass_gemms([qkv], "weight_grad") == [(12288, 2048, 4608)]
    for p in PASSES:  # the same FLOPs in every pass
        assert [m * k * n for m, k, n in pass_gemms(forward, p)] == [
            m * k * n for m, k, n in forward
        ]
    assert gemm_waves("a100_80gb", 2048, 4608) == 6 and gemm_waves("a100_80gb", 12288, 4608) == 32
    by_pass = {p: layer_efficiency(job, plan, p) for p in PASSES}
    assert by_pass["forward"] < by_pass["input_grad"] < by_pass["weight_grad"]
    assert by_pass["forward"] < layer_efficiency(job, plan) < by_pass["weight_grad"]
    c = micro_batch_compute(job, replace(plan, sequence_parallel=True), 0)  # no redundant norms
    dgrad = c.input_grad_s - 2 * c.attention_forward_s - c.recompute_s
    assert c.weight_grad_s < dgrad < c.forward_s - c.attention_forward_s
    assert dgrad / c.weight_grad_s == pytest.approx(by_pass["weight_grad"] / by_pass["input_grad"])
    assert c.recompute_s == pytest.approx(c.forward_s)  # full recomputation reruns the forward


def test_an_moe_layer_weighs_every_expert_the_gpu_runs():
    """DeepSeek-V3 at EP 64: 256/64 = 4 routed experts per GPU, each its own two GEMMs on
    8·64/256·n tokens, and the shared expert's two on all n — so the routed experts weigh in
    the layer's efficiency as the ``n·k`` expert-tokens the GPU computes, not as one expert's."""
    from dtlab.plan.compute import layer_gemms, tokens_per_micro_batch
    from dtlab.plan.published import PUBLISHED_RUNS

    run = next(r for r in PUBLISHED_RUNS if r.name.startswith("DeepSeek-V3"))
    job, plan = run.job, run.plan
    gemms = layer_gemms(job, plan)
    n = tokens_per_micro_batch(job, plan)
    routed = n * job.top_k * plan.ep / job.n_experts
    assert gemms.count((routed, job.d_model, 2 * job.expert_d_ff)) == job.n_experts // plan.ep
    assert (n, job.d_model, 2 * job.expert_d_ff * job.shared_experts) in gemms
    routed_work = sum(m * k * w for m, k, w in gemms if m == routed)
    assert routed_work == pytest.approx(n * job.top_k * job.d_model * job.expert_d_ff * 3)
