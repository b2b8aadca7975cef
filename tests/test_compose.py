"""Every parallelism composed on one mesh trains the lab GPT exactly as one process does.

Each rank builds the same ``GPT(config, seed=0)`` in fp64, composes it over a mesh with
:func:`dtlab.parallel.compose.compose_gpt`, and runs one training step on the same global batch.
The global loss, every parameter's gradient (gathered whole over tp and FSDP; each pipeline rank
checks its own stage's, and together the ranks cover every parameter) and the global gradient
norm used for clipping must equal single-process autograd's. Only the order of floating-point
sums differs, so fp64 agrees far inside :data:`TOLERANCE`.
"""

from __future__ import annotations

import pytest
import torch

import dtlab

TOLERANCE = 1e-10


def _step_on_rank(
    degrees: dict, data_parallel: str = "ddp", sp: bool = False, vocab_size: int = 64, **extra
) -> dict:
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.pipeline import one_f_one_b

    config = GPTConfig.tiny(seq_len=16, d_model=32, n_layers=4, vocab_size=vocab_size, dropout=0.0)
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=4, seed=3)[0]
    reference = GPT(config, seed=0, dtype=torch.float64)
    ref_loss = loss_fn(reference(tokens), targets)
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    ref_norm = torch.sqrt(sum(g.pow(2).sum() for g in ref_grads.values())).item()

    mesh = Mesh(**degrees)
    schedule = one_f_one_b(mesh.pp_size, 2) if mesh.pp_size > 1 else None
    composed = compose_gpt(
        GPT(config, seed=0, dtype=torch.float64),
        mesh,
        data_parallel=data_parallel,
        sequence_parallel=sp,
        schedule=schedule,
        collectives="dtlab",
        **extra,
    )
    loss = composed.train_step(tokens, targets)
    grads = composed.local_full_gradients()
    if config.tie_embeddings and "lm_head.weight" in grads:  # the last stage's copy of the tie
        grads["embed.weight"] = grads.pop("lm_head.weight")
    errors = {n: (g - ref_grads[n]).abs().max().item() for n, g in grads.items()}
    norm = composed.clip_grad_norm_(1e9).item()
    return {
        "loss": abs(loss - ref_loss.item()),
        "grad_error": max(errors.values()),
        "names": sorted(grads),
        "all_names": sorted(ref_grads),
        "norm": abs(norm - ref_norm) / ref_norm,
        "placements": {n: p.reduced_over for n, p in composed.placements.items()},
    }


def _check(results) -> None:
    covered = set()
    for result in results:
        assert result["loss"] < TOLERANCE, result["loss"]
        assert result["grad_error"] < TOLERANCE, result["grad_error"]
        assert result["norm"] < 1e-12, result["norm"]
        covered |= set(result["names"])
    assert covered == set(results[0]["all_names"])  # no parameter missed by every rank


@pytest.fixture(scope="module")
def cluster8():
    with dtlab.Cluster(8, timeout=300) as cluster:
        yield cluster


@pytest.mark.parametrize(
    ("degrees", "data_parallel", "sp"),
    [
        ({"dp": 2, "tp": 2}, "ddp", True),
        ({"dp": 2, "tp": 2}, "fsdp", False),  # FSDP × TP, 2-D
        ({"dp": 2, "tp": 2}, "fsdp", True),
        ({"dp": 4}, "hsdp", False),  # shard inside blocks of 2, replicate across
        ({"pp": 2, "tp": 2}, "ddp", False),
        ({"dp": 2, "cp": 2}, "fsdp", False),
    ],
)
def test_two_dimensional_layouts_train_like_one_process(cluster4, degrees, data_parallel, sp):
    extra = {"hsdp_shard": 2} if data_parallel == "hsdp" else {}
    _check(cluster4.run(_step_on_rank, degrees, data_parallel, sp, **extra))


@pytest.mark.parametrize(
    ("degrees", "data_parallel"),
    [({"dp": 2, "tp": 2}, "fsdp"), ({"pp": 2, "tp": 2}, "ddp")],
)
def test_a_vocabulary_tp_does_not_divide_is_padded_and_trains_like_one_process(
    cluster4, degrees, data_parallel
):
    """63 tokens on tp = 2: each rank holds 32 rows, one of them padding; the padding never
    enters the loss, and the gathered gradients are the one-process model's 63 rows."""
    _check(cluster4.run(_step_on_rank, degrees, data_parallel, False, vocab_size=63))


@pytest.mark.parametrize(
    "degrees",
    [
        {"pp": 2, "dp": 2, "tp": 2},  # 3-D
        {"pp": 2, "cp": 2, "tp": 2},  # pipeline × context × tensor
        {"pp": 2, "dp": 2, "cp": 2},
    ],
)
def test_three_dimensional_layouts_train_like_one_process(cluster8, degrees):
    _check(cluster8.run(_step_on_rank, degrees))


