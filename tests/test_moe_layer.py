"""The MoE layer in one process: the aux losses equal their formulas on hand-made routings,
capacity keeps first choices first, the layer equals a token-by-token reference, grouped GEMM
equals the loop, node-limited routing stays on M nodes, a dense GPT is unchanged, and the
balancing loss (and DeepSeek-V3's bias) measurably flatten a planted hot expert."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dtlab.cost.moe import expert_capacity
from dtlab.models import GPT, GPTConfig, SyntheticTokens
from dtlab.models.moe import MoE, MoEConfig, moe_mlp_factory
from dtlab.models.moe_experts import grouped_mm_available
from dtlab.models.moe_router import (
    capacity_keep,
    node_limited_mask,
    route,
    route_top_k,
    router_z_loss,
    switch_aux_loss,
)

CONFIG = GPTConfig.tiny(d_model=16, n_heads=2)


def test_switch_loss_is_one_when_uniform_and_e_times_p_when_all_tokens_pick_one_expert():
    uniform = torch.full((4, 2), 0.5)
    assert switch_aux_loss(uniform, torch.tensor([[0], [1], [0], [1]]), 2).item() == 1.0
    skewed = torch.tensor([[0.9, 0.1]] * 4)
    # f = [1, 0], P = [0.9, 0.1]: E · Σ f·P = 2 · 0.9
    loss = switch_aux_loss(skewed, torch.zeros(4, 1, dtype=torch.long), 2)
    assert loss.item() == pytest.approx(1.8)


def test_switch_loss_with_top2_counts_fractions_of_all_t_times_k_assignments():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3]])
    chosen = torch.tensor([[0, 1], [1, 2]])  # expert 0 once, 1 twice, 2 once, of 4
    f = torch.tensor([1, 2, 1]) / 4
    p = probs.mean(0)
    assert switch_aux_loss(probs, chosen, 3).item() == pytest.approx(3 * (f * p).sum().item())


def test_z_loss_is_the_mean_squared_log_sum_exp():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    want = (math.log(2.0) ** 2 + math.log(4.0) ** 2) / 2
    assert router_z_loss(logits).item() == pytest.approx(want)


def test_the_layers_aux_loss_is_the_weighted_sum_of_both_formulas_on_a_hand_made_routing():
    # router logits [ln 3, 0] for tokens along e0 (softmax [3/4, 1/4]: expert 0) and [-ln 3, 0]
    # for the token along -e0 (expert 1): f = [3/4, 1/4], P = [5/8, 3/8], Switch = 2·(15/32 +
    # 3/32) = 9/8; z-loss = (3·ln²4 + ln²(4/3))/4
    layer = MoE(CONFIG, MoEConfig(n_experts=2, top_k=1, aux_loss_weight=0.1, z_loss_weight=0.01))
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0, 0] = math.log(3.0)
    e0 = torch.zeros(16)
    e0[0] = 1.0
    _, aux = layer(torch.stack([e0, e0, -e0, e0]))
    assert layer.routing.expert_index.view(-1).tolist() == [0, 0, 1, 0]
    z = (3 * math.log(4.0) ** 2 + math.log(4 / 3) ** 2) / 4
    assert aux.item() == pytest.approx(0.1 * 9 / 8 + 0.01 * z, rel=1e-6)


def test_capacity_keeps_every_first_choice_before_any_second_choice():
    # 3 tokens, top-2, 2 experts, capacity 2. Expert 0: first choice of tokens 0 and 2 (kept),
    # second of token 1 (dropped, though token 1 comes before token 2). Expert 1: first choice
    # of token 1, then the second choices of tokens 0 and 2 in token order: token 2's is dropped.
    chosen = torch.tensor([[0, 1], [1, 0], [0, 1]])
    keep = capacity_keep(chosen, 2, capacity=2)
    assert keep.tolist() == [[True, True], [True, False], [True, False]]
    tight = capacity_keep(chosen, 2, capacity=1)  # token 2 loses both of its experts
    assert tight.tolist() == [[True, False], [True, False], [False, False]]
    assert expert_capacity(3, 2, 2, 2 / 3) == 2
    assert expert_capacity(24, 2, 4, 1.25) == 15  # ceil(1.25 · 24 · 2 / 4)


def test_the_stats_count_dropped_assignments_and_tokens_that_lost_every_expert():
    torch.manual_seed(0)
    layer = MoE(CONFIG, MoEConfig(n_experts=4, top_k=2, capacity_factor=0.25))
    with torch.no_grad():
        layer(torch.randn(64, 16))
    keep = layer.routing.keep
    assert layer.stats.dropped == int((~keep).sum()) > layer.stats.dropped_tokens > 0
    assert layer.stats.dropped_tokens == sum(not row.any() for row in keep)


def test_route_top_k_is_the_k_best_scores_with_their_weights():
    scores = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]])
    index, weight, keep = route_top_k(scores, 2, None)
    assert index.tolist() == [[1, 2], [0, 2]] and keep.all()
    assert torch.equal(weight, torch.tensor([[0.6, 0.3], [0.5, 0.3]]))


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_moe_equals_a_token_by_token_reference(score):
    torch.manual_seed(0)
    layer = MoE(CONFIG, MoEConfig(n_experts=4, top_k=2, score=score, shared_expert=True))
    layer = layer.double()
    x = torch.randn(10, 16, dtype=torch.float64)
    out, _ = layer(x)
    probs = (x @ layer.router.weight.t()).softmax(-1) if score == "softmax" else None
    if probs is None:
        probs = (x @ layer.router.weight.t()).sigmoid()
    w_in, w_out = layer.experts.fc_in.weight, layer.experts.fc_out.weight
    for t in range(10):
        best = probs[t].topk(2).indices
        weights = probs[t, best] / (probs[t, best].sum() if score == "sigmoid" else 1.0)
        want = layer.shared(x[t])
        for e, w in zip(best.tolist(), weights, strict=True):
            want = want + w * (F.gelu(x[t] @ w_in[e], approximate="tanh") @ w_out[e])
        assert torch.allclose(out[t], want, atol=1e-12)


@pytest.mark.skipif(not grouped_mm_available(torch.float32), reason="no torch._grouped_mm here")
def test_grouped_gemm_equals_the_per_expert_loop_forward_and_backward():
    results = {}
    for backend in ("grouped", "loop"):
        torch.manual_seed(0)
        layer = MoE(CONFIG, MoEConfig(n_experts=4, top_k=2, capacity_factor=1.0, backend=backend))
        x = torch.randn(32, 16, generator=torch.Generator().manual_seed(1)).requires_grad_()
        out, aux = layer(x)
        (out.square().sum() + aux).backward()
        results[backend] = (out, x.grad, layer.experts.fc_in.weight.grad)
    for a, b in zip(results["grouped"], results["loop"], strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_grouped_backend_refuses_float64_with_a_hint():
    torch.manual_seed(0)
    layer = MoE(CONFIG, MoEConfig(n_experts=2, top_k=1, backend="grouped")).double()
    with pytest.raises(ValueError, match="backend='loop'"):
        layer(torch.randn(4, 16, dtype=torch.float64))


def test_node_limited_routing_keeps_each_token_on_at_most_m_nodes():
    torch.manual_seed(0)
    x, weight = torch.randn(200, 16), torch.randn(16, 16)
    free = route(x, weight, 4, n_nodes=4)
    limited = route(x, weight, 4, n_nodes=4, node_limit=2)
    nodes_of = lambda r: torch.stack([(r.expert_index // 4 == n).any(1) for n in range(4)], 1)  # noqa: E731
    assert nodes_of(limited).sum(1).max() <= 2
    assert nodes_of(free).sum(1).max() > 2  # without the limit some tokens span 3+ nodes
    mask = node_limited_mask(free.probs, 4, 4, 4)
    assert mask.all()
    with pytest.raises(ValueError, match="node_limit"):
        node_limited_mask(free.probs, 4, 4, 0)


def test_a_gpt_whose_factory_puts_no_experts_is_the_dense_gpt():
    config = GPTConfig.tiny()
    tokens, _ = SyntheticTokens(config, 1, 2)[0]
    dense = GPT(config, seed=0)
    no_experts = GPT(config, seed=0, mlp_factory=moe_mlp_factory(MoEConfig(every=3)))
    assert torch.equal(dense(tokens), no_experts(tokens))
    assert no_experts.aux_loss.item() == 0.0


def test_active_params_count_k_experts_of_e():
    layer = MoE(CONFIG, MoEConfig(n_experts=8, top_k=2))
    per_expert = 2 * 16 * CONFIG.d_ff
    assert layer.active_params() == 8 * 16 + 2 * per_expert
    assert sum(p.numel() for p in layer.parameters()) == 8 * 16 + 8 * per_expert


def _train_imbalance(aux_weight: float, bias: bool = False, steps: int = 20) -> tuple[float, float]:
    torch.manual_seed(0)
    cfg = MoEConfig(
        n_experts=4,
        top_k=1,
        aux_loss_weight=aux_weight,
        bias_balancing=bias,
        bias_update_rate=0.05,
        backend="loop",
    )
    layer = MoE(CONFIG, cfg)
    shift = torch.ones(16) / 4
    with torch.no_grad():
        layer.router.weight[0] += shift  # plant a hot expert
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 16, generator=g) + 2.0 * shift
    target = torch.randn(128, 16, generator=g)
    optimizer = torch.optim.Adam(layer.parameters(), lr=1e-2)
    first = None
    for _ in range(steps):
        out, aux = layer(x)
        loss = (out - target).pow(2).mean() + aux
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if bias:
            layer.update_balancing_bias()
        first = layer.stats.imbalance if first is None else first
    return first, layer.stats.imbalance


def test_the_load_balancing_loss_flattens_a_hot_expert_in_a_short_run():
    start, without = _train_imbalance(0.0)
    _, with_loss = _train_imbalance(0.1)
    assert start > 3.0  # the planted expert takes most of the tokens (max/mean, E = 4)
    assert without > 2.0 > with_loss  # measured after 20 Adam steps on the same data


def test_the_aux_loss_free_bias_flattens_it_too_without_touching_the_weights():
    _, without = _train_imbalance(0.0)
    _, with_bias = _train_imbalance(0.0, bias=True)
    assert without > 2.0 > with_bias


def test_bad_configs_are_refused_with_what_to_change():
    with pytest.raises(ValueError, match="top_k=5 must be between 1 and n_experts=4"):
        MoEConfig(n_experts=4, top_k=5)
    with pytest.raises(ValueError, match="None for no dropping"):
        MoEConfig(capacity_factor=0.0)
    with pytest.raises(ValueError, match="choose one of"):
        MoEConfig(score="relu")
    with pytest.raises(ValueError, match="n_nodes=3 must divide"):
        MoEConfig(n_experts=4, n_nodes=3)


def test_expert_parallel_refuses_a_dense_model_and_an_ep_that_splits_an_expert():
    from types import SimpleNamespace

    from dtlab.parallel.expert import parallelize_experts

    group_of_three = SimpleNamespace(world_size=3, rank=0)
    with pytest.raises(ValueError, match="no MoE layer"):
        parallelize_experts(GPT(GPTConfig.tiny()), group_of_three)
    moe_gpt = GPT(GPTConfig.tiny(), mlp_factory=moe_mlp_factory(MoEConfig(n_experts=4)))
    with pytest.raises(ValueError, match=r"choose ep from \[1, 2, 4\]"):
        parallelize_experts(moe_gpt, group_of_three)
