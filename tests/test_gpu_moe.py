"""Mixture of experts on CUDA tensors over NCCL (one GPU: an EP group of one rank). Skipped
without CUDA; ``pytest -m gpu`` selects it. The CPU suite proves the cross-rank arithmetic on
gloo; this proves that routing, the grouped GEMM (bf16, where this torch has it on CUDA), the
count exchange, both all-to-alls and the gradient averaging accept CUDA tensors on NCCL, and equal
a one-process MoE GPT step."""

from __future__ import annotations

import pytest
import torch

import dtlab

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _moe_on_cuda() -> dict:
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.models.moe import MoE, MoEConfig, moe_layers, moe_mlp_factory
    from dtlab.models.moe_experts import grouped_mm_available
    from dtlab.parallel.expert import ExpertParallel

    device = dtlab.device()
    config = GPTConfig.tiny()
    x, y = (t.to(device) for t in SyntheticTokens(config, 1, 4)[0])
    factory = moe_mlp_factory(MoEConfig(n_experts=4, top_k=2, capacity_factor=1.0, backend="loop"))
    out = {}
    for via in ("torch", "dtlab"):
        reference = GPT(config, seed=0, device=device, mlp_factory=factory)
        ref_loss = loss_fn(reference(x), y) + reference.aux_loss
        ref_loss.backward()
        parallel = ExpertParallel(Mesh(dp=1, ep=1), via)
        model = GPT(config, seed=0, device=device, mlp_factory=factory)
        parallel.parallelize(model)
        loss = loss_fn(model(x), y) + model.aux_loss
        loss.backward()
        parallel.average_gradients(model)
        ref = dict(reference.named_parameters())
        out[f"loss_{via}"] = abs(loss.item() - ref_loss.item())
        out[f"grad_{via}"] = max(
            (p.grad - ref[n].grad).abs().max().item() for n, p in model.named_parameters()
        )
        out[f"dropped_{via}"] = sum(m.stats.dropped for m in moe_layers(model))
    out["grouped_available"] = grouped_mm_available(torch.bfloat16, device)
    if out["grouped_available"]:
        results = {}
        for backend in ("grouped", "loop"):
            torch.manual_seed(0)
            cfg = MoEConfig(n_experts=4, top_k=2, backend=backend)
            layer = MoE(GPTConfig.tiny(d_model=64), cfg, device).to(torch.bfloat16)
            h = torch.randn(256, 64, device=device, dtype=torch.bfloat16)
            y = layer(h)[0]
            y.float().square().mean().backward()
            results[backend] = (y.float(), layer.experts.fc_in.weight.grad.float())
        out["grouped_gap"] = (results["grouped"][0] - results["loop"][0]).abs().max().item()
        grads = results["grouped"][1], results["loop"][1]
        out["grouped_grad_rel"] = ((grads[0] - grads[1]).norm() / grads[1].norm()).item()
        auto = MoE(GPTConfig.tiny(d_model=64), MoEConfig(n_experts=4, top_k=2), device)
        out["auto_backend"] = auto.experts.resolved_backend(h)
    return out


@pytest.mark.timeout(300)
def test_moe_and_expert_parallel_run_on_cuda_tensors_over_nccl():
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_moe_on_cuda)[0]
    for via in ("torch", "dtlab"):
        assert r[f"loss_{via}"] < 1e-5 and r[f"grad_{via}"] < 1e-5, r
    if r["grouped_available"]:
        assert r["grouped_gap"] < 5e-2, r  # bf16: two kernels, same values to rounding
        assert r["grouped_grad_rel"] < 2e-2, r  # and the same gradients through _grouped_mm
        assert r["auto_backend"] == "grouped", r


