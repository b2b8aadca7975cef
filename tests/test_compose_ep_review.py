"""Outside review of expert parallel composed with TP, CP and PP: combinations the first tests
left out, each against one process on 4 gloo ranks (fp64 unless said).

* the loss a step *reports* under pipeline stages holds the stages' balancing losses (the
  executor's own loss is the last stage's cross-entropy only) — folded over tp, and carved out
  of dp;
* tp × cp × ep with the global and the sequence scope, the z-loss beside them;
* a shared expert with top-1 routing, 2 experts per rank, skewed;
* two Adam steps: every rank's optimizer state stays one process's;
* ``Mesh(tp=2, dp=2, ep=2)`` and ``expert_parallel=2`` are the same layout, bit for bit;
* fp32 within float32 rounding;
* DeepSeek-V3's bias step on the folded layout (``composed.step_balancing_biases()``: the load
  summed over tp × cp, then dp), bit-equal over three steps; with pipeline stages refused;
* the routers' counts all-reduce over the ``tp × cp`` group, counted.

The one-process reference is the mean over the dp shards and the micro-batches of (cross-entropy
+ balancing losses), each part counting its own tokens (the ``"global"`` scope: the whole
batch's counts) — how compose's data parallel and pipeline define the MoE loss."""

from __future__ import annotations

import pytest
import torch

D_MODEL, SEQ, BATCH = 32, 16, 4


def _model(moe: dict, dtype, hot: float = 0.0, n_layers: int = 2):
    from dtlab.models import GPT, GPTConfig
    from dtlab.models.moe import MoEConfig, moe_layers, moe_mlp_factory

    config = GPTConfig.tiny(
        seq_len=SEQ, d_model=D_MODEL, n_heads=4, n_layers=n_layers, vocab_size=64, dropout=0.0
    )
    settings = {"n_experts": 4, "top_k": 2, "every": 2, "aux_loss_weight": 0.0} | moe
    model = GPT(config, seed=0, dtype=dtype, mlp_factory=moe_mlp_factory(MoEConfig(**settings)))
    u = torch.ones(D_MODEL, dtype=dtype) / D_MODEL**0.5
    with torch.no_grad():  # plant a popular expert 0 (see tests/test_compose_ep_tp.py)
        for block in model.blocks:
            if block.mlp in moe_layers(model):
                block.mlp_norm.bias += hot * u
                block.mlp.router.weight[0] += u
    return model


def _one_process_step(reference, tokens, targets, parts: int, scope: str) -> float:
    from dtlab.models import loss_fn
    from dtlab.models.moe import moe_layers

    if scope == "global":  # every part balances against the whole batch's counts
        with torch.no_grad():
            reference(tokens)
        for layer in moe_layers(reference):
            whole = torch.tensor(layer.stats.tokens_per_expert)
            layer.load_reducer = lambda counts, whole=whole: whole
    rows, total = tokens.shape[0] // parts, 0.0
    for i in range(parts):
        part = slice(i * rows, (i + 1) * rows)
        loss = loss_fn(reference(tokens[part]), targets[part]) + reference.aux_loss
        (loss / parts).backward()
        total += loss.item() / parts
    return total


def _against_one_process(spec: dict) -> dict:
    from dtlab.mesh import Mesh
    from dtlab.models import SyntheticTokens
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.pipeline import one_f_one_b

    dtype, moe = getattr(torch, spec.get("dtype", "float64")), spec.get("moe", {})
    mesh = Mesh(**spec["degrees"])
    n_micro = 2 if mesh.pp_size > 1 else 1
    reference = _model(moe, dtype, spec.get("hot", 0.0), spec.get("layers", 2))
    model = _model(moe, dtype, spec.get("hot", 0.0), spec.get("layers", 2))
    composed = compose_gpt(
        model, mesh, sequence_parallel=spec.get("sp", False), collectives="dtlab",
        expert_parallel=spec.get("ep"),
        schedule=one_f_one_b(mesh.pp_size, n_micro) if mesh.pp_size > 1 else None,
    )  # fmt: skip
    adam = spec.get("adam", False)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2) if adam else None
    opt = torch.optim.Adam(composed.parameters(), lr=1e-2) if adam else None
    ep, ep_rank = spec.get("ep") or mesh.layout.ep, composed.coordinates["ep"]
    steps = []
    batches = SyntheticTokens(
        model.config, n_batches=spec.get("steps", 1), batch_size=BATCH, seed=3
    )
    for tokens, targets in batches:
        scope = moe.get("aux_loss_scope", "micro_batch")
        ref_loss = _one_process_step(reference, tokens, targets, mesh.dp_size * n_micro, scope)
        loss = composed.train_step(tokens, targets)
        errors, grads = {}, composed.local_full_gradients()
        for name, grad in grads.items():
            want = reference.get_parameter(name).grad
            if ".experts." in name:
                per = want.shape[0] // ep
                want = want[ep_rank * per : (ep_rank + 1) * per]
            errors[name] = (grad - want).abs().max().item()
        steps.append({"loss": abs(loss - ref_loss), "grad": max(errors.values()), "raw": loss})
        steps[-1]["grads"] = {n: g.tolist() for n, g in grads.items()} if spec.get("raw") else {}
        for optimizer, params in ((ref_opt, reference.parameters()), (opt, composed.parameters())):
            if optimizer is not None:
                optimizer.step()
            for p in params:
                p.grad = None
    return {"steps": steps, "checked": set(grads)}


