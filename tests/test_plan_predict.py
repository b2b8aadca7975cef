"""The planner's prediction of a composed step's traffic equals the bytes the cluster counts, and
its model state per rank by category is within 5 % of what the ranks hold.

Each rank composes the same fp32 tiny GPT over a mesh with ``collectives="dtlab"`` (every byte
counted from a real message), runs one training step, and compares its counted bytes — by group
and collective — with :func:`dtlab.plan.predict.predicted_traffic`, which computes them from the
config and the layout alone. Any collective the planner forgets, or the code adds, fails the test.
"""

from __future__ import annotations

import pytest

import dtlab


def _counted_and_predicted(
    degrees: dict, data_parallel: str, sp: bool, vocab: int = 64, dtype: str = "float32"
) -> dict:
    import torch

    from dtlab.mesh import Layout, Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.pipeline import one_f_one_b
    from dtlab.plan.predict import parameters_per_rank, predicted_state_bytes, predicted_traffic

    config = GPTConfig.tiny(seq_len=16, d_model=32, n_layers=4, vocab_size=vocab, dropout=0.0)
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=4, seed=3)[0]
    mesh = Mesh(**degrees)
    composed = compose_gpt(
        GPT(config, seed=0, dtype=getattr(torch, dtype)),
        mesh,
        data_parallel=data_parallel,
        sequence_parallel=sp,
        schedule=one_f_one_b(mesh.pp_size, 2) if mesh.pp_size > 1 else None,
        collectives="dtlab",
    )
    held = sum(p.numel() for _, p in composed.named_parameters())
    opt = torch.optim.AdamW(composed.parameters(), lr=1e-3)
    composed.reset_traffic()
    composed.train_step(tokens, targets)
    opt.step()
    params = composed.parameters()
    measured_state = {
        "parameters": sum(p.numel() * p.element_size() for p in params),
        "gradients": sum(p.grad.numel() * p.grad.element_size() for p in params),
        "optimizer": sum(
            t.numel() * t.element_size()
            for state in opt.state.values()
            for key, t in state.items()
            if key != "step"  # a 0-dim counter per tensor, not a moment
        ),
    }
    layout = Layout(**degrees)
    predicted = predicted_traffic(
        config, layout, global_batch=4, pp_rank=mesh.pp_rank, n_micro=2,
        sequence_parallel=sp, data_parallel=data_parallel,
        bytes_per_element=getattr(torch, dtype).itemsize,
    )  # fmt: skip
    predicted_state = predicted_state_bytes(
        config,
        layout,
        pp_rank=mesh.pp_rank,
        data_parallel=data_parallel,
        bytes_per_element=getattr(torch, dtype).itemsize,
    )
    return {
        "state": {k: measured_state[k] / predicted_state[k] for k in predicted_state},
        "counted": composed.traffic(),
        "measured_counted": all(c.comm_stats.counted for c in composed.communicators.values()),
        "predicted": predicted,
        "held": held,
        "predicted_held": parameters_per_rank(config, layout, mesh.pp_rank)
        // (mesh.dp_size if data_parallel == "fsdp" else 1),
        "dtype_bytes": getattr(torch, dtype).itemsize,
    }


@pytest.fixture(scope="module")
def cluster8():
    with dtlab.Cluster(8, timeout=300) as cluster:
        yield cluster


@pytest.mark.parametrize(
    ("degrees", "data_parallel", "sp", "vocab", "dtype"),
    [
        ({"pp": 2, "dp": 2, "tp": 2}, "ddp", False, 64, "float32"),
        ({"pp": 2, "dp": 2, "tp": 2}, "ddp", False, 63, "float32"),  # padded: 32 rows per rank
        ({"dp": 2, "cp": 2, "tp": 2}, "ddp", True, 64, "float32"),
        ({"dp": 4, "tp": 2}, "fsdp", False, 64, "float32"),
        ({"pp": 2, "cp": 2, "tp": 2}, "ddp", False, 64, "float32"),
        ({"pp": 2, "dp": 2, "tp": 2}, "ddp", False, 64, "float64"),  # lab 11 runs in FP64
    ],
)
def test_predicted_bytes_per_group_and_collective_equal_the_counted_bytes(
    cluster8, degrees, data_parallel, sp, vocab, dtype
):
    results = cluster8.run(_counted_and_predicted, degrees, data_parallel, sp, vocab, dtype)
    for rank, result in enumerate(results):
        assert result["measured_counted"]
        assert result["counted"] == result["predicted"], rank
        assert result["held"] == result["predicted_held"], rank
        for category, ratio in result["state"].items():  # measured ÷ predicted, within 5 %
            assert abs(ratio - 1) <= 0.05, (rank, category, ratio)
