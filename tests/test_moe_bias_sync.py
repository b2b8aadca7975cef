"""DeepSeek-V3's balancing bias under data parallelism: the loads are summed over ``dp`` before the
bias step, so every rank's bias (a buffer that steers its routing) stays equal to the bias one
process computes from the whole batch; updating from each rank's own load lets them drift."""

from __future__ import annotations

import torch


def _bias_after_steps(synced: bool) -> dict:
    import torch.distributed as dist

    from dtlab.mesh import Mesh
    from dtlab.models import GPTConfig
    from dtlab.models.moe import MoE, MoEConfig
    from dtlab.parallel.expert import ExpertParallel

    world, rank = dist.get_world_size(), dist.get_rank()
    config = GPTConfig.tiny(d_model=16, n_heads=2)
    cfg = MoEConfig(n_experts=4, top_k=2, bias_balancing=True, bias_update_rate=0.1, backend="loop")
    torch.manual_seed(0)
    layer, reference = MoE(config, cfg), MoE(config, cfg)
    reference.load_state_dict(layer.state_dict())
    parallel = ExpertParallel(Mesh(dp=world, ep=world), "dtlab")
    parallel.parallelize(layer)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        xs = torch.randn(world, 32, 16, generator=g)
        xs[0] += 2.0  # rank 0's shard leans on other experts than rank 1's
        with torch.no_grad():
            layer(xs[rank])
            reference(xs.reshape(-1, 16))  # one process, the whole batch
        if synced:
            parallel.update_balancing_biases(layer)
        else:
            layer.update_balancing_bias()  # this rank's load only
        reference.update_balancing_bias()
    return {"bias": layer.balancing_bias.clone(), "reference": reference.balancing_bias.clone()}


def test_bias_steps_on_the_dp_summed_load_equal_one_process_on_every_rank(cluster2):
    for r in cluster2.run(_bias_after_steps, True):
        assert torch.equal(r["bias"], r["reference"]), r


def test_bias_steps_on_each_ranks_own_load_drift_apart(cluster2):
    first, second = (r["bias"] for r in cluster2.run(_bias_after_steps, False))
    assert not torch.equal(first, second)
