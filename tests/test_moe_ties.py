"""Router ties go to the lower expert index: with planted, exactly equal scores the lower index
is chosen and listed first — plain top-k, DeepSeek-V3's biased choice, node-limited routing and
the lab's reference alike — distinct scores are chosen exactly as ``torch.topk`` chooses them, and
on 2 expert-parallel ranks every rank routes its tied tokens as the one-process model does."""

from __future__ import annotations

import pytest
import torch

from dtlab.models.moe_router import node_limited_mask, route, route_top_k, top_k_indices

D = 8


def _router(rows: list[list[float]]) -> torch.Tensor:
    """A router (E, D) from rows given on the first coordinates, zero elsewhere."""
    weight = torch.zeros(len(rows), D)
    for e, row in enumerate(rows):
        weight[e, : len(row)] = torch.tensor(row)
    return weight


def test_equal_scores_choose_the_lower_expert_index_first():
    scores = torch.tensor(
        [
            [0.25, 0.25, 0.25, 0.25],  # all tied: the first k, in order
            [0.1, 0.3, 0.3, 0.3],  # three tied for best
            [0.4, 0.1, 0.4, 0.1],  # tied best, tied second
            [0.1, 0.2, 0.3, 0.4],  # no tie: best first
        ]
    )
    assert top_k_indices(scores, 1).tolist() == [[0], [1], [0], [3]]
    assert top_k_indices(scores, 2).tolist() == [[0, 1], [1, 2], [0, 2], [3, 2]]
    index, weight, _ = route_top_k(scores, 2, None)  # the lab's reference: the same rule
    assert index.tolist() == [[0, 1], [1, 2], [0, 2], [3, 2]]
    assert torch.equal(weight, scores.gather(1, index))


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_a_router_with_equal_rows_sends_every_token_to_the_lowest_indices(score):
    x = torch.randn(16, D, generator=torch.Generator().manual_seed(0))
    routing = route(x, torch.zeros(4, D), 2, score=score)  # every logit 0: every score equal
    assert routing.expert_index.tolist() == [[0, 1]] * 16


def test_the_balancing_bias_breaks_its_ties_to_the_lower_index_too():
    x = torch.randn(16, D, generator=torch.Generator().manual_seed(0))
    bias = torch.tensor([0.0, 0.25, 0.0, 0.25])  # experts 1 and 3 tie above 0 and 2
    routing = route(x, torch.zeros(4, D), 3, score="sigmoid", bias=bias)
    assert routing.expert_index.tolist() == [[1, 3, 0]] * 16
    assert torch.allclose(routing.weight, torch.full((16, 3), 1 / 3))  # the bias steers only


def test_node_limited_routing_prefers_the_lower_node_and_expert_on_ties():
    selection = torch.zeros(3, 8)  # 4 nodes of 2 experts, all tied
    selection[1, 5] = 0.5  # token 1: node 2 is best, then nodes 0, 1, 3 tie
    mask = node_limited_mask(selection, top_k=2, n_nodes=4, node_limit=2)
    assert mask[0].nonzero().view(-1).tolist() == [0, 1, 2, 3]  # nodes 0 and 1
    assert mask[1].nonzero().view(-1).tolist() == [0, 1, 4, 5]  # nodes 2 and 0
    x = torch.randn(5, D, generator=torch.Generator().manual_seed(1))
    routing = route(x, torch.zeros(8, D), 2, n_nodes=4, node_limit=1)
    assert routing.expert_index.tolist() == [[0, 1]] * 5


def test_distinct_scores_are_chosen_exactly_as_topk_chooses_them():
    g = torch.Generator().manual_seed(2)
    for experts, k in ((4, 1), (8, 2), (16, 4), (64, 6)):
        scores = torch.randn(256, experts, generator=g).softmax(-1)
        values, index = scores.topk(k, dim=-1)
        assert torch.equal(top_k_indices(scores, k), index)
        assert torch.equal(route_top_k(scores, k, None)[1], values)


