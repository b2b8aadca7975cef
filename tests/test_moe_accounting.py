"""The EP MoE layer alone: equal to one process (outputs, aux loss, input and weight gradients),
its all-to-all bytes counted per rank equal to the formula from the actual token counts, capacity
counted per rank (an expert receives up to ``ep·C`` rows), and a planted hot expert showing as
imbalance, drops and the busiest rank on the timeline."""

from __future__ import annotations

import math

import pytest
import torch

from dtlab.cost.moe import dispatch_bytes_from_counts

D, T = 16, 24


def _planted_layer(n_experts: int, top_k: int, capacity_factor, hot: float, dtype, backend):
    from dtlab.models import GPTConfig
    from dtlab.models.moe import MoE, MoEConfig

    torch.manual_seed(0)
    config = GPTConfig.tiny(d_model=D, n_heads=2)
    cfg = MoEConfig(
        n_experts=n_experts,
        top_k=top_k,
        capacity_factor=capacity_factor,
        z_loss_weight=1e-2,
        backend=backend,
    )
    layer = MoE(config, cfg).to(dtype)
    direction = torch.ones(D, dtype=dtype) / math.sqrt(D)
    with torch.no_grad():
        layer.router.weight[0] += hot * direction  # expert 0 likes every token's shared offset
    return layer, direction


def _layer_on_rank(ep: int, capacity_factor, hot: float, dtype=torch.float64, backend="loop"):
    import copy

    import torch.distributed as dist

    from dtlab.mesh import Mesh
    from dtlab.parallel.expert import ExpertParallel, parallelize_experts

    world, rank = dist.get_world_size(), dist.get_rank()
    layer, direction = _planted_layer(2 * ep, 2, capacity_factor, hot, dtype, backend)
    reference = copy.deepcopy(layer)
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(world, T, D, generator=g, dtype=dtype) + 2.0 * direction
    grads_out = torch.randn(world, T, D, generator=g, dtype=dtype)

    ref_out, ref_aux, ref_x_grad = [], [], []
    for r in range(world):
        x = xs[r].clone().requires_grad_()
        out, aux = reference(x)
        ((out * grads_out[r]).sum() + aux).backward()  # parameter grads: the sum over shards
        ref_out.append(out.detach())
        ref_aux.append(aux.item())
        ref_x_grad.append(x.grad)

    parallel = ExpertParallel(Mesh(dp=world, ep=ep), "dtlab")
    parallelize_experts(layer, parallel.ep)
    x = xs[rank].clone().requires_grad_()
    out, aux = layer(x)
    ((out * grads_out[rank]).sum() + aux).backward()
    sent_forward_backward = parallel.ep.comm_stats.bytes_sent
    parallel.average_gradients(layer)  # the mean over shards: compare world · grad with the sum

    per, ep_rank = layer.experts.n_experts, parallel.mesh.ep_rank  # this rank's share
    ref_params = dict(reference.named_parameters())
    grad_gap = 0.0
    for name, p in layer.named_parameters():
        want = ref_params[name].grad
        if ".experts." in f".{name}":
            want = want[ep_rank * per : (ep_rank + 1) * per]
        grad_gap = max(grad_gap, (p.grad * world - want).abs().max().item())
    return {
        "out": (out - ref_out[rank]).abs().max().item(),
        "aux": abs(aux.item() - ref_aux[rank]),
        "x_grad": (x.grad - ref_x_grad[rank]).abs().max().item(),
        "grads": grad_gap,
        "tokens_per_expert": layer.stats.tokens_per_expert,
        "kept": layer.stats.kept_per_expert,
        "dropped": layer.stats.dropped,
        "capacity": layer.stats.capacity,
        "received": layer.stats.received_per_local_expert,
        "imbalance": layer.stats.imbalance,
        "bytes": layer.stats.all_to_all_bytes,
        "sent_forward_backward": sent_forward_backward,
        "element": xs.element_size(),
    }


