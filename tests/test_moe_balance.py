"""Where the balance loss counts its experts: per micro-batch, over the global batch (all
data-parallel ranks and the step's micro-batches), or per sequence (DeepSeek-V3)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dtlab.models import GPTConfig
from dtlab.models.moe import MoE, MoEConfig
from dtlab.models.moe_router import sequence_aux_loss, switch_aux_loss

CONFIG = GPTConfig.tiny(d_model=8, n_heads=2)
E = 4


def _layer(scope: str) -> MoE:
    torch.manual_seed(0)
    layer = MoE(CONFIG, MoEConfig(n_experts=E, top_k=1, aux_loss_scope=scope))
    with torch.no_grad():  # expert i likes direction i: a rank's data decides its experts
        layer.router.weight.copy_(torch.eye(E, CONFIG.d_model) * 4)
    return layer


def _tokens(rank: int, micro_batch: int) -> torch.Tensor:
    """Skewed shards: rank r's tokens lean to experts 2r and 2r+1, so each rank alone is
    unbalanced while the two ranks together are nearly balanced."""
    g = torch.Generator().manual_seed(10 * rank + micro_batch)
    x = torch.randn(2, 16, CONFIG.d_model, generator=g)
    x[..., 2 * rank : 2 * rank + 2] += 3.0
    return x


def _global_step() -> dict:
    from dtlab.comm import Communicator
    from dtlab.parallel.expert.balance import use_global_batch_balance

    rank, world = dist.get_rank(), dist.get_world_size()
    layer, local = _layer("global"), _layer("micro_batch")
    comm = Communicator(None, collectives="dtlab", dim="dp")
    (load,) = use_global_batch_balance(layer, comm)
    load.new_step()
    got, want, per_micro_batch = [], [], []
    counts = torch.zeros(E, dtype=torch.float64)
    for mb in range(2):
        x = _tokens(rank, mb)
        _, aux = layer(x)
        got.append(aux.item() / layer.moe.aux_loss_weight)
        for r in range(world):  # every rank's counts, recomputed here from its shard
            with torch.no_grad():
                local(_tokens(r, mb))
            counts += local.routing.tokens_per_expert.double()
        with torch.no_grad():
            local(x)
        f = counts / counts.sum()
        want.append((E * (f * local.routing.probs.double().mean(0)).sum()).item())
        per_micro_batch.append(local.balance_loss(local.routing).item())
    return {
        "got": got,
        "want": want,
        "local": per_micro_batch,
        "bytes": comm.comm_stats.bytes_sent,
    }


def test_global_scope_counts_every_dp_rank_and_the_steps_micro_batches_so_far(cluster2):
    for r in cluster2.run(_global_step):
        assert r["got"] == pytest.approx(r["want"], rel=1e-6)
        # two all-reduces of E float64 counts on the 2-rank ring: 2·(1/2)·8E bytes each
        assert r["bytes"] == 2 * 2 * (1 / 2) * 8 * E


def test_on_skewed_ranks_the_global_batch_asks_less_balance_than_each_micro_batch(cluster2):
    for r in cluster2.run(_global_step):
        # each rank alone piles onto its two experts; together the ranks cover all four
        assert all(g < loc for g, loc in zip(r["got"], r["local"], strict=True))


def test_sequence_aux_loss_sees_a_skewed_sequence_that_the_batch_balance_hides():
    seq = 8
    expert = torch.cat([torch.zeros(seq, 1), torch.ones(seq, 1)]).long()  # seq 0 → 0, seq 1 → 1
    probs = torch.nn.functional.one_hot(expert[:, 0], 2).double()
    assert switch_aux_loss(probs, expert, 2).item() == pytest.approx(1.0)  # the batch: balanced
    assert sequence_aux_loss(probs, expert, 2, seq).item() == pytest.approx(2.0)  # each: one expert
    balanced = torch.tensor([[0], [1]] * seq)
    even = torch.full((2 * seq, 2), 0.5, dtype=torch.float64)
    assert sequence_aux_loss(even, balanced, 2, seq).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="whole sequences"):
        sequence_aux_loss(probs, expert, 2, 5)


def test_moe_layer_uses_its_scope_and_refuses_an_unknown_one():
    x = _tokens(0, 0)
    seq_layer = _layer("sequence")
    _, aux = seq_layer(x)
    r = seq_layer.routing
    want = sequence_aux_loss(r.probs, r.expert_index, E, x.shape[1])
    assert aux.item() == pytest.approx(seq_layer.moe.aux_loss_weight * want.item())
    lone = _layer("global")  # no reducer installed: this forward's own counts
    _, aux = lone(x)
    want = switch_aux_loss(lone.routing.probs, lone.routing.expert_index, E)
    assert aux.item() == pytest.approx(lone.moe.aux_loss_weight * want.item())
    with pytest.raises(ValueError, match="aux_loss_scope"):
        MoEConfig(aux_loss_scope="rank")
