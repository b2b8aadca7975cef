"""The planner's activation prediction against a CUDA step (one GPU: a 1-rank NCCL cluster, every
degree 1). Skipped without CUDA; ``pytest -m gpu`` selects it. Proves that the saved-tensor-hook
measurement and the prediction agree on device tensors with the math attention core (dropout 0);
the composed layouts' arithmetic is the CPU suite's (tests/test_plan_measured_memory.py)."""

from __future__ import annotations

import pytest
import torch

import dtlab

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _measure_on_cuda() -> dict:
    from dtlab.memory.peak_saved import measure_step_activations
    from dtlab.mesh import Layout, Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens
    from dtlab.parallel.compose import compose_gpt
    from dtlab.plan.predict_activations import predicted_activation_bytes

    device = dtlab.device()
    config = GPTConfig.tiny(
        seq_len=24, d_model=32, n_heads=4, n_layers=4, vocab_size=96, dropout=0.0
    )
    tokens, targets = (t.to(device) for t in SyntheticTokens(config, 1, 8, seed=3)[0])
    composed = compose_gpt(GPT(config, seed=0).to(device), Mesh(), collectives="dtlab")
    measured = measure_step_activations(composed, tokens, targets)
    predicted = predicted_activation_bytes(config, Layout(), global_batch=8)
    return {"measured": measured["peak"], "predicted": sum(predicted.values())}


def test_predicted_activation_bytes_match_a_cuda_step():
    with dtlab.Cluster(1, device="cuda") as cluster:
        result = cluster.run(_measure_on_cuda)[0]
    assert abs(result["measured"] - result["predicted"]) <= 0.05 * result["predicted"], result