def _assert_equal_to_one_process(results, tolerance):
    for r in results:
        assert r["out"] < tolerance and r["aux"] < tolerance, r
        assert r["x_grad"] < tolerance and r["grads"] < tolerance, r


@pytest.mark.parametrize("capacity_factor", [None, 1.0])
def test_ep4_moe_layer_equals_one_process_outputs_aux_and_every_gradient(cluster4, capacity_factor):
    results = cluster4.run(_layer_on_rank, 4, capacity_factor, 1.0)
    _assert_equal_to_one_process(results, 1e-10)
    if capacity_factor is not None:
        assert sum(r["dropped"] for r in results) > 0


def test_ep2_moe_layer_with_grouped_gemm_equals_one_process_in_fp32(cluster2):
    from dtlab.models.moe_experts import grouped_mm_available

    backend = "grouped" if grouped_mm_available(torch.float32) else "loop"
    results = cluster2.run(_layer_on_rank, 2, 1.0, 1.0, torch.float32, backend)
    _assert_equal_to_one_process(results, 1e-5)


def test_dispatch_and_combine_bytes_per_rank_equal_the_formula_from_actual_counts(cluster2):
    results = cluster2.run(_layer_on_rank, 2, 1.25, 3.0)
    kept = [r["kept"] for r in results]
    for rank, r in enumerate(results):
        want = dispatch_bytes_from_counts(kept, rank, D, r["element"])
        assert r["bytes"] == {
            "counts": want.counts,
            "dispatch": want.dispatch,
            "combine": want.combine,
        }
        assert r["sent_forward_backward"] == want.forward_and_backward
    # uneven routing: the two ranks send different byte counts, so the formula is not symmetric
    assert results[0]["bytes"]["combine"] != results[1]["bytes"]["combine"]


def test_capacity_is_ceil_c_t_k_over_e_and_each_expert_keeps_at_most_that(cluster2):
    results = cluster2.run(_layer_on_rank, 2, 1.25, 3.0)
    for r in results:
        assert r["capacity"] == math.ceil(1.25 * T * 2 / 4)
        assert r["kept"] == [min(n, r["capacity"]) for n in r["tokens_per_expert"]]
        assert r["dropped"] == sum(r["tokens_per_expert"]) - sum(r["kept"])


def test_in_expert_parallel_capacity_is_per_rank_so_an_expert_receives_ep_times_c(cluster2):
    results = cluster2.run(_layer_on_rank, 2, 1.0, 6.0)  # every token's choice includes expert 0
    capacity = math.ceil(1.0 * T * 2 / 4)  # from one rank's T tokens, not the 2·T of the batch
    for r in results:
        assert r["capacity"] == capacity and r["kept"][0] == capacity < r["tokens_per_expert"][0]
    assert results[0]["received"][0] == 2 * capacity  # expert 0 (on rank 0): C from each rank


def test_a_planted_hot_expert_shows_imbalance_drops_and_the_busiest_rank_on_the_timeline(
    cluster2,
):
    hot = cluster2.run(_layer_on_rank, 2, 1.0, 6.0)
    cool = cluster2.run(_layer_on_rank, 2, 1.0, 0.0)
    for h, c in zip(hot, cool, strict=True):
        assert h["tokens_per_expert"][0] == T  # every token chose the hot expert:
        assert h["imbalance"] == 4 / 2 > c["imbalance"]  # the most k=2 of E=4 allows (E/k)
        assert h["dropped"] > c["dropped"]
    spans = [s for s in hot.trace.spans if s.name == "moe_experts"]
    tokens_by_rank = {s.rank: s.labels["tokens"] for s in spans}
    assert max(tokens_by_rank, key=tokens_by_rank.get) == 0  # expert 0 lives on rank 0
    assert {s.name for s in hot.trace.spans} >= {"moe_dispatch", "moe_combine", "moe_experts"}
