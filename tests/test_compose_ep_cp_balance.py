"""Expert parallel with context parallel trains like one process with the router's balancing
terms: the Switch loss per micro-batch and over the global batch, DeepSeek-V3's sequence-wise
loss, the z-loss and the aux-loss-free bias — the router's counts summed over ``cp`` (and ``dp``
where one process counts those tokens too), with the bytes of that all-reduce counted.

dp=2 × cp=2 on 4 ranks, ep=2 carved out of dp, zig-zag CP, fp64. Two steps on two different
batches (gradients zeroed between, no optimizer): the second step routes with the bias the first
one stepped, and the global scope must forget the first step's counts. ep=4 is not a layout
here: EP is carved out of dp=2 (``expert_parallel=4`` folds it over cp × dp instead, with the
same balancing terms: tests/test_compose_ep_review.py).
"""

from __future__ import annotations

import pytest
import torch

TOLERANCE = 1e-10
E, SEQ, BATCH = 4, 16, 4


def _reference(reference, tokens, targets, dp: int, per_shard: bool) -> float:
    """One process: each dp shard's mean loss plus its own balancing losses, averaged over the
    shards (GShard's groups — how compose's EP × DDP is defined) for the micro-batch scope; the
    whole batch in one forward otherwise (the global scope's counts and the bias's load are the
    whole step's; the sequence loss and the z-loss are the same either way)."""
    from dtlab.models import loss_fn

    if not per_shard:
        loss = loss_fn(reference(tokens), targets) + reference.aux_loss
        loss.backward()
        return loss.item()
    rows, total = tokens.shape[0] // dp, 0.0
    for shard in range(dp):
        part = slice(shard * rows, (shard + 1) * rows)
        loss = loss_fn(reference(tokens[part]), targets[part]) + reference.aux_loss
        (loss / dp).backward()
        total += loss.item() / dp
    return total


def _ep_cp_balance_on_rank(overrides: dict, strip_cp_counts: bool = False) -> dict:
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens
    from dtlab.models.moe import MoEConfig, moe_layers, moe_mlp_factory
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.expert.balance import step_balancing_biases

    config = GPTConfig.tiny(seq_len=SEQ, d_model=32, n_layers=2, vocab_size=64, dropout=0.0)
    moe = MoEConfig(n_experts=E, top_k=2, every=2, **overrides)
    factory = moe_mlp_factory(moe)
    batches = SyntheticTokens(config, n_batches=2, batch_size=BATCH, seed=3)
    mesh = Mesh(dp=2, cp=2, ep=2)
    reference = GPT(config, seed=0, dtype=torch.float64, mlp_factory=factory)
    model = GPT(config, seed=0, dtype=torch.float64, mlp_factory=factory)
    composed = compose_gpt(model, mesh, collectives="dtlab")
    if strip_cp_counts:  # what EP × CP did before: each rank counts its own share alone
        for layer in moe_layers(model):
            layer.sequence_shards = None
    per_shard = moe.aux_loss_weight > 0 and moe.aux_loss_scope == "micro_batch"
    per = E // mesh.ep_size
    steps = []
    for tokens, targets in batches:
        ref_loss = _reference(reference, tokens, targets, mesh.dp_size, per_shard)
        loss = composed.train_step(tokens, targets)
        errors = []
        for name, p in composed.named_parameters():
            want = reference.get_parameter(name).grad
            if ".experts." in name:
                want = want[mesh.ep_rank * per : (mesh.ep_rank + 1) * per]
            errors.append((p.grad - want).abs().max().item())
        if moe.bias_balancing:
            reference.blocks[1].mlp.update_balancing_bias()  # the whole step's load
            along = composed.mesh_communicators
            step_balancing_biases(model, along["cp"], along["dp"])
        (layer,) = moe_layers(model)
        steps.append(
            {
                "loss": abs(loss - ref_loss),
                "grad_error": max(errors),
                "bias_error": (layer.balancing_bias - reference.blocks[1].mlp.balancing_bias)
                .abs()
                .max()
                .item(),
                "bias": layer.balancing_bias.abs().max().item(),
            }
        )
        reference.zero_grad(set_to_none=True)
        for p in composed.parameters():
            p.grad = None
    return {"steps": steps}


SCOPES = {
    "switch loss per micro-batch": {"aux_loss_weight": 0.5, "aux_loss_scope": "micro_batch"},
    "switch loss over the global batch": {"aux_loss_weight": 0.5, "aux_loss_scope": "global"},
    "sequence-wise loss": {"aux_loss_weight": 0.5, "aux_loss_scope": "sequence"},
    "z-loss": {"aux_loss_weight": 0.0, "z_loss_weight": 0.1},
    "bias": {"aux_loss_weight": 0.0, "bias_balancing": True, "bias_update_rate": 0.05},
}


