"""Expert parallel composed with tensor parallel (MoE parallel folding) trains like one process.

On 4 gloo ranks, ``Mesh(tp=2, dp=2)``: attention and the dense MLP tensor-parallel as always,
the MoE layer's experts over the folded EP group (``ep`` consecutive ranks: ep=2 the two TP
groups, ep=4 the whole stage — more than dp allows when EP is carved out of dp). Each TP rank
routes its own slice of the tokens, so every token is routed exactly once; the loss, every
parameter's full gradient and the global gradient norm equal one process's in fp64, under
skewed routing too, with context parallel and inside pipeline stages, and with balancing losses
whose counts are summed over the tp × cp ranks; the dispatch and combine bytes counted on the EP
group equal the formula from the routed counts; what is still refused says what to change."""

from __future__ import annotations

import pytest
import torch

from dtlab.cost.moe import dispatch_bytes_from_counts
from dtlab.parallel.expert.tensor_split import token_split_bytes

TOLERANCE = 1e-10
D_MODEL, N_EXPERTS, BATCH, SEQ = 32, 4, 4, 16


def _model(hot: float):
    """The lab GPT (block 1 an MoE with a per-token router), fp64; ``hot`` plants a popular
    expert 0: the MoE's LayerNorm adds ``hot·u`` to every token and the router's row 0 reads u."""
    from dtlab.models import GPT, GPTConfig
    from dtlab.models.moe import MoEConfig, moe_layers, moe_mlp_factory

    config = GPTConfig.tiny(
        seq_len=SEQ, d_model=D_MODEL, n_heads=4, n_layers=2, vocab_size=64, dropout=0.0
    )
    moe = MoEConfig(n_experts=N_EXPERTS, top_k=2, every=2, aux_loss_weight=0.0)
    model = GPT(config, seed=0, dtype=torch.float64, mlp_factory=moe_mlp_factory(moe))
    u = torch.ones(D_MODEL, dtype=torch.float64) / D_MODEL**0.5
    with torch.no_grad():
        for block in model.blocks:
            if block.mlp in moe_layers(model):
                block.mlp_norm.bias += hot * u
                block.mlp.router.weight[0] += u
    return model


def _folded_on_rank(
    expert_parallel: int, sequence_parallel: bool, hot: float, degrees: dict | None = None
) -> dict:
    import torch.distributed as dist

    from dtlab.mesh import Mesh
    from dtlab.models import SyntheticTokens, loss_fn
    from dtlab.models.moe import moe_layers
    from dtlab.parallel.compose import compose_gpt

    reference = _model(hot)
    tokens, targets = SyntheticTokens(reference.config, n_batches=1, batch_size=BATCH, seed=3)[0]
    ref_loss = loss_fn(reference(tokens), targets)
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    ref_norm = torch.sqrt(sum(g.pow(2).sum() for g in ref_grads.values())).item()

    from dtlab.parallel.pipeline import one_f_one_b

    mesh = Mesh(**(degrees or {"tp": 2, "dp": 2}))
    schedule = one_f_one_b(mesh.pp_size, 2) if mesh.pp_size > 1 else None
    composed = compose_gpt(
        _model(hot), mesh, sequence_parallel=sequence_parallel, collectives="dtlab",
        expert_parallel=expert_parallel, schedule=schedule,
    )  # fmt: skip
    loss = composed.train_step(tokens, targets)
    ep_sent = composed.mesh_communicators["ep"].comm_stats.bytes_sent
    traffic = composed.traffic()  # the step's own: gathering the gradients below adds more
    full = composed.local_full_gradients()
    ep = expert_parallel or mesh.layout.ep  # given, or the mesh's (folded as well with tp > 1)
    per, ep_rank = N_EXPERTS // ep, composed.coordinates["ep"]
    errors = {}
    for name, grad in full.items():
        want = ref_grads["embed.weight" if name == "lm_head.weight" else name]
        if ".experts." in name:
            want = want[ep_rank * per : (ep_rank + 1) * per]
        errors[name] = (grad - want).abs().max().item()
    layers = moe_layers(composed.module)
    layer = layers[0] if layers else None  # a pipeline stage without the MoE block: None
    norm = composed.clip_grad_norm_(1e9).item()
    return {
        "rank": dist.get_rank(),
        "loss": abs(loss - ref_loss.item()),
        "errors": errors,
        "missing": set(ref_grads) - set(full),  # held by another pipeline stage, if any
        "norm": abs(norm - ref_norm) / ref_norm,
        "ep_group": composed.folded.ep.ranks,
        "edp_group": composed.folded.edp.ranks,
        "ep_rank": ep_rank,
        "routed": sum(layer.stats.tokens_per_expert) // layer.moe.top_k if layer else 0,
        "kept": layer.stats.kept_per_expert if layer else [],
        "imbalance": layer.stats.imbalance if layer else 1.0,
        "bytes": layer.stats.all_to_all_bytes if layer else {},
        "ep_sent": ep_sent,
        "reduced": {n: p.reduced_over for n, p in composed.placements.items()},
        "traffic": traffic,
    }


