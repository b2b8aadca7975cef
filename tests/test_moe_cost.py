"""The MoE cost model agrees with the router it models: expected distinct remote nodes of uniform
top-k routing, with and without a node limit (also where the limit cannot bind), and the capacity
formula's edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from dtlab.cost.moe import (
    dispatch_bytes_from_counts,
    distinct_nodes_pmf,
    expert_capacity,
    experts_of_rank,
    inter_node_dispatch_bytes,
)
from dtlab.models.moe_router import route

TOKENS, HIDDEN, E, K, NODES = 4000, 16, 64, 8, 8


def _remote_nodes_per_token(node_limit: int | None, top_k: int = K) -> float:
    """Average distinct nodes other than the sender's among each token's experts, from real
    routing of random tokens (the sender's node drawn uniformly per token)."""
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(TOKENS, HIDDEN, generator=g), torch.randn(E, HIDDEN, generator=g)
    routing = route(x, weight, top_k, n_nodes=NODES, node_limit=node_limit)
    node = routing.expert_index // (E // NODES)
    touched = torch.zeros(TOKENS, NODES, dtype=torch.bool).scatter_(1, node, True)
    home = torch.randint(0, NODES, (TOKENS,), generator=g)
    touched[torch.arange(TOKENS), home] = False
    return touched.sum(1).float().mean().item()


def test_inter_node_copies_without_a_limit_match_routing_of_random_tokens():
    model = inter_node_dispatch_bytes(1, HIDDEN, K, E, NODES).remote_copies_per_token
    assert _remote_nodes_per_token(None) == pytest.approx(model, rel=0.05)
    naive = inter_node_dispatch_bytes(1, HIDDEN, K, E, NODES, dedup_per_node=False)
    assert naive.remote_copies_per_token == K * (NODES - 1) / NODES


@pytest.mark.parametrize("limit", [2, 4, 6])
def test_a_node_limit_m_gives_the_expected_min_of_distinct_nodes_and_m(limit):
    model = inter_node_dispatch_bytes(1, HIDDEN, K, E, NODES, limit).remote_copies_per_token
    free = inter_node_dispatch_bytes(1, HIDDEN, K, E, NODES).remote_copies_per_token
    assert model <= limit * (NODES - 1) / NODES and model < free
    assert _remote_nodes_per_token(limit) == pytest.approx(model, rel=0.05)
    assert _remote_nodes_per_token(limit) < _remote_nodes_per_token(None)


def test_a_node_limit_of_at_least_k_nodes_changes_nothing():
    # top-2: a token touches at most 2 nodes, so M = 4 cannot bind (nor exceed k·(n-1)/n)
    free = inter_node_dispatch_bytes(1, HIDDEN, 2, E, NODES).remote_copies_per_token
    limited = inter_node_dispatch_bytes(1, HIDDEN, 2, E, NODES, 4).remote_copies_per_token
    assert limited == pytest.approx(free) and limited < 2 * (NODES - 1) / NODES
    assert _remote_nodes_per_token(4, top_k=2) == pytest.approx(limited, rel=0.05)


def test_distinct_nodes_pmf_sums_to_one_and_its_mean_is_the_closed_form():
    pmf = distinct_nodes_pmf(K, E, NODES)
    per = E // NODES
    mean_nodes = NODES * (1 - math.comb(E - per, K) / math.comb(E, K))
    assert sum(pmf) == pytest.approx(1.0)
    assert sum(j * p for j, p in enumerate(pmf)) == pytest.approx(mean_nodes)
    assert distinct_nodes_pmf(1, E, NODES)[1] == pytest.approx(1.0)


def test_capacity_rounds_up_and_refuses_a_zero_factor():
    assert expert_capacity(10, 1, 4, 1.0) == 3  # 2.5 slots round up
    assert expert_capacity(4096, 2, 64, 1.0) == 128  # exact shares stay exact
    with pytest.raises(ValueError, match="capacity_factor"):
        expert_capacity(10, 1, 4, 0.0)


def test_dispatch_bytes_count_other_ranks_rows_only():
    kept = [[3, 1, 0, 2], [0, 5, 4, 1]]  # rank 0 routed 3, 1 to its own experts 0, 1
    got = dispatch_bytes_from_counts(kept, rank=0, hidden=4, bytes_per_elem=2)
    # one count message to rank 1: the 4-word header, then its 2 experts' counts
    assert got.dispatch == (0 + 2) * 8 and got.combine == (0 + 5) * 8 and got.counts == (4 + 2) * 8
    assert list(experts_of_rank(4, 2, 1)) == [2, 3]
    with pytest.raises(ValueError, match="divide"):
        experts_of_rank(6, 4, 0)


def test_ep_multiplies_rows_per_expert_and_thin_gemms_sit_under_the_ridge():
    from dtlab.cost.moe_gemm import expert_gemm_intensity, ridge_rows, rows_per_expert

    assert rows_per_expert(4096, 8, 256, 1) == 128 and rows_per_expert(4096, 8, 256, 64) == 8192
    # thin: intensity ≈ rows (bf16); wide: it saturates towards d·h/(d + h)
    assert expert_gemm_intensity(16, 7168, 2048) == pytest.approx(16, rel=0.02)
    need = ridge_rows("h100_sxm", 7168, 2048)
    ridge = 989.4e12 / 3350e9
    assert (
        expert_gemm_intensity(need - 1, 7168, 2048)
        < ridge
        <= expert_gemm_intensity(need, 7168, 2048)
    )
    with pytest.raises(ValueError, match="divide"):
        rows_per_expert(4096, 8, 256, 3)


def _fsdp_expert_traffic(n_experts: int, d: int, h: int) -> int:
    import torch

    from dtlab.comm import Communicator

    comm = Communicator(None, collectives="dtlab", dim="dp")
    flat = torch.randn(n_experts * 2 * d * h, dtype=torch.float64)
    shard = flat.chunk(comm.world_size)[comm.rank].clone()
    comm.all_gather(flat, shard)
    comm.all_gather(flat, shard)
    comm.reduce_scatter(shard, flat)
    return comm.comm_stats.bytes_sent


def test_fsdp_sharded_experts_counted_bytes_equal_the_formula(cluster2):
    from dtlab.cost.moe_gemm import ep_vs_fsdp_expert_bytes

    want = ep_vs_fsdp_expert_bytes(64, 8, 32, 4, 2, 2, bytes_per_elem=8)
    assert cluster2.run(_fsdp_expert_traffic, 4, 8, 32) == [want.fsdp_bytes] * 2
    assert want.ep_bytes == 4 * (1 / 2) * 64 * 2 * 8 * 8
    big = ep_vs_fsdp_expert_bytes(4096, 7168, 2048, 256, 8, 64, matrices=3)
    assert big.fsdp_over_ep == pytest.approx(36, rel=0.01)
