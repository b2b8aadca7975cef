"""Expert parallel folded over tensor parallel, on CUDA tensors over NCCL (one GPU, a 1-rank
cluster). Skipped without CUDA; ``pytest -m gpu`` selects it.

One rank cannot show the cross-rank arithmetic — tp = ep = 1 moves no token and reduces nothing
across ranks; that is the CPU suite's (tests/test_compose_ep_tp.py, 4 gloo ranks). What runs
here is the code path on CUDA: ``compose_gpt`` with ``expert_parallel=1`` takes the folded path
(its ``ep``/``edp`` groups made from :class:`~dtlab.parallel.compose.folding.FoldedMapping`, the
expert gradients reduced over the folded ``edp``), and an MoE layer split over a 1-rank TP group
runs its slice-and-all-gather autograd functions — through torch's collectives an NCCL
all-gather of one rank in each direction (dtlab's ring sends nothing on one rank: it runs too,
for its buffers' devices) — both equal to the plain model on the same GPU."""

from __future__ import annotations

import pytest
import torch

import dtlab

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _moe_gpt(device):
    from dtlab.models import GPT, GPTConfig
    from dtlab.models.moe import MoEConfig, moe_mlp_factory

    config = GPTConfig.tiny(seq_len=16, d_model=32, n_layers=2, vocab_size=64, dropout=0.0)
    moe = MoEConfig(n_experts=4, top_k=2, every=2, aux_loss_weight=0.0, backend="loop")
    return GPT(config, seed=0, mlp_factory=moe_mlp_factory(moe)).to(device)


def _folded_on_cuda() -> dict:
    from dtlab.comm import Communicator
    from dtlab.mesh import Mesh
    from dtlab.models import SyntheticTokens, loss_fn
    from dtlab.models.moe import moe_layers
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.expert.tensor_split import split_moe_over_tp

    device = dtlab.device()
    reference = _moe_gpt(device)
    x, y = (t.to(device) for t in SyntheticTokens(reference.config, 1, 4, seed=3)[0])
    want = loss_fn(reference(x), y)
    want.backward()
    grads = {n: p.grad for n, p in reference.named_parameters()}

    composed = compose_gpt(_moe_gpt(device), Mesh(), expert_parallel=1, collectives="dtlab")
    loss = composed.train_step(x, y)
    error = max((p.grad - grads[n]).abs().max().item() for n, p in composed.named_parameters())

    out = {
        "loss": abs(loss - want.item()),
        "grads": error,
        "folded": composed.folded is not None,
        "expert_reduced": composed.placements["blocks.1.mlp.experts.fc_in.weight"].reduced_over,
    }
    h = torch.randn(2, 16, 32, device=device, requires_grad=True)
    for via in ("torch", "dtlab"):  # torch: dist.all_gather_into_tensor on the NCCL group
        layer = moe_layers(_moe_gpt(device))[0]
        plain, _ = layer(h)
        (plain_grad,) = torch.autograd.grad(plain.sum(), h)
        split_moe_over_tp(layer, Communicator(None, collectives=via, dim="tp"), False)
        split, _ = layer(h)
        (split_grad,) = torch.autograd.grad(split.sum(), h)
        out[f"{via}_split"] = (split - plain).abs().max().item()
        out[f"{via}_split_grad"] = (split_grad - plain_grad).abs().max().item()
        out[f"{via}_on"] = {split.device.type, split_grad.device.type}
    return out


@pytest.mark.timeout(300)
def test_folded_experts_and_the_tp_token_split_run_on_cuda_tensors_over_nccl():
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_folded_on_cuda)[0]
    assert r["folded"] and r["expert_reduced"] == ()  # edp of one rank: nothing to reduce
    assert r["loss"] < 1e-5 and r["grads"] < 1e-5, r
    for via in ("torch", "dtlab"):
        assert r[f"{via}_split"] < 1e-6 and r[f"{via}_split_grad"] < 1e-6, r
        assert r[f"{via}_on"] == {"cuda"}, r