def _by_ep_group(results: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault(tuple(r["ep_group"]), []).append(r)
    return {g: sorted(rs, key=lambda r: r["ep_rank"]) for g, rs in groups.items()}


CASES = [(2, False), (2, True), (4, False), (4, True), (1, False)]


@pytest.mark.parametrize(("ep", "sequence_parallel"), CASES)
@pytest.mark.parametrize("hot", [0.0, 3.0], ids=["balanced", "skewed"])
def test_ep_with_tp_trains_like_one_process_every_token_routed_once(
    cluster4, ep, sequence_parallel, hot
):
    results = cluster4.run(_folded_on_rank, ep, sequence_parallel, hot)
    _assert_like_one_process(results)
    # each token of the global batch routed by exactly one rank: 4 rows × 16 tokens
    assert sum(r["routed"] for r in results) == BATCH * SEQ
    if hot:
        assert max(r["imbalance"] for r in results) > 1.5  # the planted expert is popular


def _assert_like_one_process(results: list[dict]) -> None:
    for r in results:
        assert r["loss"] < TOLERANCE and max(r["errors"].values()) < TOLERANCE, r
        assert r["norm"] < 1e-12, r  # every element counted once in the global norm
    assert set.intersection(*(r["missing"] for r in results)) == set()  # every gradient checked


@pytest.mark.parametrize(
    ("ep", "sequence_parallel", "degrees", "tokens_routed"),
    [
        (2, False, {"tp": 2, "cp": 2}, BATCH * SEQ),  # ep over the tp ranks of one cp index
        (4, True, {"tp": 2, "cp": 2}, BATCH * SEQ),  # ep over tp × cp
        (2, False, {"tp": 2, "pp": 2}, BATCH * SEQ // 2),  # the last of 2 micro-batches
        (2, True, {"tp": 2, "pp": 2}, BATCH * SEQ // 2),
        (None, False, {"tp": 2, "dp": 2, "ep": 2}, BATCH * SEQ),  # the mesh's ep, folded
    ],
)
def test_ep_with_tp_inside_context_parallel_or_pipeline_stages_trains_like_one_process(
    cluster4, ep, sequence_parallel, degrees, tokens_routed
):
    results = cluster4.run(_folded_on_rank, ep, sequence_parallel, 3.0, degrees)
    _assert_like_one_process(results)
    if ep is None:  # Mesh(ep=2) with tp=2 is folded too: EP over the TP ranks, not across dp
        assert sorted(map(list, _by_ep_group(results))) == [[0, 1], [2, 3]]
    assert sum(r["routed"] for r in results) == tokens_routed


@pytest.mark.parametrize("ep", [2, 4])
def test_ep_groups_are_consecutive_ranks_folded_over_tp_and_dp(cluster4, ep):
    results = cluster4.run(_folded_on_rank, ep, False, 0.0)
    want = {2: [[0, 1], [2, 3]], 4: [[0, 1, 2, 3]]}[ep]
    # the MoE layer's token split over tp=2 without SP: one all-gather of its (b, S/2, d) output
    # forward, one of its input gradient backward — (t-1)/t · b·S·d fp64 each; nothing else in
    # this model all-gathers over tp without sequence parallelism
    split = token_split_bytes(BATCH // 2, SEQ, D_MODEL, tp=2, element_size=8)
    assert all(r["traffic"]["tp"]["all_gather"] == split for r in results)
    assert sorted(map(list, _by_ep_group(results))) == want
    for r in results:  # edp: the ranks holding the same experts
        assert len(r["edp_group"]) == 4 // ep and r["rank"] in r["edp_group"]
        assert r["reduced"]["blocks.1.mlp.experts.fc_in.weight"] == (("edp",) if ep < 4 else ())
        assert r["reduced"]["blocks.1.mlp.router.weight"] == ("tp", "dp")  # partial over tp
        assert r["reduced"]["blocks.0.mlp.fc_in.weight"] == ("dp",)  # a dense tp shard


@pytest.mark.parametrize("ep", [2, 4])
def test_all_to_all_bytes_counted_on_the_folded_group_equal_the_formula_from_routed_counts(
    cluster4, ep
):
    results = cluster4.run(_folded_on_rank, ep, True, 3.0)
    for group in _by_ep_group(results).values():
        kept = [r["kept"] for r in group]
        for r in group:
            want = dispatch_bytes_from_counts(kept, r["ep_rank"], D_MODEL, 8)
            assert r["bytes"] == {
                "counts": want.counts,
                "dispatch": want.dispatch,
                "combine": want.combine,
            }
            assert r["ep_sent"] == want.forward_and_backward  # backward: both exchanges again
    assert len({r["ep_sent"] for r in results}) > 1  # skewed: ranks send different bytes


def _refusal(degrees: dict, data_parallel: str, moe: dict, expert_parallel=None) -> str:
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig
    from dtlab.models.moe import MoEConfig, moe_mlp_factory
    from dtlab.parallel.compose import compose_gpt

    factory = moe_mlp_factory(MoEConfig(n_experts=4, top_k=2, every=2, **moe))
    try:
        compose_gpt(
            GPT(GPTConfig.tiny(), mlp_factory=factory), Mesh(**degrees),
            data_parallel=data_parallel, expert_parallel=expert_parallel,
        )  # fmt: skip
    except ValueError as err:
        return str(err)
    return "accepted"


PER_TOKEN = {"aux_loss_weight": 0.0}


def test_what_ep_with_tp_still_refuses_says_what_to_change(cluster4):
    says = cluster4.run(_refusal, {"dp": 2, "tp": 2, "ep": 2}, "ddp", {"capacity_factor": 1.0})[0]
    assert "use MoEConfig(capacity_factor=None) (dropless) with tp > 1, or tp=1" in says
    says = cluster4.run(_refusal, {"dp": 2, "tp": 2}, "fsdp", PER_TOKEN, 2)[0]
    assert "use data_parallel='ddp'" in says
    says = cluster4.run(_refusal, {"dp": 2, "tp": 2, "ep": 2}, "ddp", PER_TOKEN, 2)[0]
    assert "give the expert-parallel degree once" in says
    says = cluster4.run(_refusal, {"dp": 2, "tp": 2}, "ddp", PER_TOKEN, 3)[0]
    assert "choose ep from [1, 2, 4]" in says


def _balanced_on_rank(scope: str, degrees: dict, sequence_parallel: bool, ep: int) -> dict:
    """A balancing loss (Switch, in ``scope``) and a z-loss on the folded layout, against one
    process: each dp shard's mean loss plus its own balancing losses, averaged over the shards
    (the ``"global"`` scope counts the whole batch's tokens per expert)."""
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.models.moe import MoEConfig, moe_layers, moe_mlp_factory
    from dtlab.parallel.compose import compose_gpt

    config = GPTConfig.tiny(
        seq_len=SEQ, d_model=D_MODEL, n_heads=4, n_layers=2, vocab_size=64, dropout=0.0
    )
    moe = MoEConfig(n_experts=N_EXPERTS, top_k=2, every=2, aux_loss_scope=scope, z_loss_weight=0.01)
    factory = moe_mlp_factory(moe)
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=BATCH, seed=3)[0]
    mesh = Mesh(**degrees)
    reference = GPT(config, seed=0, dtype=torch.float64, mlp_factory=factory)
    if scope == "global":
        with torch.no_grad():
            reference(tokens)
        (layer,) = moe_layers(reference)
        whole = torch.tensor(layer.stats.tokens_per_expert)
        layer.load_reducer = lambda counts: whole
    rows, ref_loss = BATCH // mesh.dp_size, 0.0
    for shard in range(mesh.dp_size):
        part = slice(shard * rows, (shard + 1) * rows)
        loss = loss_fn(reference(tokens[part]), targets[part]) + reference.aux_loss
        (loss / mesh.dp_size).backward()
        ref_loss += loss.item() / mesh.dp_size
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}

    composed = compose_gpt(
        GPT(config, seed=0, dtype=torch.float64, mlp_factory=factory), mesh,
        sequence_parallel=sequence_parallel, collectives="dtlab", expert_parallel=ep,
    )  # fmt: skip
    loss = composed.train_step(tokens, targets)
    per, ep_rank = N_EXPERTS // ep, composed.coordinates["ep"]
    errors = []
    for name, grad in composed.local_full_gradients().items():
        want = ref_grads[name]
        if ".experts." in name:
            want = want[ep_rank * per : (ep_rank + 1) * per]
        errors.append((grad - want).abs().max().item())
    return {"loss": abs(loss - ref_loss), "grad_error": max(errors), "aux": ref_loss}


@pytest.mark.parametrize(
    ("scope", "degrees", "sequence_parallel", "ep"),
    [
        ("micro_batch", {"tp": 2, "dp": 2}, False, 2),
        ("micro_batch", {"tp": 2, "cp": 2}, True, 4),  # counts summed over tp × cp
        ("sequence", {"tp": 2, "dp": 2}, True, 4),
        ("global", {"tp": 2, "dp": 2}, False, 2),  # counts over tp, then dp
    ],
)
def test_balancing_losses_on_the_folded_layout_count_tokens_like_one_process(
    cluster4, scope, degrees, sequence_parallel, ep
):
    for r in cluster4.run(_balanced_on_rank, scope, degrees, sequence_parallel, ep):
        assert r["loss"] < TOLERANCE and r["grad_error"] < TOLERANCE, r