BALANCING = {"aux_loss_weight": 0.5, "z_loss_weight": 0.1}
COMBINATIONS = {
    "tp x pp x ep, SP, loss reported with its balancing terms": {
        "degrees": {"tp": 2, "pp": 2}, "ep": 2, "sp": True, "moe": BALANCING,
    },
    "pp x dp x ep carved, loss reported with its balancing terms": {
        "degrees": {"pp": 2, "dp": 2, "ep": 2}, "layers": 4, "moe": BALANCING,
    },
    "tp x cp x ep=4, global scope": {
        "degrees": {"tp": 2, "cp": 2}, "ep": 4, "moe": BALANCING | {"aux_loss_scope": "global"},
    },
    "tp x cp x ep=2, sequence scope": {
        "degrees": {"tp": 2, "cp": 2}, "ep": 2, "moe": BALANCING | {"aux_loss_scope": "sequence"},
    },
    "ep=4 on tp x dp, global scope, SP": {
        "degrees": {"tp": 2, "dp": 2}, "ep": 4, "sp": True,
        "moe": BALANCING | {"aux_loss_scope": "global"},
    },
    "shared expert, top-1, 8 experts on ep=4, skewed": {
        "degrees": {"tp": 2, "dp": 2}, "ep": 4, "hot": 3.0,
        "moe": {"n_experts": 8, "top_k": 1, "shared_expert": True, "aux_loss_weight": 0.5},
    },
    "two Adam steps, SP": {
        "degrees": {"tp": 2, "dp": 2}, "ep": 2, "sp": True, "steps": 2, "adam": True,
        "moe": BALANCING,
    },
    "tp=4, ep=2 inside the TP group": {"degrees": {"tp": 4}, "ep": 2, "moe": BALANCING},
    "cp x dp, expert_parallel=4 folded without tp, global scope": {
        "degrees": {"cp": 2, "dp": 2}, "ep": 4, "moe": BALANCING | {"aux_loss_scope": "global"},
    },
}  # fmt: skip


@pytest.mark.parametrize("spec", COMBINATIONS.values(), ids=COMBINATIONS.keys())
def test_each_accepted_combination_trains_and_reports_like_one_process(cluster4, spec):
    results = cluster4.run(_against_one_process, spec)
    for r in results:
        for step in r["steps"]:
            assert step["loss"] < 1e-10 and step["grad"] < 1e-10, (step["loss"], step["grad"])
    model = _model(spec.get("moe", {}), torch.float64, n_layers=spec.get("layers", 2))
    names = {n for n, _ in model.named_parameters()}
    assert set.union(*(r["checked"] for r in results)) >= names  # every gradient compared


def test_fp32_folded_step_equals_one_process_within_float32_rounding(cluster4):
    spec = {"degrees": {"tp": 2, "dp": 2}, "ep": 2, "dtype": "float32", "moe": BALANCING}
    for r in cluster4.run(_against_one_process, spec):
        assert r["steps"][0]["loss"] < 1e-5 and r["steps"][0]["grad"] < 1e-5, r["steps"]


def test_mesh_ep_and_expert_parallel_are_the_same_folded_layout_bit_for_bit(cluster4):
    spec = {"ep": 2, "moe": BALANCING, "raw": True}
    given = cluster4.run(_against_one_process, spec | {"degrees": {"tp": 2, "dp": 2}})
    meshed = cluster4.run(
        _against_one_process, spec | {"ep": None, "degrees": {"tp": 2, "dp": 2, "ep": 2}}
    )
    for a, b in zip(given, meshed, strict=True):
        assert a["steps"][0]["raw"] == b["steps"][0]["raw"]
        assert a["steps"][0]["grads"] == b["steps"][0]["grads"]


