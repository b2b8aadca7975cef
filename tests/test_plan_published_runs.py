"""The planner held against published large runs (issue 29's "Done when").

These are model outputs, not wall-clock measurements: the published layout passes under its
paper's policy, its predicted step is within ±15 % of the published one, it ranks in the fastest
quarter of the planner's own passing plans, and the planner's best plan claims at most 1.25× the
best published MFU of the same model on the same GPU (or 55 % on 6N, whichever is higher). Megatron-LM 2021's ZeRO-3 rows ran
DeepSpeed's stage 3 of 2021 (:mod:`dtlab.plan.zero3_per_parameter`): priced that way they are
within ±15 %, priced as a modern per-layer ZeRO-3 they are 1.3–4.1× too fast
(:mod:`dtlab.plan.zero3_gap`), and the paper's own comparison (PTD-P 1.06 / 1.69 / 3.2× faster)
comes out of the model. They are the baseline the paper beat, so the rank goal is not theirs.

Since the GEMM model became waves of tiles measured on an H200 (:mod:`dtlab.plan.gemm`), Hopper
GEMMs are priced at the sustained 0.69 of peak the longest measured burst ran at (the layer
GEMMs of Llama 3 and DeepSeek-V3 at ~0.68), and every Hopper row is within ±15 %. The A100 rows
are priced at the stated, unmeasured ``η_max`` 0.77 (layer GEMMs 0.72–0.77). Korthikanti et al.
2022's seven measured iteration times on the same A100s (:mod:`dtlab.plan.published_selective`)
check that A100 pricing where the 2021 rows cannot: the planner predicts each of them at 1.02–1.14
of its measured time, and the full-recomputation tax they measured within 5 %.

Each job runs its paper's **software** (:mod:`dtlab.plan.software`): the 2021 rows Megatron-LM
of 2021 (no sequence parallelism, no selective recomputation, no distributed optimizer; its
1F1B kept every in-flight stage output), Korthikanti's rows Megatron-LM of 2022. The planner's
passing plans for a job are those its software could run, and the published layouts are priced
as they ran (the 2021 ones and Korthikanti's full-recomputation baselines without SP).
**Baseline** rows — the ZeRO-3 rows Narayanan et al. beat, the full-recomputation rows
Korthikanti et al. beat — are held to ±15 % but not to the rank goal.

The rank goal is missed by the three GPT-3 175B PTD-P rows of 2021, pinned below with both
lenses (and the 1T row's rank against today's software; no constant was retuned to win them
back; a change that moves them fails here and must update the pins and the README). The 384- /
768- / 1,536-GPU layouts rank 39 / 32 / 27 % among 2021's plans (52 / 41 / 36 % before the
model priced three things that software did — every pipeline exchange waited on, 20 B of model
state per parameter, the rerun layer's working set; 37 / 26 / 24 % until HBM was read as GiB,
77.3 GB usable instead of 72; 40 / 30 / 29 % until each backward GEMM was priced at its own
shape; 34 / 28 / 27 % until the norms and dropouts every TP rank runs whole without SP were
priced, which brought their steps to 1.00 / 0.99 / 0.97 of the published ones): ranks among
near-equal plans move with any small change. Within 2021's software most plans ahead also
recompute whole layers and are up to 8 % faster (micro-batch 2, TP 4, other depths and
interleavings: inside the model's own ±15 %); two to four skip recomputation with a deeper
pipeline (1F1B's stage 0 holds ``L`` layers' activations whatever ``pp`` is, so deepening it
frees model state until they fit: TP 8 × PP 24 at 76.4 of 77.3 GB, 1.24–1.29× faster), which
no paper measured. With today's software the published layouts rank 31 / 26 / 21 %; most plans
ahead of them use selective recomputation and sequence parallelism, which Korthikanti et al.
measured 1.32× faster on this model and cluster. The best-plan cap is held against the best
published MFU of the same model on the same GPU
(:func:`~dtlab.plan.published.best_published_mfu_6n`); the 2021 1T job given today's software
picks TP 8 with selective recomputation at 57.2 %, 1.03× the 55.5 % Korthikanti et al. ran.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from dtlab.plan.published import (
    PUBLISHED_RUNS,
    SELECTIVE_RUNS,
    best_published_mfu_6n,
    compare,
)
from dtlab.plan.published_run import passing_plans_timed
from dtlab.plan.step_time import step_time
from dtlab.plan.zero3_gap import (
    implied_zero3_bandwidth,
    latency_share_of_gap,
    nccl_ring_latency_s,
    zero3_bytes_per_gpu,
    zero3_ring_latency_s,
)
from dtlab.plan.zero3_per_parameter import per_parameter_exposed_s

RANK_MISSES = {
    "GPT-3 175B, 384 A100 PTD-P": (0.39, 0.31),
    "GPT-3 175B, 768 A100 PTD-P": (0.32, 0.26),
    "GPT-3 175B, 1,536 A100 PTD-P": (0.27, 0.21),
}
"""Share of the plans faster than the published layout: among its own software's, and today's."""
TODAY_RANKS = {"GPT 1T, 3,072 A100 PTD-P": 0.115}
"""The other 2021 layouts' share among today's software's plans (README states them)."""

