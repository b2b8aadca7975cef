"""Expert parallelism equals one process with the same router decisions.

Every rank builds the same MoE GPT (fp64, the per-expert loop), keeps its EP block of experts
(:func:`parallelize_experts`) and runs its own batch shard; the reference is one process running
the full model on every shard in turn with loss = mean over shards. The mean loss, every aux
loss, every dense gradient and every expert gradient (this rank's slice of the reference's) must
match, and so must each layer's routing (chosen experts and capacity drops) — with a capacity
factor that drops tokens and without one, for EP = 2 and 4, and EP = 2 inside DP = 4 (expert
gradients over ``edp``, dense over ``dp``).
"""

from __future__ import annotations

import pytest
import torch

TOLERANCE = 1e-10


def _ep_gpt_step(
    ep: int, capacity_factor: float | None, score: str = "softmax", collectives: str = "dtlab"
) -> dict:
    import torch.distributed as dist

    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.models.moe import MoEConfig, moe_layers, moe_mlp_factory
    from dtlab.parallel.expert import ExpertParallel

    world = dist.get_world_size()
    config = GPTConfig.tiny(seq_len=8, d_model=16, n_heads=2)
    moe = MoEConfig(
        n_experts=4,
        top_k=2,
        capacity_factor=capacity_factor,
        score=score,
        shared_expert=True,
        z_loss_weight=1e-3,
        backend="loop",
        every=2,  # block 1 only: a dense block and an MoE block
    )
    factory = moe_mlp_factory(moe)
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=2 * world, seed=5)[0]
    shards = list(zip(tokens.chunk(world), targets.chunk(world), strict=True))

    reference = GPT(config, seed=0, dtype=torch.float64, mlp_factory=factory)
    ref_aux, ref_routing, total = [], [], 0.0
    for x, y in shards:
        loss = loss_fn(reference(x), y) + reference.aux_loss
        ref_aux.append(reference.aux_loss.item())
        ref_routing.append(
            [(m.routing.expert_index, m.routing.keep) for m in moe_layers(reference)]
        )
        total = total + loss / world
    total.backward()

    mesh = Mesh(dp=world, ep=ep)
    parallel = ExpertParallel(mesh, collectives)
    model = GPT(config, seed=0, dtype=torch.float64, mlp_factory=factory)
    parallel.parallelize(model)
    x, y = shards[mesh.dp_rank]
    loss = loss_fn(model(x), y) + model.aux_loss
    loss.backward()
    parallel.average_gradients(model)
    mean_loss = loss.detach().clone()
    parallel.dp.all_reduce(mean_loss)

    per = moe.n_experts // ep
    ref_params = dict(reference.named_parameters())
    worst = {}
    for name, p in model.named_parameters():
        want = ref_params[name].grad
        if ".experts." in name:
            want = want[mesh.ep_rank * per : (mesh.ep_rank + 1) * per]
        worst[name] = (p.grad - want).abs().max().item()
    layer = moe_layers(model)[0]
    same_decisions = all(
        torch.equal(m.routing.expert_index, index) and torch.equal(m.routing.keep, keep)
        for m, (index, keep) in zip(moe_layers(model), ref_routing[mesh.dp_rank], strict=True)
    )
    return {
        "same_decisions": same_decisions,
        "loss": abs(mean_loss.item() / world - total.item()),
        "aux": abs(model.aux_loss.item() - ref_aux[mesh.dp_rank]),
        "grads": max(worst.values()),
        "worst": max(worst, key=worst.get),
        "dropped": layer.stats.dropped,
        "expert_shape": tuple(layer.experts.fc_in.weight.shape),
    }


def _check(results, ep, dropping):
    for r in results:
        assert r["same_decisions"], "the EP router chose or dropped differently from one process"
        assert r["loss"] < TOLERANCE and r["aux"] < TOLERANCE, r
        assert r["grads"] < TOLERANCE, r
        assert r["expert_shape"][0] == 4 // ep
    if dropping:
        assert sum(r["dropped"] for r in results) > 0, "the capacity case must drop tokens"
    else:
        assert all(r["dropped"] == 0 for r in results)


@pytest.mark.parametrize(
    ("capacity_factor", "collectives"), [(None, "dtlab"), (0.75, "dtlab"), (0.75, "torch")]
)
def test_ep2_gpt_step_equals_one_process_with_and_without_dropping(
    cluster2, capacity_factor, collectives
):
    results = cluster2.run(_ep_gpt_step, 2, capacity_factor, "softmax", collectives)
    _check(results, 2, capacity_factor is not None)


@pytest.mark.parametrize(
    ("capacity_factor", "score"), [(None, "softmax"), (0.75, "softmax"), (0.75, "sigmoid")]
)
def test_ep4_gpt_step_equals_one_process_with_and_without_dropping(
    cluster4, capacity_factor, score
):
    _check(cluster4.run(_ep_gpt_step, 4, capacity_factor, score), 4, capacity_factor is not None)


def test_ep2_inside_dp4_averages_experts_over_edp_and_dense_over_dp(cluster4):
    _check(cluster4.run(_ep_gpt_step, 2, None), 2, False)