def _unaligned_widths_on_cuda() -> dict:
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.models.moe import MoEConfig, moe_layers, moe_mlp_factory
    from dtlab.models.moe_experts import Experts, grouped_mm_available

    device = dtlab.device()
    out = {}
    config = GPTConfig.tiny(d_model=30, n_heads=3)  # the repro: 120-byte fp32 rows
    x, y = (t.to(device) for t in SyntheticTokens(config, 1, 4)[0])
    for dtype in (torch.float32, torch.bfloat16):
        runs = {}
        for backend in ("auto", "loop"):
            factory = moe_mlp_factory(MoEConfig(backend=backend))
            model = GPT(config, seed=0, device=device, mlp_factory=factory).to(dtype)
            loss = loss_fn(model(x).float(), y) + model.aux_loss
            loss.backward()
            runs[backend] = (loss.detach(), {n: p.grad for n, p in model.named_parameters()})
            layers = moe_layers(model)
            out[f"{dtype}_{backend}_ran"] = [m.experts.last_backend for m in layers]
            out[f"{dtype}_{backend}_why"] = [m.experts.fallback_reason for m in layers]
        (auto_loss, auto_grads), (loop_loss, loop_grads) = runs["auto"], runs["loop"]
        out[f"{dtype}_loss_gap"] = (auto_loss - loop_loss).abs().item()
        out[f"{dtype}_grad_rel"] = max(  # the same kernels; atomics may reorder some sums
            (g.float() - loop_grads[n].float()).norm().item()
            / max(loop_grads[n].float().norm().item(), 1e-12)
            for n, g in auto_grads.items()
        )
        out[f"{dtype}_kernel"] = grouped_mm_available(dtype, device)
    experts = Experts(2, 64, 128, device=device).to(torch.bfloat16)  # aligned widths in bf16
    storage = torch.randn(6 * 64 + 1, device=device, dtype=torch.bfloat16)
    shifted = storage[1:].view(6, 64)  # starts 2 bytes past a 16-byte boundary
    with torch.no_grad():
        got = experts(shifted, [3, 3])
        out["shifted_ran"], out["shifted_why"] = experts.last_backend, experts.fallback_reason
        experts.backend = "loop"
        out["shifted_equal"] = torch.equal(got, experts(shifted, [3, 3]))  # no atomics here
    return out


@pytest.mark.timeout(300)
def test_auto_on_unaligned_rows_falls_back_to_the_loop_on_cuda_and_says_so():
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_unaligned_widths_on_cuda)[0]
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        assert r[f"{dtype}_auto_ran"] == ["loop", "loop"], r
        reason = "d_model=30" if r[f"{dtype}_kernel"] else "no torch._grouped_mm"
        assert all(reason in why for why in r[f"{dtype}_auto_why"]), r
        assert r[f"{dtype}_loop_why"] == [None, None], r
        assert r[f"{dtype}_loss_gap"] <= tolerance and r[f"{dtype}_grad_rel"] <= tolerance, r
    reason = "bytes past" if r[f"{torch.bfloat16}_kernel"] else "no torch._grouped_mm"
    assert r["shifted_ran"] == "loop" and reason in r["shifted_why"], r
    assert r["shifted_equal"], r


def _token_exchange_on_cuda() -> dict:
    from dtlab.comm import Communicator
    from dtlab.parallel.expert import TokenExchange

    device = dtlab.device()
    counts = torch.tensor([3, 0, 2, 1], device=device)
    rows = torch.randn(6, 8, device=device, dtype=torch.bfloat16)
    out = {}
    for via in ("dtlab", "torch"):
        exchange = TokenExchange(Communicator(None, collectives=via, dim="ep"))
        pointers = []
        for _ in range(2):
            splits = exchange.exchange_counts(counts, 8, rows.dtype)
            arrived = exchange.exchange_rows(rows, splits.send, splits.recv, "dispatch")
            pointers.append(arrived.data_ptr())
        out[via] = {
            "equal": torch.equal(arrived, rows),
            "on_cuda": arrived.is_cuda,
            "kept": pointers[0] == pointers[1],
            "splits": (splits.send, splits.recv, splits.received.tolist()),
        }
    return out


@pytest.mark.timeout(300)
def test_token_exchange_keeps_its_cuda_buffers_and_moves_rows_over_nccl():
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_token_exchange_on_cuda)[0]
    for via in ("dtlab", "torch"):
        assert r[via]["equal"] and r[via]["on_cuda"] and r[via]["kept"], r
        assert r[via]["splits"] == ([6], [6], [[3, 0, 2, 1]]), r
