"""The experts' two backends: ``auto`` runs ``torch._grouped_mm`` where it can run (one call per
matrix, not one per expert) and the per-expert loop where it cannot — a torch before 2.8, a dtype
the kernel refuses, or operands whose rows are not 16 bytes apart (``d_model=30`` in fp32), decided
per call — with the same values either way, and says which ran (``last_backend``,
``fallback_reason``); availability is probed, whatever the grad mode of the first call."""

from __future__ import annotations

import pytest
import torch

from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, moe_experts
from dtlab.models.moe import MoE, MoEConfig, moe_layers, moe_mlp_factory
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


def _gpt_step(config: GPTConfig, moe: MoEConfig, dtype=torch.float32):
    model = GPT(config, seed=0, mlp_factory=moe_mlp_factory(moe)).to(dtype)
    x, y = SyntheticTokens(config, n_batches=1, batch_size=2, seed=3)[0]
    loss = loss_fn(model(x).float(), y) + model.aux_loss
    loss.backward()
    return model, loss.detach()


@pytest.mark.parametrize(
    ("d_model", "n_heads", "d_expert", "dtype", "too_wide"),
    [
        (30, 3, None, torch.float32, "d_model=30"),  # the repro: 120-byte rows
        (18, 2, None, torch.float32, "d_model=18"),
        (16, 2, 18, torch.float32, "d_hidden=18"),  # aligned model, unaligned experts
        (20, 2, None, torch.bfloat16, "d_model=20"),  # 80 B in fp32 (fine), 40 B in bf16
    ],
)
def test_auto_on_widths_with_unaligned_rows_falls_back_to_the_loop_and_equals_it(
    d_model, n_heads, d_expert, dtype, too_wide
):
    config = GPTConfig.tiny(d_model=d_model, n_heads=n_heads)
    auto, auto_loss = _gpt_step(config, MoEConfig(d_expert=d_expert), dtype)
    loop, loop_loss = _gpt_step(config, MoEConfig(d_expert=d_expert, backend="loop"), dtype)
    for layer in moe_layers(auto):
        assert layer.experts.last_backend == "loop"
        assert too_wide in layer.experts.fallback_reason, layer.experts.fallback_reason
    assert all(layer.experts.fallback_reason is None for layer in moe_layers(loop))  # asked for
    assert torch.equal(auto_loss, loop_loss)  # the same kernels ran: equal bit for bit
    grads = {name: p.grad for name, p in loop.named_parameters()}
    for name, p in auto.named_parameters():
        assert torch.equal(p.grad, grads[name]), name


@pytest.mark.skipif(not HAS_GROUPED, reason="no torch._grouped_mm for fp32 here")
def test_an_aligned_width_runs_the_grouped_gemm_and_equals_the_loop_within_fp32_rounding():
    config = GPTConfig.tiny(d_model=20, n_heads=2)  # 80-byte fp32 rows: the kernel takes them
    auto, auto_loss = _gpt_step(config, MoEConfig())
    loop, loop_loss = _gpt_step(config, MoEConfig(backend="loop"))
    assert [m.experts.last_backend for m in moe_layers(auto)] == ["grouped"] * 2
    assert all(m.experts.fallback_reason is None for m in moe_layers(auto))
    assert torch.allclose(auto_loss, loop_loss, atol=1e-6)
    grads = {name: p.grad for name, p in loop.named_parameters()}
    for name, p in auto.named_parameters():
        assert torch.allclose(p.grad, grads[name], atol=1e-6), name


@pytest.mark.skipif(not HAS_GROUPED, reason="no torch._grouped_mm for fp32 here")
def test_the_refusal_says_exactly_where_the_kernel_refuses_forward_or_backward():
    offsets = torch.tensor([4, 8, 12], dtype=torch.int32)
    for dtype in (torch.float32, torch.bfloat16):
        for d in range(1, 19):
            for hidden in (8, 12, 18, 20):
                x = torch.randn(12, d, dtype=dtype, requires_grad=True)
                w_in = torch.randn(3, d, hidden, dtype=dtype, requires_grad=True)
                w_out = torch.randn(3, hidden, d, dtype=dtype, requires_grad=True)
                refusal = moe_experts.grouped_mm_refusal(x, w_in, w_out)
                try:
                    h = torch._grouped_mm(x, w_in, offs=offsets).relu()
                    torch._grouped_mm(h, w_out, offs=offsets).square().sum().backward()
                    runs = True
                except RuntimeError:
                    runs = False
                assert runs == (refusal is None), (dtype, d, hidden, refusal)


def test_auto_decides_per_call_from_the_operands_not_once_per_process():
    experts = Experts(2, 16, 32)
    aligned = torch.randn(6, 16)
    storage = torch.randn(6 * 16 + 1)
    shifted = storage[1:].view(6, 16)  # the same shape, starting 4 bytes past a boundary
    out_aligned = experts(aligned, [3, 3])
    first = experts.last_backend
    experts(shifted, [3, 3])
    assert experts.last_backend == "loop" and "4 bytes past" in experts.fallback_reason
    assert first == ("grouped" if HAS_GROUPED else "loop")
    assert torch.allclose(experts(aligned.clone(), [3, 3]), out_aligned)
    assert experts.last_backend == first  # and back, on the next aligned call


def test_asking_for_grouped_on_unaligned_rows_is_an_error_that_says_why():
    experts = Experts(2, 30, 120, backend="grouped")
    reason = "120-byte rows" if HAS_GROUPED else "no torch._grouped_mm"
    with pytest.raises(ValueError, match=reason) as error:
        experts(torch.randn(4, 30), [2, 2])
    assert "backend='loop'" in str(error.value)