def test_each_parameter_names_the_groups_its_gradient_is_reduced_over(cluster4):
    result = cluster4.run(_step_on_rank, {"dp": 2, "tp": 2}, "ddp", True)[0]
    reduced = result["placements"]
    assert reduced["blocks.0.attn.q_proj.weight"] == ("dp",)  # a tp shard: averaged over dp
    assert reduced["blocks.0.attn_norm.weight"] == ("tp", "dp")  # sequence parallel: tp partial


def test_impossible_compositions_are_refused_with_what_to_change(cluster4):
    def build(degrees, data_parallel):
        from dtlab.mesh import Mesh
        from dtlab.models import GPT, GPTConfig
        from dtlab.models.moe import MoEConfig, moe_mlp_factory
        from dtlab.parallel.compose import compose_gpt

        factory = moe_mlp_factory(MoEConfig(n_experts=4, top_k=2, every=2))
        try:
            compose_gpt(
                GPT(GPTConfig.tiny(), mlp_factory=factory), Mesh(**degrees),
                data_parallel=data_parallel,
            )  # fmt: skip
        except ValueError as err:
            return str(err)
        return "accepted"

    # EP with TP is composed: the folded mapping (tests/test_compose_ep_tp.py)
    assert cluster4.run(build, {"dp": 2, "tp": 2, "ep": 2}, "ddp")[0] == "accepted"
    assert (
        "use data_parallel='ddp' with ep > 1" in cluster4.run(build, {"dp": 4, "ep": 2}, "fsdp")[0]
    )


def _moe_step_on_rank(degrees: dict) -> dict:
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.models.moe import MoEConfig, moe_mlp_factory
    from dtlab.parallel.compose import compose_gpt

    config = GPTConfig.tiny(seq_len=16, d_model=32, n_layers=2, vocab_size=64, dropout=0.0)
    factory = moe_mlp_factory(MoEConfig(n_experts=4, top_k=2, every=2, z_loss_weight=1e-3))
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=4, seed=3)[0]
    mesh = Mesh(**degrees)
    # One process, the same definition: each dp shard's mean loss plus its own balancing losses
    # (GShard's groups), averaged over the shards.
    reference = GPT(config, seed=0, dtype=torch.float64, mlp_factory=factory)
    rows = tokens.shape[0] // mesh.dp_size
    ref_loss = 0.0
    for shard in range(mesh.dp_size):
        part = slice(shard * rows, (shard + 1) * rows)
        loss = loss_fn(reference(tokens[part]), targets[part]) + reference.aux_loss
        (loss / mesh.dp_size).backward()
        ref_loss += loss.item() / mesh.dp_size
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}

    model = GPT(config, seed=0, dtype=torch.float64, mlp_factory=factory)
    composed = compose_gpt(model, mesh, collectives="dtlab")
    loss = composed.train_step(tokens, targets)
    per = 4 // mesh.ep_size  # experts on this rank: a block of the full tensor
    errors = []
    for name, p in composed.named_parameters():
        want = ref_grads[name]
        if ".experts." in name:
            want = want[mesh.ep_rank * per : (mesh.ep_rank + 1) * per]
        errors.append((p.grad - want).abs().max().item())
    reduced = {n: p.reduced_over for n, p in composed.placements.items()}
    ref_norm = torch.sqrt(sum(g.pow(2).sum() for g in ref_grads.values())).item()
    norm = composed.clip_grad_norm_(1e9).item()
    return {
        "loss": abs(loss - ref_loss),
        "grad_error": max(errors),
        "reduced": reduced,
        "norm": abs(norm - ref_norm) / ref_norm,
    }


def test_moe_gpt_under_dp_by_ep_trains_like_one_process(cluster4):
    for result in cluster4.run(_moe_step_on_rank, {"dp": 4, "ep": 2}):
        assert result["loss"] < TOLERANCE and result["grad_error"] < TOLERANCE, result
        assert result["norm"] < 1e-12, result["norm"]  # each expert counted once, on its edp rank 0
        assert result["reduced"]["blocks.1.mlp.experts.fc_in.weight"] == ("edp",)
        assert result["reduced"]["blocks.1.attn.q_proj.weight"] == ("dp",)


def test_the_four_dimensional_layout_trains_like_one_process():
    """PP × DP × CP × TP = 2 × 2 × 2 × 2 on 16 ranks: every mechanism at once."""
    with dtlab.Cluster(16, timeout=300, start_timeout=300) as cluster16:
        _check(cluster16.run(_step_on_rank, {"pp": 2, "dp": 2, "cp": 2, "tp": 2}))
