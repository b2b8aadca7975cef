"""Overlap under pipelining on a CUDA GPU over NCCL (one GPU: a 1-rank cluster). Skipped without
CUDA; ``pytest -m gpu`` selects it. One rank cannot show cross-rank overlap (the CPU suite does,
on four ranks); it proves that the zero-bubble V schedules, the per-stage sync hook and the GEMM
measurement run on CUDA tensors end to end."""

from __future__ import annotations

import math

import pytest
import torch

import dtlab

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _v_schedules_on_cuda() -> dict:
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.parallel.pipeline import interleaved_zero_bubble, pipeline_gpt, zbv

    device = dtlab.device()
    config = GPTConfig.tiny(n_layers=2)
    x, y = (t.to(device) for t in SyntheticTokens(config, 1, 4)[0])
    reference = loss_fn(GPT(config, seed=0).to(device)(x), y).item()
    out = {}
    for name, schedule in (("zbv", zbv(1, 2)), ("izb", interleaved_zero_bubble(1, 2, 2))):
        pipe = pipeline_gpt(GPT(config, seed=0).to(device), Mesh(pp=1), schedule)
        out[name] = abs(float(pipe.step(x, y)) - reference)
        out[f"{name}_grads_on_cuda"] = all(
            p.grad is not None and p.grad.is_cuda
            for stage in pipe.stages.values()
            for p in stage.parameters()
        )
    return out


def _dp_sync_on_cuda() -> dict:
    from dtlab.parallel.pipeline.dp_sync_run import measure_dp_sync

    r = measure_dp_sync("interleaved_1f1b", 1, 1, 2, width=64, stage_s=0.001, steps=1)
    # read on the rank: the cluster hands tensors back to the caller on the CPU
    r["grads_on_cuda"] = all(g.is_cuda for g in r["grads"].values())
    return r


@pytest.mark.timeout(300)
def test_zero_bubble_v_schedules_train_on_cuda_tensors():
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_v_schedules_on_cuda)[0]
    assert r["zbv"] < 1e-4 and r["izb"] < 1e-4
    assert r["zbv_grads_on_cuda"] and r["izb_grads_on_cuda"]


@pytest.mark.timeout(300)
def test_the_per_stage_sync_hook_launches_a_cuda_all_reduce_per_stage():
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_dp_sync_on_cuda)[0]
    (per_stage,) = [s for s in r["steps"] if s["mode"] == "per_stage"]
    assert sorted(per_stage["launched"]) == r["stages"] == [0, 1]
    assert per_stage["launched"][1] < per_stage["launched"][0]  # the later chunk finishes first
    assert r["grads_on_cuda"]


def test_gemm_times_measure_on_the_gpu():
    from dtlab.parallel.pipeline.micro_batch import gemm_times, pipeline_steps

    times = gemm_times([1, 4, 16], seq_len=128, d_model=1024, device="cuda",
                       dtype=torch.bfloat16, repeats=5)  # fmt: skip
    assert all(t.seconds > 0 and math.isfinite(t.flop_per_s) for t in times)
    rows = pipeline_steps(times, 16, p=4, v=2)
    assert [r.micro_batch for r in rows] == [1, 4, 16]
    for t in times:
        print(f"b={t.micro_batch}: {t.seconds * 1e6:.1f} us, {t.flop_per_s / 1e12:.1f} TFLOP/s")
