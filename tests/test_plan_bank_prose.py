"""Bank explanations that quote the planner's numbers quote what the planner says now.

A numeric item's key is recomputed by the bank loader whenever the model changes; the prose
beside it is not. Each case here formats the model's current output the way the explanation
writes it and checks the explanation contains it, so a change to the step-time or GEMM model
that moves a quoted figure fails here until the prose follows (issue 29: "explanations that
cite numbers updated").
"""

from __future__ import annotations

import pytest

from dtlab.plan import case_studies
from dtlab.plan.job import Requirements
from dtlab.plan.parallel_plan import ParallelPlan
from dtlab.plan.published import PUBLISHED_RUNS
from dtlab.plan.step_time import step_time
from dtlab.plan.zero3_gap import implied_zero3_bandwidth
from dtlab.quiz import load_bank


def _run(name: str):
    return next(r for r in PUBLISHED_RUNS if r.name == name)


def _llama3_step(gpus: int) -> str:
    run = _run(f"Llama 3 405B, 8K, {gpus:,} H100")
    t = step_time(run.job, run.plan).step_s
    if gpus == 16384:
        return f"predicts {t:.1f} s ({t / run.step_s:.2f}×)"
    return f"{run.step_s:.1f} s published against {t:.1f} s predicted"


def _zero3_70b_gemm_share() -> str:
    job = Requirements("70B on 2048 H100", 70.0e9, 80, 8192, 64, 4096, 2.0e12, 4194304, 2048)
    t = step_time(job, ParallelPlan(dp=1024, tp=2, pp=1, zero_stage=3))
    return f"~{t.gemm_efficiency:.0%}".replace("%", " %") + " of 989 TFLOP/s"


def _zero3_implied_at_384() -> str:
    return f"~{implied_zero3_bandwidth(_run('GPT-3 175B, 384 A100 ZeRO-3')) / 1e9:.0f} GB/s"


def _stage_peaks() -> str:
    one, zero = case_studies.llama3_stage_peaks_gb(1), case_studies.llama3_stage_peaks_gb(0)
    return f"≈ {one:.0f} GB against device 0's 112 ≈ {zero:.0f} GB"


CASES = [
    ("performance.llama3_published_step", lambda: _llama3_step(16384)),
    ("performance.llama3_published_step", lambda: _llama3_step(8192)),
    ("composition.zero3_dp_time", _zero3_70b_gemm_share),
    ("system_design.megatron_zero3_bandwidth", _zero3_implied_at_384),
    ("system_design.llama3_stage_balancing", _stage_peaks),
]


@pytest.mark.parametrize(("item_id", "quoted"), CASES, ids=[c[0] for c in CASES])
def test_the_explanation_quotes_the_models_current_figure(item_id, quoted):
    explanation = " ".join(load_bank()[item_id].explanation.split())
    assert quoted() in explanation, (item_id, quoted(), explanation)
