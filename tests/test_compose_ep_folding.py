"""Expert parallel inside pipeline stages trains like one process; what is still refused says
what to change; the folded mapping's groups (attention tp × cp × dp, MoE etp × ep × edp over the
same ranks) and which of them cross a node."""

from __future__ import annotations

import pytest
import torch

from dtlab.mesh import Layout
from dtlab.models import GPTConfig
from dtlab.parallel.compose.checks import composed_layout_problems

TOLERANCE = 1e-10


def _ep_cp_on_rank(moe_overrides: dict) -> dict:
    """dp × cp × ep on 4 ranks with a per-token router: every loss and gradient as one process."""
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.models.moe import MoEConfig, moe_mlp_factory
    from dtlab.parallel.compose import compose_gpt

    config = GPTConfig.tiny(seq_len=16, d_model=32, n_layers=2, vocab_size=64, dropout=0.0)
    moe = MoEConfig(n_experts=4, top_k=2, every=2, **moe_overrides)
    factory = moe_mlp_factory(moe)
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=4, seed=3)[0]
    reference = GPT(config, seed=0, dtype=torch.float64, mlp_factory=factory)
    ref_loss = loss_fn(reference(tokens), targets)
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    mesh = Mesh(dp=2, cp=2, ep=2)
    try:
        composed = compose_gpt(
            GPT(config, seed=0, dtype=torch.float64, mlp_factory=factory), mesh,
            collectives="dtlab",
        )  # fmt: skip
    except ValueError as err:
        return {"refused": str(err)}
    loss = composed.train_step(tokens, targets)
    errors = []
    for name, p in composed.named_parameters():
        want = ref_grads[name]
        if ".experts." in name:
            want = want[mesh.ep_rank * 2 : (mesh.ep_rank + 1) * 2]
        errors.append((p.grad - want).abs().max().item())
    return {"loss": abs(loss - ref_loss.item()), "grad_error": max(errors)}


PER_TOKEN = {"aux_loss_weight": 0.0, "z_loss_weight": 0.0, "capacity_factor": None}


def test_expert_parallel_with_context_parallel_trains_like_one_process_for_a_per_token_router(
    cluster4,
):
    for result in cluster4.run(_ep_cp_on_rank, PER_TOKEN):
        assert result["loss"] < TOLERANCE and result["grad_error"] < TOLERANCE, result


def test_expert_parallel_with_context_parallel_refuses_capacity_and_says_what_to_set(cluster4):
    # the balancing losses and the bias are composed (tests/test_compose_ep_cp_balance.py)
    (result, *_) = cluster4.run(_ep_cp_on_rank, {**PER_TOKEN, "capacity_factor": 1.25})
    assert "capacity_factor=None" in result["refused"] and "or cp=1" in result["refused"]


def _ep_pp_on_rank(degrees: dict, n_micro: int = 2) -> dict:
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.models.moe import MoEConfig, moe_mlp_factory
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.pipeline import one_f_one_b

    config = GPTConfig.tiny(seq_len=16, d_model=32, n_layers=4, vocab_size=64, dropout=0.0)
    factory = moe_mlp_factory(MoEConfig(n_experts=4, top_k=2, every=2, z_loss_weight=1e-3))
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=8, seed=3)[0]
    mesh = Mesh(**degrees)
    # One process, the same definition: every dp shard's micro-batches, each its mean loss plus
    # its own balancing losses, divided by the micro-batches, averaged over the shards.
    reference = GPT(config, seed=0, dtype=torch.float64, mlp_factory=factory)
    rows, ref_loss = tokens.shape[0] // mesh.dp_size, 0.0
    for shard in range(mesh.dp_size):
        part = slice(shard * rows, (shard + 1) * rows)
        for x, y in zip(tokens[part].chunk(n_micro), targets[part].chunk(n_micro), strict=True):
            loss = loss_fn(reference(x), y) + reference.aux_loss
            (loss / (n_micro * mesh.dp_size)).backward()
            ref_loss += loss.item() / (n_micro * mesh.dp_size)  # reported with the aux, as trained
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}

    model = GPT(config, seed=0, dtype=torch.float64, mlp_factory=factory)
    composed = compose_gpt(
        model, mesh, schedule=one_f_one_b(mesh.pp_size, n_micro), collectives="dtlab"
    )
    loss = composed.train_step(tokens, targets)
    per = 4 // mesh.ep_size
    errors = []
    for name, p in composed.named_parameters():
        want = ref_grads["embed.weight" if name == "lm_head.weight" else name]
        if ".experts." in name:
            want = want[mesh.ep_rank * per : (mesh.ep_rank + 1) * per]
        errors.append((p.grad - want).abs().max().item())
    return {
        "loss": abs(loss - ref_loss),
        "grad_error": max(errors),
        "reduced": {n: p.reduced_over for n, p in composed.placements.items()},
        "groups": sorted(composed.traffic()),
    }


