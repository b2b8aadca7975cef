"""Data-parallel sync under pipelining: each stage's slack read off the schedule, and the
per-stage sync on a PP × DP cluster launched under the compute that hides it."""

from __future__ import annotations

import pytest
import torch

from dtlab.parallel.pipeline import (
    Costs,
    dp_slack,
    exposed_dp_sync,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    zb_h1,
    zbv,
)
from dtlab.parallel.pipeline.dp_sync import slack_in_backward_slots
from dtlab.parallel.pipeline.dp_sync_run import exposed_per_rank, measure_dp_sync


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_in_1f1b_stage_s_has_s_backward_slots_of_slack(p):
    for m in (p, 2 * p, 3 * p + 1):
        assert slack_in_backward_slots(one_f_one_b(p, m)) == {s: s for s in range(p)}
        assert slack_in_backward_slots(gpipe(p, m)) == {s: s for s in range(p)}


@pytest.mark.parametrize("p, v", [(2, 2), (3, 2), (4, 2), (2, 3)])
def test_in_interleaved_1f1b_stage_s_has_s_chunk_backwards_of_slack(p, v):
    chunk = Costs(1 / v, 1 / v, 1 / v)
    slack = dp_slack(interleaved_1f1b(p, 2 * p, v), chunk)
    assert slack == pytest.approx({s: s * 2 / v for s in range(p * v)})


def test_zb_h1_leaves_no_slack_its_ws_fill_the_drain():
    assert dp_slack(zb_h1(4, 8)) == {s: 0.0 for s in range(4)}
    assert exposed_dp_sync(zb_h1(4, 8), None, 1.5) == {r: 1.5 for r in range(4)}


@pytest.mark.parametrize("p", [2, 3, 4])
def test_zbv_turns_the_staircase_around_its_last_rank_exposes_the_most(p):
    t = Costs(0.5, 0.5, 0.5)
    slack = dp_slack(zbv(p, 4 * p), t)
    assert slack[p - 1] == 0.0  # the up-chunk's W on rank p-1 ends the step
    assert min(slack[0], slack[2 * p - 1]) == pytest.approx((p - 1) * 0.5)  # rank 0's stages
    exposed = exposed_dp_sync(zbv(p, 4 * p), t, 1.0)
    assert exposed[p - 1] == max(exposed.values()) > exposed[0]


def test_stage_zero_exposes_the_most_and_per_stage_sync_helps_only_with_chunks():
    one = exposed_dp_sync(one_f_one_b(4, 8), None, 3.0)
    assert one == {0: 3.0, 1: 1.0, 2: 0.0, 3: 0.0}  # slack 0, 2, 4, 6
    assert exposed_dp_sync(one_f_one_b(4, 8), None, 3.0, per_stage=False) == one
    chunk = Costs(0.5, 0.5, 0.5)
    per_stage = exposed_dp_sync(interleaved_1f1b(4, 8), chunk, 1.5)
    after = exposed_dp_sync(interleaved_1f1b(4, 8), chunk, 1.5, per_stage=False)
    assert per_stage[0] == pytest.approx(1.5) and after[0] == pytest.approx(3.0)
    assert all(per_stage[r] <= after[r] for r in range(4))


def _last_compute(trace, mode: str, rank: int) -> tuple[int, int]:
    spans = [s for s in trace.filter(mode=mode, step=0, kind="compute").spans if s.rank == rank]
    last = max(spans, key=lambda s: s.end_ns)
    return last.start_ns, last.end_ns


def _last_gradient_end(trace, rank: int, stage: int) -> int:
    spans = trace.filter(mode="per_stage", step=0, kind="compute", stage=stage).spans
    return max(s.end_ns for s in spans if s.rank == rank and s.labels["phase"] in ("B", "W"))


@pytest.mark.parametrize("name", ["1f1b", "interleaved_1f1b"])
def test_per_stage_sync_starts_under_the_pipelines_remaining_compute(cluster4, name):
    run = cluster4.run(measure_dp_sync, name, 2, 2, 4, width=256, stage_s=0.01, steps=1)
    by_rank = {i: r for i, r in enumerate(run)}
    for r in run:  # the per-stage sync really reduced: the dp replicas hold the same gradients
        twin = next(o for o in run if o["pp_rank"] == r["pp_rank"] and o is not r)
        for s in r["stages"]:
            torch.testing.assert_close(r["grads"][s], twin["grads"][s])
    stage0_ranks = [i for i, r in by_rank.items() if r["pp_rank"] == 0]
    stage0_end = max(_last_compute(run.trace, "per_stage", i)[1] for i in stage0_ranks)
    for i, r in by_rank.items():
        (per_stage,) = [s for s in r["steps"] if s["mode"] == "per_stage"]
        (after,) = [s for s in r["steps"] if s["mode"] == "after_step"]
        for s in r["stages"]:  # launched inside pipe.step, right after the stage's last gradient
            assert _last_gradient_end(run.trace, i, s) <= per_stage["launched"][s]
            assert per_stage["launched"][s] < per_stage["pipeline_end"]
            assert after["launched"][s] >= after["pipeline_end"]  # the plain loop: after the step
        if r["pp_rank"] == 1:  # its sync is launched while pipeline rank 0 still computes
            assert max(per_stage["launched"].values()) < stage0_end
        if name == "interleaved_1f1b":  # the later chunk's sync starts before the rank's last F/B
            later, first = max(r["stages"]), min(r["stages"])
            last_start, _ = _last_compute(run.trace, "per_stage", i)
            assert per_stage["launched"][later] < last_start < per_stage["launched"][first]
    assert set(exposed_per_rank(run, "per_stage")) == {0, 1}