@pytest.mark.parametrize("overrides", SCOPES.values(), ids=SCOPES.keys())
def test_ep_by_cp_trains_like_one_process_with_each_balancing_term(cluster4, overrides):
    for result in cluster4.run(_ep_cp_balance_on_rank, overrides):
        for step in result["steps"]:
            assert step["loss"] < TOLERANCE and step["grad_error"] < TOLERANCE, result
            assert step["bias_error"] == 0.0, result
    if overrides.get("bias_balancing"):
        assert result["steps"][0]["bias"] == pytest.approx(0.05)  # the bias moved, by γ


def test_ep_by_cp_without_summing_the_counts_over_cp_is_not_one_process(cluster4):
    """The check above can fail: counting each cp rank's share alone gives another loss."""
    overrides = SCOPES["switch loss per micro-batch"]
    for result in cluster4.run(_ep_cp_balance_on_rank, overrides, True):
        assert result["steps"][0]["loss"] > 1e-6, result


def _count_bytes_on_rank(scope: str) -> dict:
    """The cp communicator's all-reduce bytes over one forward (the ring attention moves K/V
    point to point, so the forward's only all-reduce on cp is the router's counts)."""
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens
    from dtlab.models.moe import MoEConfig, moe_mlp_factory
    from dtlab.parallel.compose import compose_gpt

    config = GPTConfig.tiny(seq_len=SEQ, d_model=32, n_layers=2, vocab_size=64, dropout=0.0)
    factory = moe_mlp_factory(MoEConfig(n_experts=E, top_k=2, every=2, aux_loss_scope=scope))
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=BATCH, seed=3)[0]
    mesh = Mesh(dp=2, cp=2, ep=2)
    model = GPT(config, seed=0, dtype=torch.float64, mlp_factory=factory)
    composed = compose_gpt(model, mesh, collectives="dtlab")
    local, _, positions = composed.local_batch(tokens, targets)
    cp, dp = composed.mesh_communicators["cp"], composed.mesh_communicators["dp"]
    before = {"cp": cp.comm_stats.snapshot(), "dp": dp.comm_stats.snapshot()}
    with torch.no_grad():
        model(local, positions=positions)
    moved = {"cp": cp.comm_stats - before["cp"], "dp": dp.comm_stats - before["dp"]}
    return {d: s.bytes_by_op.get("all_reduce", 0) for d, s in moved.items()} | {
        "rows": local.shape[0]
    }


@pytest.mark.parametrize(
    ("scope", "numbers_over_cp", "numbers_over_dp"),
    [("micro_batch", "E", 0), ("sequence", "B·E", 0), ("global", "E", "E")],
)
def test_the_count_all_reduce_moves_its_ring_formula(
    cluster4, scope, numbers_over_cp, numbers_over_dp
):
    for result in cluster4.run(_count_bytes_on_rank, scope):
        n_cp = {"E": E, "B·E": result["rows"] * E}[numbers_over_cp]
        n_dp = {"E": E, 0: 0}[numbers_over_dp]
        # one MoE layer: an all-reduce of n float64 counts on a ring of 2 sends 2·(1/2)·8n bytes
        assert result["cp"] == 2 * (2 - 1) / 2 * 8 * n_cp, result
        assert result["dp"] == 2 * (2 - 1) / 2 * 8 * n_dp, result


def _refusal_on_rank(overrides: dict, degrees: dict) -> str:
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig
    from dtlab.models.moe import MoEConfig, moe_mlp_factory
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.pipeline import one_f_one_b

    config = GPTConfig.tiny(seq_len=SEQ, d_model=32, n_layers=2, vocab_size=64, dropout=0.0)
    factory = moe_mlp_factory(MoEConfig(n_experts=E, top_k=2, every=2, **overrides))
    mesh = Mesh(**degrees)
    schedule = one_f_one_b(mesh.pp_size, 2) if mesh.pp_size > 1 else None
    try:
        compose_gpt(GPT(config, seed=0, mlp_factory=factory), mesh, schedule=schedule)
    except ValueError as err:
        return str(err)
    return ""


def test_capacity_with_context_parallel_is_refused_and_names_dropless_or_cp_1(cluster4):
    (refused, *_) = cluster4.run(
        _refusal_on_rank, {"capacity_factor": 1.25}, {"dp": 2, "cp": 2, "ep": 2}
    )
    assert "interleaved share of every sequence" in refused
    assert "capacity_factor=None" in refused and "or cp=1" in refused


def test_the_global_scope_with_pipeline_stages_is_refused_and_names_what_to_choose(cluster4):
    (refused, *_) = cluster4.run(
        _refusal_on_rank, {"aux_loss_scope": "global"}, {"pp": 2, "dp": 2, "ep": 2}
    )
    assert "aux_loss_scope='micro_batch'" in refused and "or pp=1" in refused