CHOSEN_LAYOUTS = [r for r in PUBLISHED_RUNS if not r.baseline]
"""The layouts each paper chose (not the baselines it ran to beat)."""
ZERO3 = [r for r in PUBLISHED_RUNS if "ZeRO-3" in r.name]


@pytest.fixture(scope="module")
def compared():
    return {run.name: compare(run) for run in PUBLISHED_RUNS}


def test_the_published_table_covers_llama3_megatron_and_deepseek():
    names = [r.name for r in PUBLISHED_RUNS]
    assert sum("Llama 3" in n for n in names) == 3 and sum("DeepSeek" in n for n in names) == 1
    assert sum("PTD-P" in n for n in names) == 4 and len(ZERO3) == 3
    assert len(SELECTIVE_RUNS) == 7 and all(r in PUBLISHED_RUNS for r in SELECTIVE_RUNS)
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


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=lambda r: r.name)
def test_the_predicted_step_is_within_15_percent_of_the_published_one(run, compared):
    assert 0.85 <= compared[run.name].step_ratio <= 1.15


@pytest.mark.parametrize("run", CHOSEN_LAYOUTS, ids=lambda r: r.name)
def test_the_published_layout_ranks_in_the_fastest_quarter_of_the_planners_own(run, compared):
    c = compared[run.name]
    assert len(c.passing_steps) >= 8  # the fastest quarter is a real cut: 2 plans of 8 or more
    if run.name in RANK_MISSES:
        own, today = RANK_MISSES[run.name]
        assert c.rank_fraction >= 0.25 and c.rank_fraction == pytest.approx(own, abs=0.02)
        assert c.rank_fraction_with("current") == pytest.approx(today, abs=0.02)
    else:
        assert c.rank_fraction < 0.25
        if run.name in TODAY_RANKS:
            assert c.rank_fraction_with("current") == pytest.approx(TODAY_RANKS[run.name], abs=0.02)


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=lambda r: r.name)
def test_the_best_plan_claims_no_more_than_the_cap_over_the_models_best_published_mfu(
    run, compared
):
    cap = max(1.25 * best_published_mfu_6n(run.job), 0.55)
    assert compared[run.name].best.mfu <= cap