def _count_bytes_on_rank() -> dict:
    """The ``tp_cp`` group's all-reduce bytes over one forward of the folded tp × cp layout."""
    from dtlab.mesh import Mesh
    from dtlab.models import SyntheticTokens
    from dtlab.parallel.compose import compose_gpt

    model = _model({"aux_loss_weight": 0.5}, torch.float64)
    tokens, targets = SyntheticTokens(model.config, n_batches=1, batch_size=BATCH, seed=3)[0]
    composed = compose_gpt(model, Mesh(tp=2, cp=2), collectives="dtlab", expert_parallel=2)
    local, _, positions = composed.local_batch(tokens, targets)
    group = composed.communicators["tp_cp"]
    before = group.comm_stats.snapshot()
    with torch.no_grad():
        model(local, positions=positions)
    return {"bytes": (group.comm_stats - before).bytes_by_op.get("all_reduce", 0)}


def test_the_folded_count_all_reduce_over_tp_x_cp_moves_its_ring_formula(cluster4):
    # one MoE layer, E = 4 float64 counts on a ring of tp·cp = 4: 2·(4−1)/4 · 8·4 bytes
    for r in cluster4.run(_count_bytes_on_rank):
        assert r["bytes"] == 2 * (4 - 1) / 4 * 8 * 4, r


def _bias_on_rank(degrees: dict, ep: int, sequence_parallel: bool) -> list[dict]:
    from dtlab.mesh import Mesh
    from dtlab.models import SyntheticTokens, loss_fn
    from dtlab.models.moe import moe_layers
    from dtlab.parallel.compose import compose_gpt

    moe = {"bias_balancing": True, "bias_update_rate": 0.05}
    reference, model = _model(moe, torch.float64), _model(moe, torch.float64)
    composed = compose_gpt(
        model, Mesh(**degrees), sequence_parallel=sequence_parallel, collectives="dtlab",
        expert_parallel=ep,
    )  # fmt: skip
    (ref_layer,), (layer,) = moe_layers(reference), moe_layers(model)
    steps = []
    for tokens, targets in SyntheticTokens(model.config, n_batches=3, batch_size=BATCH, seed=3):
        want = loss_fn(reference(tokens), targets).item()
        loss = composed.train_step(tokens, targets)
        ref_layer.update_balancing_bias()  # the whole batch's load
        composed.step_balancing_biases()
        error = (layer.balancing_bias - ref_layer.balancing_bias).abs().max().item()
        steps.append({"loss": abs(loss - want), "bias_error": error, "moved": layer.balancing_bias})
        for p in composed.parameters():
            p.grad = None
    return steps


@pytest.mark.parametrize(
    ("degrees", "ep", "sequence_parallel"),
    [({"tp": 2, "dp": 2}, 2, False), ({"tp": 2, "cp": 2}, 4, True)],
)
def test_bias_step_on_the_folded_layout_is_one_process_bit_for_bit(
    cluster4, degrees, ep, sequence_parallel
):
    for steps in cluster4.run(_bias_on_rank, degrees, ep, sequence_parallel):
        assert steps[0]["moved"].abs().max().item() == pytest.approx(0.05)  # it moved, by γ
        for step in steps:  # later steps route with the bias the earlier ones stepped
            assert step["bias_error"] == 0.0 and step["loss"] < 1e-10, steps


def _bias_with_stages_on_rank() -> str:
    from dtlab.mesh import Mesh
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.pipeline import one_f_one_b

    model = _model({"bias_balancing": True}, torch.float64)
    try:
        compose_gpt(model, Mesh(pp=2, dp=2, ep=2), schedule=one_f_one_b(2, 2))
    except ValueError as err:
        return str(err)
    return "accepted"


def test_bias_step_with_pipeline_stages_is_refused_and_says_what_to_choose(cluster4):
    """A stage's router keeps only its last micro-batch's counts (before this refusal,
    stepping the bias raised on the stage without the MoE layer and hung the other stage)."""
    (says, *_) = cluster4.run(_bias_with_stages_on_rank)
    assert "use MoEConfig(bias_balancing=False) with pp > 1" in says and "or pp=1" in says


def test_sequence_shard_groups_are_the_ranks_of_one_pp_and_dp_index():
    """On 16 ranks (pp=2 × dp=2 × cp=2 × tp=2), which the 4-rank runs above cannot tell apart."""
    from dtlab.mesh.layout import Layout
    from dtlab.parallel.compose.fold_experts import sequence_shard_groups

    layout = Layout(pp=2, dp=2, cp=2, tp=2)
    want: dict[tuple, list[int]] = {}
    for rank in range(16):
        c = layout.coordinates(rank)
        want.setdefault((c["pp"], c["dp"]), []).append(rank)
    assert sequence_shard_groups(16, tp=2, cp=2) == list(want.values())
