"""The planner held against published large runs (issue 29's "Done when").

These are model outputs, not wall-clock measurements: the published layout passes under its
paper's policy, its predicted step is within ±15 % of the published one, it ranks in the fastest
quarter of the planner's own passing plans, and the planner's best plan claims at most 1.25× the
job's best published MFU (or 55 % on 6N, whichever is higher). Megatron-LM 2021's ZeRO-3 rows are
the model's stated gap (:mod:`dtlab.plan.zero3_gap`): a test pins what it predicts for them and
what the published numbers imply.

Since the GEMM model became waves of tiles measured on an H200 (:mod:`dtlab.plan.gemm`), Hopper
GEMMs are priced at the sustained 0.69 of peak the longest measured burst ran at (the layer
GEMMs of Llama 3 and DeepSeek-V3 at ~0.68), and every Hopper row is within ±15 %. The A100 rows
are priced at the stated, unmeasured ``η_max`` 0.77 (layer GEMMs 0.70–0.77), and two results fall
just outside the goals: the 384-GPU PTD-P layout ranks at 27 % and the 1T job's best plan claims
57.1 % 6N MFU. They are pinned below as the model's honest misses (no constant was retuned to
win them back): a change that moves them fails here and must update the pin and the README.
"""

from __future__ import annotations

import pytest

from dtlab.plan.published import PUBLISHED_RUNS, compare
from dtlab.plan.zero3_gap import (
    implied_zero3_bandwidth,
    latency_share_of_gap,
    nccl_ring_latency_s,
    zero3_bytes_per_gpu,
    zero3_ring_latency_s,
)

RANK_MISSES = {"GPT-3 175B, 384 A100 PTD-P": 0.27}
"""Share of the planner's passing plans faster than the published layout, just over 0.25."""
CAP_MISSES = {"GPT 1T, 3,072 A100 PTD-P": 0.571}
"""6N MFU of the planner's best plan where it passes 55 % (1.48× the published 38.7 %)."""

WITHIN_REACH = [r for r in PUBLISHED_RUNS if "ZeRO-3" not in r.name]
ZERO3 = [r for r in PUBLISHED_RUNS if "ZeRO-3" in r.name]


@pytest.fixture(scope="module")
def compared():
    return {run.name: compare(run) for run in PUBLISHED_RUNS}


def test_the_published_table_covers_llama3_megatron_and_deepseek():
    names = [r.name for r in PUBLISHED_RUNS]
    assert sum("Llama 3" in n for n in names) == 3 and sum("DeepSeek" in n for n in names) == 1
    assert sum("PTD-P" in n for n in names) == 4 and len(ZERO3) == 3
    llama_8k = PUBLISHED_RUNS[1]
    assert (llama_8k.plan.tp, llama_8k.plan.cp, llama_8k.plan.pp, llama_8k.plan.dp) == (
        8,
        1,
        16,
        128,
    )
    assert llama_8k.mfu_attention == pytest.approx(0.404, abs=0.005)  # 400 TFLOP/s of 989


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=lambda r: r.name)
def test_each_published_layout_passes_under_its_papers_policy(run, compared):
    assert compared[run.name].problems == ()


@pytest.mark.parametrize("run", WITHIN_REACH, ids=lambda r: r.name)
def test_the_predicted_step_is_within_15_percent_of_the_published_one(run, compared):
    assert 0.85 <= compared[run.name].step_ratio <= 1.15


@pytest.mark.parametrize("run", WITHIN_REACH, ids=lambda r: r.name)
def test_the_published_layout_ranks_in_the_fastest_quarter_of_the_planners_own(run, compared):
    c = compared[run.name]
    assert len(c.passing_steps) > 100
    if run.name in RANK_MISSES:
        assert c.rank_fraction >= 0.25
        assert c.rank_fraction == pytest.approx(RANK_MISSES[run.name], abs=0.02)
    else:
        assert c.rank_fraction < 0.25


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=lambda r: r.name)
def test_the_best_plan_claims_no_more_than_the_cap_over_the_jobs_best_published_mfu(run, compared):
    same_job = [r for r in PUBLISHED_RUNS if r.job == run.job]
    cap = max(1.25 * max(r.mfu_6n for r in same_job), 0.55)
    best = compared[run.name].best.mfu
    if run.name in CAP_MISSES:
        assert best > cap and best == pytest.approx(CAP_MISSES[run.name], abs=0.005)
    else:
        assert best <= cap


def test_zero3_is_the_stated_gap_the_model_prices_it_faster_than_measured(compared):
    """The model's DP bytes for ZeRO-3 are the same at every scale (3·Ψ·2 per micro-batch);
    measured throughput falls as compute per GPU shrinks, and the implied bandwidth drops to
    about one HDR NIC (25 GB/s) — the model hides it behind compute at 200 GB/s instead."""
    bytes_per_gpu = [zero3_bytes_per_gpu(r) for r in ZERO3]
    assert max(bytes_per_gpu) / min(bytes_per_gpu) < 1.01
    implied = [implied_zero3_bandwidth(r) for r in ZERO3]
    assert implied == sorted(implied, reverse=True) and 15e9 < implied[-1] < 25e9
    ratios = [compared[r.name].step_ratio for r in ZERO3]
    assert ratios == sorted(ratios, reverse=True) and ratios[-1] < 0.5


def test_nccl_ring_latency_grows_with_every_rank_and_more_with_every_node():
    one_node, two_nodes = nccl_ring_latency_s(8, 8), nccl_ring_latency_s(16, 8)
    assert nccl_ring_latency_s(1, 8) == 0.0 and one_node < two_nodes
    # 8 more ranks: 7 NVLink steps and 1 network step more
    assert two_nodes - one_node == pytest.approx(7 * 3.4e-6 + 9.6e-6)
    assert nccl_ring_latency_s(1536, 8) == pytest.approx(6.41e-3, rel=0.01)


def test_ring_latency_explains_under_5_percent_of_the_zero3_gap():
    """288 ring collectives per step (3 per layer, one micro-batch) at NCCL's own latencies:
    0.46 / 0.92 / 1.85 s against gaps of 20 / 35 / 50 s — real, growing with N, but small."""
    latencies = [zero3_ring_latency_s(r) for r in ZERO3]
    assert latencies == sorted(latencies) and latencies[-1] == pytest.approx(1.85, rel=0.02)
    shares = [latency_share_of_gap(r) for r in ZERO3]
    assert all(0.01 < s < 0.05 for s in shares)


def test_planner_and_paper_agree_that_mfu_falls_from_8k_to_16k_gpus(compared):
    at_8k, at_16k = (compared[r.name].predicted.mfu_attention for r in PUBLISHED_RUNS[:2])
    assert at_8k > at_16k  # 43 % → 41 % published: half the micro-batches, twice the bubble
