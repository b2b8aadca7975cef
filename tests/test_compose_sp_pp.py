"""Sequence parallel inside pipeline stages trains like one process and sends 1/t the bytes.

Each rank builds the same fp64 GPT, composes pp × tp (× dp) with sequence parallelism, and runs
one step. Loss and every gradient equal single-process autograd's; the pipeline's point-to-point
bytes are counted from real messages and equal
:func:`~dtlab.parallel.compose.sequence_pipeline.stage_boundary_bytes` per message — the
sequence shard, ``1/tp`` of what the same layout without sequence parallel sends.
"""

from __future__ import annotations

import pytest
import torch

TOLERANCE = 1e-10


def _sp_pp_on_rank(degrees: dict, sp: bool, data_parallel: str = "ddp", n_micro: int = 2):
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.compose.sequence_pipeline import stage_boundary_bytes
    from dtlab.parallel.pipeline import one_f_one_b

    config = GPTConfig.tiny(seq_len=16, d_model=32, n_layers=4, vocab_size=64, dropout=0.0)
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=4, seed=3)[0]
    reference = GPT(config, seed=0, dtype=torch.float64)
    ref_loss = loss_fn(reference(tokens), targets)
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}

    mesh = Mesh(**degrees)
    composed = compose_gpt(
        GPT(config, seed=0, dtype=torch.float64),
        mesh,
        data_parallel=data_parallel,
        sequence_parallel=sp,
        schedule=one_f_one_b(mesh.pp_size, n_micro),
        collectives="dtlab",
    )
    composed.reset_traffic()
    loss = composed.train_step(tokens, targets)
    pp_bytes = sum(composed.traffic().get("pp", {}).values())
    grads = composed.local_full_gradients()
    if "lm_head.weight" in grads:
        grads["embed.weight"] = grads.pop("lm_head.weight")
    micro_batch = tokens.shape[0] // mesh.dp_size // n_micro
    one_message = stage_boundary_bytes(
        micro_batch, config.seq_len, config.d_model, 8, tp=mesh.tp_size, sp=sp
    )
    return {
        "loss": abs(loss - ref_loss.item()),
        "grad_error": max((g - ref_grads[n]).abs().max().item() for n, g in grads.items()),
        "names": sorted(grads),
        "all_names": sorted(ref_grads),
        "pp_bytes": pp_bytes,
        # 2 stages, 1F1B: stage 0 sends m activations, stage 1 sends m gradients
        "formula": n_micro * one_message,
    }


def _check(results) -> None:
    covered = set()
    for result in results:
        assert result["loss"] < TOLERANCE, result["loss"]
        assert result["grad_error"] < TOLERANCE, result["grad_error"]
        covered |= set(result["names"])
    assert covered == set(results[0]["all_names"])


def test_sequence_parallel_inside_pipeline_stages_trains_like_one_process(cluster4):
    _check(cluster4.run(_sp_pp_on_rank, {"pp": 2, "tp": 2}, True))


def test_stages_send_the_sequence_shard_one_tp_th_of_the_whole_activation(cluster4):
    with_sp = cluster4.run(_sp_pp_on_rank, {"pp": 2, "tp": 2}, True)
    without = cluster4.run(_sp_pp_on_rank, {"pp": 2, "tp": 2}, False)
    for shard, whole in zip(with_sp, without, strict=True):
        assert shard["pp_bytes"] == shard["formula"] > 0  # counted == b·(S/t)·d·e per message
        assert whole["pp_bytes"] == whole["formula"]
        assert whole["pp_bytes"] == 2 * shard["pp_bytes"]  # 1/t of the non-SP case, t = 2


@pytest.fixture(scope="module")
def cluster8():
    import dtlab

    with dtlab.Cluster(8, timeout=300) as cluster:
        yield cluster


@pytest.mark.parametrize("data_parallel", ["ddp", "fsdp"])
def test_sequence_parallel_pipeline_with_data_parallel_trains_like_one_process(
    cluster8, data_parallel
):
    """pp × dp × tp = 2 × 2 × 2 with SP: the composition torchtitan runs as its 3-D default."""
    _check(cluster8.run(_sp_pp_on_rank, {"pp": 2, "dp": 2, "tp": 2}, True, data_parallel))
