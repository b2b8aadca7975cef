"""Activation memory on CUDA: the allocator against the formula, recomputation and offloading.

Skipped without CUDA; ``pytest -m gpu`` selects it. On a GPU the fused dropout kernel saves a
bool mask (``mask_bytes = 1``, Korthikanti's convention), and the caching allocator measures what
the forward pass leaves allocated. The shapes make every saved tensor a multiple of the
allocator's 512-byte block, so its count is exact: ``h = 128`` (4 heads of 32), ``s = 64``,
``b = 4``.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

B, S, H = 4, 64, 128


def _config(**overrides):
    from dtlab.models import GPTConfig

    base = dict(vocab_size=64, seq_len=S, d_model=H, n_layers=2, n_heads=4, dropout=0.1)
    return GPTConfig(**{**base, **overrides})


def test_allocator_and_hooks_agree_with_the_formula_on_cuda():
    from dtlab.memory import ActivationMeter
    from dtlab.memory.activation_families import lab_layer_families, measured_families
    from dtlab.models import GPT

    device = torch.device("cuda")
    config = _config()
    block = GPT(config, seed=0, device=device).blocks[0].train()
    x = torch.randn(B, S, H, device=device, requires_grad=True)
    positions = torch.arange(S, device=device)
    block(x, positions).sum().backward()  # warm-up: cuBLAS workspace, kernels
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with ActivationMeter(block) as meter:
        y = block(x, positions)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    formula = lab_layer_families(config, B, S, mask_bytes=1)
    assert measured_families(meter.records, S, H, config.head_dim) == formula
    # The formula's first layer-norm input *is* the block's input x, allocated before `before`;
    # what the forward adds beside the saved tensors is its output y (the same size as x).
    assert (
        held == sum(formula.values()) - x.numel() * x.element_size() + y.numel() * y.element_size()
    )


def test_recomputation_on_cuda_is_bit_exact_and_frees_what_the_formula_says():
    from dtlab.memory.activation_families import lab_layer_families
    from dtlab.models import GPT, SyntheticTokens, loss_fn
    from dtlab.parallel.activations.recomputation import Recomputed, recompute_attention_core

    device = torch.device("cuda")
    config = _config()
    tokens, targets = (t.to(device) for t in SyntheticTokens(config, 1, batch_size=B)[0])
    results = {}
    for mode in ("plain", "selective", "full"):
        model = GPT(config, seed=0, device=device).train()
        run = Recomputed(model) if mode == "full" else model
        if mode == "selective":
            recompute_attention_core(model)
        loss_fn(run(tokens), targets).backward()  # warm-up
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.manual_seed(0)
        before = torch.cuda.memory_allocated()
        logits = run(tokens)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - before
        loss_fn(logits, targets).backward()
        results[mode] = (held, [p.grad.clone() for p in model.parameters()])
        # logits' graph holds this model's parameters (AccumulateGrad nodes): dropped here, not
        # by the next mode's `logits = ...`, which would free them inside that mode's measurement.
        del logits, run, model
    per_layer = lab_layer_families(config, B, S, mask_bytes=1)
    plain_held, plain_grads = results["plain"]
    for mode in ("selective", "full"):
        assert all(torch.equal(a, b) for a, b in zip(results[mode][1], plain_grads, strict=True))
    s2 = per_layer["scores"] + per_layer["causal_mask"]
    assert plain_held - results["selective"][0] == config.n_layers * s2
    assert results["full"][0] < results["selective"][0]


def test_offloading_on_cuda_moves_the_saved_bytes_off_the_device():
    from dtlab.memory import ActivationMeter
    from dtlab.models import GPT
    from dtlab.parallel.activations.offload import OffloadActivations

    device = torch.device("cuda")
    block = GPT(_config(), seed=0, device=device).blocks[0].train()
    x = torch.randn(B, S, H, device=device, requires_grad=True)
    block(x).sum().backward()
    with ActivationMeter(block) as meter:
        block(x).sum().backward()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with OffloadActivations() as offload:
        y = block(x)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    y.sum().backward()
    assert offload.stats.bytes_to_host == meter.total_bytes
    assert offload.stats.bytes_to_device == offload.stats.bytes_to_host
    assert held == y.numel() * y.element_size()  # only the output stays on the device