VARIANTS = {
    # name: (MoEConfig overrides, planted router rows as {expert: row}, bias)
    "softmax, experts 0 and 2 tie": ({}, {0: 0.0, 2: 0.0}, None),
    "sigmoid with the balancing bias": (
        {"score": "sigmoid", "bias_balancing": True},
        {e: 0.0 for e in range(4)},
        [0.0, 0.25, 0.0, 0.0],
    ),
    "node-limited": ({"n_nodes": 2, "node_limit": 1}, {e: 0.0 for e in range(4)}, None),
}


def _by_the_rule(values: list[float], k: int, candidates: list[int]) -> tuple[list[int], bool]:
    """The ``k`` best ``candidates`` by value, lower index first on ties (plain Python), and
    whether a tie decided anything (which ones, or their order)."""
    ranked = sorted(candidates, key=lambda i: (-values[i], i))
    decisive = ranked[: k + 1]
    tied = any(values[a] == values[b] for a, b in zip(decisive, decisive[1:], strict=False))
    return ranked[:k], tied


def _expected_experts(selection: list[float], node_limit: int | None) -> tuple[list[int], bool]:
    if node_limit is None:
        return _by_the_rule(selection, 2, list(range(4)))
    node_scores = [selection[0] + selection[1], selection[2] + selection[3]]  # best 2 of each
    (node,), node_tied = _by_the_rule(node_scores, node_limit, [0, 1])
    chosen, tied = _by_the_rule(selection, 2, [2 * node, 2 * node + 1])
    return chosen, tied or node_tied


def _tied_routing_on_rank(variant: str) -> dict:
    import torch.distributed as dist

    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens
    from dtlab.models.moe import MoEConfig, moe_layers, moe_mlp_factory
    from dtlab.parallel.expert import ExpertParallel

    overrides, planted, bias = VARIANTS[variant]
    world, rank = dist.get_world_size(), dist.get_rank()
    config = GPTConfig.tiny(seq_len=8, d_model=16, n_heads=2)
    moe = MoEConfig(n_experts=4, top_k=2, backend="loop", **overrides)
    tokens, _ = SyntheticTokens(config, n_batches=1, batch_size=2 * world, seed=5)[0]
    per_rank = tokens.shape[0] // world

    def build() -> GPT:
        model = GPT(config, seed=0, dtype=torch.float64, mlp_factory=moe_mlp_factory(moe))
        with torch.no_grad():
            for layer in moe_layers(model):
                for expert, value in planted.items():
                    layer.router.weight[expert] = value  # a zero row: logit 0 for every token
                if bias is not None:
                    layer.balancing_bias.copy_(torch.tensor(bias))
        return model

    reference = build()
    with torch.no_grad():
        reference(tokens)  # one process, the whole batch at once
    ref_index = [m.routing.expert_index.view(*tokens.shape, 2) for m in moe_layers(reference)]

    parallel = ExpertParallel(Mesh(dp=world, ep=world), "dtlab")
    model = build()
    parallel.parallelize(model)
    with torch.no_grad():
        model(tokens[rank * per_rank : (rank + 1) * per_rank])
    mine = [m.routing for m in moe_layers(model)]
    by_the_rule, ties_that_mattered = True, 0
    for routing in mine:
        scores = routing.logits.softmax(-1) if moe.score == "softmax" else routing.logits.sigmoid()
        selection = scores + torch.tensor(bias or [0.0] * 4, dtype=scores.dtype)
        for row, chosen in zip(selection.tolist(), routing.expert_index.tolist(), strict=True):
            want, tied = _expected_experts(row, moe.node_limit)
            by_the_rule &= chosen == want
            ties_that_mattered += tied
    return {
        "same_as_one_process": all(
            torch.equal(r.expert_index.view(per_rank, -1, 2), want[rank * per_rank :][:per_rank])
            for r, want in zip(mine, ref_index, strict=True)
        ),
        "by_the_rule": by_the_rule,
        "ties_that_mattered": ties_that_mattered,
    }


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_ep_rank_breaks_ties_like_the_one_process_model(cluster2, variant):
    results = cluster2.run(_tied_routing_on_rank, variant)
    for rank, r in enumerate(results):
        assert r["same_as_one_process"], f"rank {rank} routed differently from one process"
        assert r["by_the_rule"], f"rank {rank}: a tie did not go to the lower expert index"
    assert sum(r["ties_that_mattered"] for r in results) > 0  # the planted ties were exercised
