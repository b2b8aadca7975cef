"""Tensor (and sequence) parallel GPT computes what one process computes, and trains like it.

Every rank builds the same full ``GPT(config, seed=0)`` and :func:`parallelize_gpt` shards it;
one process runs the unsharded model on the same batch. The forward logits (gathered along the
vocabulary), the loss (vocabulary-parallel cross-entropy against ``F.cross_entropy``) and every
parameter's gradient (gathered along its sharded dimension) must agree. Only the order of
floating-point sums differs (a row-parallel matmul adds ``t`` partial products; the loss adds
``t`` partial sums of ``exp``), so in fp64 they agree to :data:`FP64_TOLERANCE`; a few SGD steps
in fp32 stay within :data:`~dtlab.parallel.data.equivalence.FP32_STEP_TOLERANCE`.
"""

from __future__ import annotations

import pytest
import torch

from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
from dtlab.parallel.data.equivalence import (
    FP32_STEP_TOLERANCE,
    max_abs_difference,
    parameters_by_name,
)
from dtlab.parallel.tensor.accounting import params_per_rank

FP64_TOLERANCE = 1e-12
"""fp64 carries ~1e-16 relative; reordered sums of O(1) values stay far below this."""

SMALL = GPTConfig.tiny(seq_len=16, d_model=32)  # 4 heads, vocab 128: tp = 2 and 4 both fit
GQA_UNTIED = GPTConfig.tiny(seq_len=16, d_model=32, n_kv_heads=2, tie_embeddings=False)