def test_expert_parallel_inside_pipeline_stages_trains_like_one_process(cluster4):
    results = cluster4.run(_ep_pp_on_rank, {"pp": 2, "dp": 2, "ep": 2})
    for result in results:
        assert result["loss"] < TOLERANCE and result["grad_error"] < TOLERANCE, result
        assert "ep" in result["groups"] and "pp" in result["groups"]  # all-to-alls and sends
    experts = [r["reduced"] for r in results if "blocks.3.mlp.experts.fc_in.weight" in r["reduced"]]
    assert experts and experts[0]["blocks.3.mlp.experts.fc_in.weight"] == ()  # edp = dp/ep = 1


CONFIG = GPTConfig.tiny(seq_len=16, d_model=32, n_heads=4, n_layers=4)


@pytest.mark.parametrize(
    ("layout", "data_parallel", "says"),
    [
        (Layout(dp=4, ep=2), "fsdp", "use data_parallel='ddp' with ep > 1"),
        (Layout(dp=2, tp=2, ep=2), "hsdp", "use data_parallel='ddp' with ep > 1"),
    ],
)
def test_what_is_still_refused_with_experts_says_what_to_change(layout, data_parallel, says):
    problems = composed_layout_problems(
        CONFIG, layout, layout.world_size, n_experts=4, data_parallel=data_parallel
    )
    assert any(says in p for p in problems), problems


def test_experts_with_pipeline_stages_or_context_and_fsdp_or_sp_with_pipeline_stages_are_accepted():
    assert composed_layout_problems(CONFIG, Layout(dp=2, tp=2, ep=2), 4, n_experts=4) == []
    assert composed_layout_problems(CONFIG, Layout(dp=2, cp=2, ep=2), 4, n_experts=4) == []
    assert composed_layout_problems(CONFIG, Layout(pp=2, dp=2, ep=2), 4, n_experts=4) == []
    assert composed_layout_problems(CONFIG, Layout(pp=2, dp=2), 4, data_parallel="fsdp") == []
    assert composed_layout_problems(CONFIG, Layout(pp=2, tp=2), 4, sequence_parallel=True) == []


def test_folding_puts_ep_on_the_ranks_tp_uses_inside_a_node_where_carving_from_dp_cannot():
    from dtlab.parallel.compose.folding import FoldedMapping, ep_carved_from_dp

    # 2 nodes of 4: attention tp=4 inside the node, dp=2 across; experts ep=4 folded onto tp
    folded = FoldedMapping(tp=4, dp=2, ep=4)
    assert folded.groups("ep") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert folded.groups("edp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert folded.node_crossings(4) == {"tp": False, "dp": True, "ep": False, "edp": True}
    # unfolded, EP is carved out of dp: at most dp=2 ranks, tp·cp = 4 apart, one per node
    carved = ep_carved_from_dp(tp=4, cp=1, dp=2, ep=2)
    assert carved == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert all(len({r // 4 for r in g}) == 2 for g in carved)


def test_both_mappings_cover_every_rank_of_a_stage_once_and_share_the_pipeline():
    from dtlab.parallel.compose.folding import FoldedMapping

    mapping = FoldedMapping(tp=2, cp=2, dp=2, pp=2, etp=1, ep=4)
    assert mapping.edp == 2
    for dim in ("tp", "cp", "dp", "etp", "ep", "edp", "pp"):
        ranks = sorted(r for g in mapping.groups(dim) for r in g)
        assert ranks == list(range(16)), dim
    for rank in range(16):  # a rank's attention and MoE groups stay inside its pipeline stage
        c = mapping.coordinates(rank)
        assert all(mapping.coordinates(r)["pp"] == c["pp"] for r in range(16)
                   if r in next(g for g in mapping.groups("ep") if rank in g))  # fmt: skip
    assert mapping.groups("ep")[0] == [0, 1, 2, 3]  # ep spans tp × cp: consecutive ranks


def test_a_moe_mapping_that_does_not_fit_the_stage_names_the_degrees_that_do():
    from dtlab.parallel.compose.folding import FoldedMapping

    with pytest.raises(ValueError, match=r"etp·ep = 3 must divide .* 4 ranks; choose etp·ep from"):
        FoldedMapping(tp=2, dp=2, ep=3)
