"""The router's count all-reduces (context parallel, global batch, bias step) on CUDA tensors over
NCCL. Skipped without CUDA; ``pytest -m gpu`` selects it. The CPU suite proves on gloo that the
counts summed over ``cp`` and ``dp`` give one process's loss, gradients and bias; one GPU cannot
hold a cp group of two, so here each reducer is driven through a one-rank NCCL group that says
it has two shards (the sum over one rank is the identity): what this proves is that every tensor
the reducers hand NCCL is on the data's device and NCCL accepts it, and that a composed CUDA step
with every balancing term equals one process."""

from __future__ import annotations

import pytest
import torch

import dtlab

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


class _OneRankSaysTwo:
    """A one-rank communicator that reports two ranks, so the reducers do call it; records the
    device of every tensor it all-reduces."""

    def __init__(self, comm) -> None:
        self.comm, self.dim, self.devices = comm, comm.dim, []

    @property
    def world_size(self) -> int:
        return 2

    def all_reduce(self, tensor: torch.Tensor, name: str = "all_reduce") -> None:
        self.devices.append(tensor.device.type)
        self.comm.all_reduce(tensor, name=name)


def _reducers_on_cuda() -> dict:
    from dtlab.comm import Communicator
    from dtlab.models import GPTConfig
    from dtlab.models.moe import MoE, MoEConfig
    from dtlab.parallel.expert.balance import GlobalLoad, SequenceShards, step_balancing_biases

    device = dtlab.device()
    out = {}
    for via in ("torch", "dtlab"):
        pretend = _OneRankSaysTwo(Communicator(None, collectives=via, dim="cp"))
        torch.manual_seed(0)
        config = GPTConfig.tiny(d_model=16, n_heads=2)
        for scope in ("micro_batch", "sequence", "global"):
            cfg = MoEConfig(n_experts=4, top_k=2, aux_loss_scope=scope, bias_balancing=True)
            layer = MoE(config, cfg, device)
            layer.sequence_shards = SequenceShards(pretend)
            if scope == "global":
                layer.load_reducer = GlobalLoad(pretend, pretend)
            _, aux = layer(torch.randn(2, 8, 16, device=device))
            aux.backward()
            step_balancing_biases(layer, pretend)
            out[f"{via}_{scope}_finite"] = bool(torch.isfinite(aux).item())
            out[f"{via}_{scope}_bias_device"] = layer.balancing_bias.device.type
        out[f"{via}_devices"] = sorted(set(pretend.devices))
        out[f"{via}_calls"] = len(pretend.devices)
    return out


def _composed_step_on_cuda() -> dict:
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.models.moe import MoEConfig, moe_mlp_factory
    from dtlab.parallel.compose import compose_gpt

    device = dtlab.device()
    config = GPTConfig.tiny(seq_len=16, d_model=32, n_layers=2, vocab_size=64, dropout=0.0)
    x, y = (t.to(device) for t in SyntheticTokens(config, 1, 4, seed=3)[0])
    out = {}
    for scope in ("micro_batch", "sequence", "global"):
        moe = MoEConfig(
            n_experts=4, top_k=2, every=2, aux_loss_weight=0.5, aux_loss_scope=scope,
            z_loss_weight=0.1, backend="loop",
        )  # fmt: skip
        factory = moe_mlp_factory(moe)
        reference = GPT(config, seed=0, device=device, mlp_factory=factory)
        ref_loss = loss_fn(reference(x), y) + reference.aux_loss
        model = GPT(config, seed=0, device=device, mlp_factory=factory)
        composed = compose_gpt(model, Mesh(), collectives="torch")
        out[scope] = abs(composed.train_step(x, y) - ref_loss.item())
    return out


def test_count_all_reduces_hand_nccl_tensors_on_the_data_device():
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_reducers_on_cuda)[0]
    for via in ("torch", "dtlab"):
        assert r[f"{via}_devices"] == ["cuda"], r
        # micro-batch and sequence: the loss's counts, then the bias's load; global: cp and dp
        assert r[f"{via}_calls"] == 2 + 2 + 3, r
        for scope in ("micro_batch", "sequence", "global"):
            assert r[f"{via}_{scope}_finite"] and r[f"{via}_{scope}_bias_device"] == "cuda", r


def test_composed_cuda_step_with_every_balancing_term_equals_one_process():
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_composed_step_on_cuda)[0]
    for scope, gap in r.items():
        assert gap < 1e-5, (scope, r)
