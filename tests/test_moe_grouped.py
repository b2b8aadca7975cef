"""The experts' two backends: ``auto`` runs ``torch._grouped_mm`` where this torch has it (one call
per matrix, not one per expert) and the per-expert loop where it does not (a torch before 2.8, a
dtype the kernel refuses), with the same values either way; availability is probed, whatever the
grad mode of the first call."""

from __future__ import annotations

import pytest
import torch

from dtlab.models import GPTConfig, moe_experts
from dtlab.models.moe import MoE, MoEConfig
from dtlab.models.moe_experts import Experts, grouped_mm_available

CONFIG = GPTConfig.tiny(d_model=16, n_heads=2)
HAS_GROUPED = hasattr(torch, "_grouped_mm") and grouped_mm_available(torch.float32)


def _counting_grouped_mm(monkeypatch) -> list[int]:
    calls = []
    original = torch._grouped_mm

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "_grouped_mm", counted)
    return calls


@pytest.mark.skipif(not HAS_GROUPED, reason="no torch._grouped_mm for fp32 here")
def test_auto_runs_two_grouped_mm_calls_whatever_the_number_of_experts(monkeypatch):
    calls = _counting_grouped_mm(monkeypatch)
    experts = Experts(8, 16, 32)
    assert experts.resolved_backend(torch.ones(1, 16)) == "grouped"
    x = torch.randn(40, 16, requires_grad=True)
    experts(x, [5] * 8).sum().backward()  # the .sum() gradient is expanded: must still work
    assert len(calls) == 2  # fc_in and fc_out, one kernel each for all 8 experts
    assert x.grad is not None and experts.fc_in.weight.grad.abs().sum() > 0


def test_without_grouped_mm_auto_falls_back_to_the_loop_with_the_same_values(monkeypatch):
    torch.manual_seed(0)
    layer = MoE(CONFIG, MoEConfig(n_experts=4, top_k=2, capacity_factor=1.0))
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before, _ = layer(x)
    monkeypatch.delattr(torch, "_grouped_mm")  # a torch older than 2.8
    assert not grouped_mm_available(torch.float32)
    assert layer.experts.resolved_backend(x) == "loop"
    with torch.no_grad():
        after, _ = layer(x)
    assert torch.allclose(before, after, atol=1e-5)
    with pytest.raises(ValueError, match="backend='loop'"):
        Experts(2, 16, 32, backend="grouped")(torch.ones(2, 16), [1, 1])


def test_availability_is_probed_the_same_under_no_grad():
    moe_experts._grouped_mm_runs.cache_clear()
    with torch.no_grad():
        under_no_grad = grouped_mm_available(torch.float32)
    moe_experts._grouped_mm_runs.cache_clear()
    assert under_no_grad == grouped_mm_available(torch.float32) == HAS_GROUPED
    assert not grouped_mm_available(torch.float64)  # no fp64 grouped GEMM: the loop runs


def test_cuda_shapes_with_unaligned_rows_use_the_loop():
    x = torch.ones(4, 12, dtype=torch.bfloat16)
    assert moe_experts.grouped_mm_fits(x, 20)  # CPU: no alignment rule
    fake_cuda = type("T", (), {"device": torch.device("cuda"), "shape": (4, 12)})()
    fake_cuda.element_size = lambda: 2
    assert not moe_experts.grouped_mm_fits(fake_cuda, 64)  # 12 · 2 B is not a multiple of 16
    fake_cuda.shape = (4, 64)
    assert moe_experts.grouped_mm_fits(fake_cuda, 128)