def _batch(config: GPTConfig, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return SyntheticTokens(config, n_batches=step + 1, batch_size=2, seed=3)[step]


def _padding_grad(model, vocab_size: int) -> float:
    """Sum of |gradient| over this rank's padding rows (ids ≥ vocab_size) of embed and head."""
    first = max(vocab_size - model.embed.vocab_start, 0)
    return sum(m.weight.grad[first:].abs().sum().item() for m in (model.embed, model.lm_head))


def _one_step_on_rank(
    config: GPTConfig, sequence_parallel: bool, collectives: str, dp: int = 1
) -> dict:
    from dtlab.mesh import Mesh
    from dtlab.parallel.tensor import parallelize_gpt

    tokens, targets = _batch(config)
    reference = GPT(config, seed=0, dtype=torch.float64)
    ref_logits = reference(tokens)
    ref_loss = loss_fn(ref_logits, targets)
    ref_loss.backward()

    mesh = Mesh(dp=dp, tp=torch.distributed.get_world_size() // dp)
    tp = parallelize_gpt(
        GPT(config, seed=0, dtype=torch.float64), mesh, sequence_parallel, collectives
    )
    logits = tp.model(tokens)
    loss = tp.loss(logits, targets)
    loss.backward()
    tp.finish_gradients()
    grads = tp.full_gradients()
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    return {
        "local_vocab": logits.shape[-1],
        "params_match_formula": sum(p.numel() for p in tp.model.parameters())
        == params_per_rank(config, tp.comm.world_size),
        "shapes_match": all(grads[n].shape == g.shape for n, g in ref_grads.items()),
        "padding_grad": _padding_grad(tp.model, config.vocab_size),
        "logits": (tp.gather_logits(logits) - ref_logits).abs().max().item(),
        "loss": abs(loss.item() - ref_loss.item()),
        "grads": max_abs_difference(grads, ref_grads),
    }


@pytest.mark.parametrize("world", [2, 4])
def test_tp_and_sp_logits_loss_and_every_gradient_equal_one_process(world, request):
    cluster = request.getfixturevalue(f"cluster{world}")
    cases = [(SMALL, False, "torch", 1), (SMALL, True, "dtlab", 1)]
    if world == 2:  # GQA with 2 KV heads splits over 2 ranks (not 4); untied head sharded alone
        cases += [(GQA_UNTIED, False, "dtlab", 1), (GQA_UNTIED, True, "torch", 1)]
    else:  # a dp=2 × tp=2 mesh: each TP group talks only among itself
        cases += [(SMALL, True, "dtlab", 2)]
    for config, sp, via, dp in cases:
        for rank_result in cluster.run(_one_step_on_rank, config, sp, via, dp):
            assert rank_result["local_vocab"] == config.vocab_size * dp // world
            assert rank_result["shapes_match"]
            for what in ("logits", "loss", "grads"):
                assert rank_result[what] < FP64_TOLERANCE, (config, sp, what, rank_result)


# Megatron-style padding: tp does not divide these vocabularies. 65 on 2 ranks → 66 (33 each, the
# last row padding); 65 on 4 → 68; 5 on 4 → 8 (rank 3 holds only padding rows).
ODD_VOCAB = GPTConfig.tiny(seq_len=16, d_model=32, vocab_size=65)
ODD_VOCAB_UNTIED = GPTConfig.tiny(seq_len=16, d_model=32, vocab_size=65, tie_embeddings=False)
TINY_VOCAB = GPTConfig.tiny(seq_len=16, d_model=32, vocab_size=5)


@pytest.mark.parametrize("world", [2, 4])
def test_an_indivisible_vocabulary_is_padded_and_logits_loss_gradients_equal_one_process(
    world, request
):
    """The padding columns never enter the loss: the loss, the gathered logits and every
    gradient (padding cut off, the one-process shapes) equal the unpadded model's, and the
    padding rows get exactly zero gradient."""
    cluster = request.getfixturevalue(f"cluster{world}")
    cases = [(ODD_VOCAB, False, "dtlab"), (ODD_VOCAB_UNTIED, True, "torch")]
    if world == 4:
        cases += [(TINY_VOCAB, False, "dtlab"), (TINY_VOCAB, True, "torch")]
    for config, sp, via in cases:
        for rank, result in enumerate(cluster.run(_one_step_on_rank, config, sp, via)):
            assert result["local_vocab"] == -(-config.vocab_size // world)
            assert result["shapes_match"], (config.vocab_size, world)
            assert result["params_match_formula"], (config.vocab_size, world)
            assert result["padding_grad"] == 0.0, (config.vocab_size, rank)
            for what in ("logits", "loss", "grads"):
                assert result[what] < FP64_TOLERANCE, (config.vocab_size, sp, what, result)


STEPS = 3


def _steps_on_rank(sequence_parallel: bool, config: GPTConfig = SMALL, adam: bool = False) -> dict:
    from dtlab.mesh import Mesh
    from dtlab.parallel.tensor import parallelize_gpt

    def optimizer(params):
        if adam:  # weight decay too: padding rows with zero gradient must stay zero
            return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
        return torch.optim.SGD(params, lr=0.5, momentum=0.9)

    dtype = torch.float64 if adam else torch.float32  # Adam magnifies fp32 rounding
    batches = [_batch(config, i) for i in range(STEPS)]
    reference = GPT(config, seed=0, dtype=dtype)
    ref_opt = optimizer(reference.parameters())
    mesh = Mesh(tp=torch.distributed.get_world_size())
    tp = parallelize_gpt(GPT(config, seed=0, dtype=dtype), mesh, sequence_parallel)
    opt = optimizer(tp.model.parameters())
    losses = []
    for tokens, targets in batches:
        ref_opt.zero_grad()
        loss_fn(reference(tokens), targets).backward()
        ref_opt.step()
        opt.zero_grad()
        loss = tp.loss(tp.model(tokens), targets)
        loss.backward()
        tp.finish_gradients()
        opt.step()
        losses.append(loss.item())
    first = max(config.vocab_size - tp.model.embed.vocab_start, 0)
    return {
        "params": max_abs_difference(tp.full_parameters(), parameters_by_name(reference)),
        "moved": max_abs_difference(
            parameters_by_name(reference), parameters_by_name(GPT(config, seed=0, dtype=dtype))
        ),  # fmt: skip
        "losses": losses,
        "padding": sum(
            m.weight[first:].abs().sum().item() for m in (tp.model.embed, tp.model.lm_head)
        ),
    }


@pytest.mark.parametrize("world", [2, 4])
def test_a_few_sgd_steps_with_tp_and_sp_stay_equal_to_one_process(world, request):
    cluster = request.getfixturevalue(f"cluster{world}")
    for sp in (False, True):
        results = cluster.run(_steps_on_rank, sp)
        for r in results:
            assert r["moved"] > 1e-3  # the steps did change the weights
            assert r["params"] < FP32_STEP_TOLERANCE, (sp, r)
            assert r["losses"] == results[0]["losses"]  # every rank reports the same loss


def test_adamw_steps_on_a_padded_vocabulary_stay_equal_to_one_process_and_padding_stays_zero(
    cluster2,
):
    for config in (ODD_VOCAB, ODD_VOCAB_UNTIED):
        results = cluster2.run(_steps_on_rank, False, config, True)
        for r in results:
            assert r["moved"] > 1e-3
            assert r["params"] < 1e-9, (config.tie_embeddings, r)  # fp64
            assert r["padding"] == 0.0
            assert r["losses"] == results[0]["losses"]


def _full_gradients_on_rank_0_only() -> None:
    import dtlab
    from dtlab.mesh import Mesh
    from dtlab.parallel.tensor import parallelize_gpt

    tp = parallelize_gpt(GPT(SMALL, seed=0), Mesh(tp=2))
    tokens, targets = _batch(SMALL)
    tp.loss(tp.model(tokens), targets).backward()
    if dtlab.rank() == 0:
        tp.full_gradients()  # a collective called on one rank: rank 1 never joins


def test_full_gradients_called_on_one_rank_fails_at_once_naming_it_and_the_line():
    """``full_gradients`` is a collective (its docstring says so): a lone caller cannot finish.
    The Cluster says so as soon as rank 1 returns, naming the method and the caller's line,
    instead of waiting for the timeout."""
    import dtlab
    from dtlab.runtime.errors import ClusterTimeout

    # its own cluster: the failed run restarts the ranks
    with (
        dtlab.Cluster(2, device="cpu", timeout=120) as cluster,
        pytest.raises(ClusterTimeout) as raised,
    ):
        cluster.run(_full_gradients_on_rank_0_only)
    message = str(raised.value)
    assert "rank 1 returned without posting its side" in message
    assert "TensorParallel.full_gradients" in message
    assert "_full_gradients_on_rank_0_only" in message
    assert "every rank" in dtlab.parallel.tensor.TensorParallel.full_gradients.__doc__