def test_the_1t_winner_is_korthikantis_plan_once_the_software_has_it(compared):
    """Within 2021's software the 1T job's winner recomputes whole layers (nothing else
    existed) and the published layout is the fastest. Given Megatron-LM of 2022 the winner is
    TP 8 with SP and selective recomputation, at no more than what that paper measured on the
    same model and A100s (its DP sync still after the backward); given today's software —
    ZeRO-1, the sync overlapped — at 1.03× it."""
    c = compared["GPT 1T, 3,072 A100 PTD-P"]
    assert c.rank == 0 and c.best_plan.recompute == "full" and c.best.mfu < 0.45
    measured = best_published_mfu_6n(c.run.job)
    assert measured == pytest.approx(0.555, abs=0.002)
    for software, low, high in (("megatron-lm-2022", 0.85, 1.0), ("current", 1.0, 1.05)):
        best, plan = passing_plans_timed(replace(c.run.job, software=software))[0]
        assert plan.recompute == "selective" and plan.tp == 8 and plan.sequence_parallel
        assert low < best.mfu / measured < high


def test_baselines_are_slower_than_the_layout_their_paper_chose(compared):
    """Every baseline ran slower than the layout its paper chose, and the model says so wherever
    the published gap is wider than the model's own error can close (two steps each within
    ±15 %: a gap of 10 % or more). At 384 GPUs PTD-P beat ZeRO-3 by 6 %; the model puts ZeRO-3
    2 % ahead — :func:`test_the_planner_reproduces_the_papers_ptd_p_over_zero3_speedup`."""
    for baseline in (r for r in PUBLISHED_RUNS if r.baseline):
        chosen = next(
            r for r in CHOSEN_LAYOUTS if r.job == baseline.job and r.plan != baseline.plan
        )
        assert baseline.step_s > chosen.step_s
        predicted = (
            compared[baseline.name].predicted.step_s / compared[chosen.name].predicted.step_s
        )
        if baseline.step_s / chosen.step_s >= 1.1:
            assert predicted > 1
        else:
            assert predicted == pytest.approx(0.98, abs=0.01)


@pytest.mark.parametrize("model", ["GPT-3 175B", "MT-NLG 530B, 280", "GPT 1T"])
def test_the_planner_predicts_the_recompute_tax_korthikanti_measured(model, compared):
    """Full recomputation (one more forward) over SP + selective, same layout: measured
    1.32 / 1.30 / 1.32× (Table 5); the model's ratio within 5 % of each (1.03 / 1.04 / 1.02 of
    it: without SP every TP rank runs the norms and dropouts whole; with SP backward re-gathers
    the stored input shards and waits on its gathers of the output gradient; all priced)."""
    full, selective = (
        next(r for r in SELECTIVE_RUNS if r.name.startswith(model) and label in r.name)
        for label in ("full recompute", "SP + selective")
    )
    measured = full.step_s / selective.step_s
    predicted = compared[full.name].predicted.step_s / compared[selective.name].predicted.step_s
    assert 1.28 < measured < 1.33 and predicted == pytest.approx(measured, rel=0.05)


def test_zero3_priced_per_layer_is_too_fast_and_no_bandwidth_explains_it(compared):
    """As FSDP would run them (one flat gather per layer, prefetched), the model's DP bytes for
    ZeRO-3 are the same at every scale (3·Ψ·2 per micro-batch) and mostly hidden; measured
    throughput falls as compute per GPU shrinks, and the implied bandwidth drops to about one
    HDR NIC (25 GB/s) — no bandwidth term falls with N."""
    bytes_per_gpu = [zero3_bytes_per_gpu(r) for r in ZERO3]
    assert max(bytes_per_gpu) / min(bytes_per_gpu) < 1.01
    implied = [implied_zero3_bandwidth(r) for r in ZERO3]
    assert implied == sorted(implied, reverse=True) and 15e9 < implied[-1] < 25e9
    per_layer = [
        step_time(r.job, replace(r.plan, zero3_collectives="per_layer")).step_s / r.step_s
        for r in ZERO3
    ]
    assert per_layer == sorted(per_layer, reverse=True) and per_layer[-1] < 0.5


def test_deepspeed_2021_zero3_stops_scaling_from_768_to_1536_gpus(compared):
    """C/N + k·N: compute halves, the per-rank host loops and ring latencies double. Published:
    the same 67 s; the model: 59 and 72 s, within a quarter of each other."""
    at_768, at_1536 = (compared[r.name].predicted.step_s for r in ZERO3[1:])
    assert ZERO3[1].step_s == pytest.approx(ZERO3[2].step_s)  # published: 74 days each
    assert at_1536 / at_768 == pytest.approx(1.0, abs=0.25)
    for r in ZERO3:
        t = compared[r.name].predicted
        assert t.dp_exposed_s > 0.1 * t.step_s  # the host loops are on the critical path


@pytest.mark.parametrize("gpus", [384, 768, 1536])
def test_the_planner_reproduces_the_papers_ptd_p_over_zero3_speedup(gpus, compared):
    """Narayanan et al. 2021, Sec. 5.2: PTD-P beats ZeRO-3 by 6 % at 384 GPUs and ~70 % once
    the GPUs double; at 1,536 it is 3.2× faster. The model: 0.98 / 1.51 / 3.53× — each within
    20 % (the last is two ±15 % predictions' errors compounded: PTD-P 0.97, ZeRO-3 1.07). At 384
    the paper's 6 % is inside the two predictions' errors and the model puts ZeRO-3 2 % ahead (a
    known miss, pinned): the order is asserted only where the gap is wider than that."""
    ptd, zero3 = (next(r for r in PUBLISHED_RUNS if r.name == f"GPT-3 175B, {gpus:,} A100 {k}")
                  for k in ("PTD-P", "ZeRO-3"))  # fmt: skip
    published = zero3.step_s / ptd.step_s
    predicted = compared[zero3.name].predicted.step_s / compared[ptd.name].predicted.step_s
    assert predicted == pytest.approx(published, rel=0.2)
    assert predicted > 1 if published >= 1.1 else predicted == pytest.approx(0.98, abs=0.01)


def test_per_parameter_zero3_costs_more_with_more_ranks_and_with_recomputation():
    run = ZERO3[0]
    exposed = [
        per_parameter_exposed_s(run.job, replace(run.plan, dp=dp), 1) for dp in (96, 384, 1536)
    ]
    assert exposed == sorted(exposed) and exposed[0] > 0
    no_rerun = replace(run.plan, recompute="selective")
    assert per_parameter_exposed_s(run.job, no_rerun, 1) < per_parameter_exposed_s(
        run.job, run.plan, 1
    )
    assert (
        per_parameter_exposed_s(run.job, replace(run.plan, zero3_collectives="per_layer"), 1) == 0
    )


def test_nccl_ring_latency_grows_with_every_rank_and_more_with_every_node():
    one_node, two_nodes = nccl_ring_latency_s(8, 8), nccl_ring_latency_s(16, 8)
    assert nccl_ring_latency_s(1, 8) == 0.0 and one_node < two_nodes
    # 8 more ranks: 7 NVLink steps and 1 network step more
    assert two_nodes - one_node == pytest.approx(7 * 3.4e-6 + 9.6e-6)
    assert nccl_ring_latency_s(1536, 8) == pytest.approx(6.41e-3, rel=0.01)


def test_ring_latency_per_layer_explains_under_5_percent_of_the_zero3_gap():
    """288 ring collectives per step (3 per layer, one micro-batch) at NCCL's own latencies:
    0.46 / 0.92 / 1.85 s against gaps of 20 / 35 / 50 s — real, growing with N, but small."""
    latencies = [zero3_ring_latency_s(r) for r in ZERO3]
    assert latencies == sorted(latencies) and latencies[-1] == pytest.approx(1.85, rel=0.02)
    shares = [latency_share_of_gap(r) for r in ZERO3]
    assert all(0.01 < s < 0.05 for s in shares)


def test_planner_and_paper_agree_that_mfu_falls_from_8k_to_16k_gpus(compared):
    at_8k, at_16k = (compared[r.name].predicted.mfu_attention for r in PUBLISHED_RUNS[:2])
    assert at_8k > at_16k  # 43 % → 41 % published: half the micro-batches, twice the bubble
