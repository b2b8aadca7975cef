"""Gradient accumulation: K micro-batches equal one K·b batch; no_sync saves K-1 reductions.

Single process and on two real ranks under our DDP (with and without ``no_sync``, bytes counted
by dtlab's rings), ZeRO-2 (which reduce-scatters every micro-batch to keep only its gradient
shard) and ZeRO-3/FSDP, with and without its ``no_sync`` (one reduce-scatter per step, paid for
with a full unsharded gradient held per rank).
"""

from __future__ import annotations

import pytest
import torch

import dtlab
from dtlab.cost.volumes import dp_bytes_per_optimizer_step
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank
from dtlab.parallel import BucketedDDP, FullyShardedDataParallel, ZeroOptimizer
from dtlab.parallel.activations.gradient_accumulation import accumulate_gradients, split_batch
from dtlab.parallel.data.equivalence import max_abs_difference

CONFIG = GPTConfig.tiny(seq_len=8, d_model=32, n_layers=2)
K, GLOBAL = 4, 16
ACCUMULATION_TOLERANCE = 1e-6
"""fp32 gradients of ~1e-2: K partial sums of 1/K-scaled means against one mean differ only in
summation order, a few ulps (~1e-9); 1e-6 is far above that and far below any wrong scaling."""


def _global_batch():
    return next(iter(SyntheticTokens(CONFIG, n_batches=1, batch_size=GLOBAL, seed=0)))


def _big_batch_grads() -> dict[str, torch.Tensor]:
    model = GPT(CONFIG, seed=0)
    tokens, targets = _global_batch()
    loss_fn(model(tokens), targets).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_k_micro_batches_equal_one_big_batch():
    model = GPT(CONFIG, seed=0)
    tokens, targets = _global_batch()
    step = accumulate_gradients(model, split_batch(tokens, targets, K), loss_fn, no_sync=False)
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert max_abs_difference(grads, _big_batch_grads()) < ACCUMULATION_TOLERANCE
    assert step.micro_batches == K and step.synced_backwards == K and step.comm_bytes == 0


def test_forgetting_the_one_over_k_is_caught():
    model = GPT(CONFIG, seed=0)
    tokens, targets = _global_batch()
    for x, y in split_batch(tokens, targets, K):
        loss_fn(model(x), y).backward()  # no 1/K: K times the gradient
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert max_abs_difference(grads, _big_batch_grads()) > 100 * ACCUMULATION_TOLERANCE


def test_bad_arguments_are_refused():
    tokens, targets = _global_batch()
    with pytest.raises(ValueError, match="divisor of 16"):
        split_batch(tokens, targets, 3)
    with pytest.raises(ValueError, match=r"no_sync=False(.|\n)*stage=1"):
        accumulate_gradients(GPT(CONFIG), split_batch(tokens, targets, 2), loss_fn)
    with pytest.raises(ValueError, match="at least one"):
        accumulate_gradients(GPT(CONFIG), [], loss_fn, no_sync=False)


def _data_parallel_accumulation() -> dict:
    rank, world = dtlab.rank(), dtlab.world_size()
    tokens, targets = shard_for_rank(_global_batch(), rank, world)
    micro = split_batch(tokens, targets, K)
    out = {}
    for no_sync in (True, False):
        ddp = BucketedDDP(GPT(CONFIG, seed=0), collectives="dtlab")
        step = accumulate_gradients(ddp, micro, loss_fn, no_sync=no_sync)
        grads = {n: p.grad for n, p in ddp.module.named_parameters()}
        out[no_sync] = (step.comm_bytes, step.synced_backwards, grads)
    single = BucketedDDP(GPT(CONFIG, seed=0), collectives="dtlab")
    loss_fn(single(tokens), targets).backward()
    one_reduction = single.comm_stats.bytes_sent

    model = GPT(CONFIG, seed=0)
    zero2 = ZeroOptimizer(model.parameters(), torch.optim.SGD, stage=2, lr=1.0)
    zero2.comm.comm_stats.reset()
    accumulate_gradients(model, micro, loss_fn, no_sync=False)
    zero2_bytes, zero2_calls = zero2.comm_stats.bytes_sent, zero2.comm_stats.calls
    zero2_grads = zero2.full_gradients(model)
    fsdp = FullyShardedDataParallel(GPT(CONFIG, seed=0), collectives="dtlab")
    fsdp_step = accumulate_gradients(fsdp, micro, loss_fn, no_sync=False)
    fsdp_grads = fsdp.full_gradients()
    fsdp_single = FullyShardedDataParallel(GPT(CONFIG, seed=0), collectives="dtlab")
    loss_fn(fsdp_single(tokens), targets).backward()
    big = _big_batch_grads()
    return {
        "fsdp_sync": fsdp_step.synced_backwards,
        "fsdp_bytes": (fsdp_step.comm_bytes, fsdp_single.comm_stats.bytes_sent),
        "ddp_formula": dp_bytes_per_optimizer_step(GPT(CONFIG).num_params(), world, K, True, 4),
        "no_sync": (out[True][0], out[True][1]),
        "sync_every": (out[False][0], out[False][1]),
        "one_reduction": one_reduction,
        "errors": [max_abs_difference(out[s][2], big) for s in (True, False)]
        + [max_abs_difference(zero2_grads, big), max_abs_difference(fsdp_grads, big)],
        "zero2_reduce_scatters": zero2_calls,
        "zero2_segments": len(zero2.segments),
        "zero2_bytes": zero2_bytes,
    }


def test_data_parallel_accumulation_matches_and_no_sync_moves_one_kth(cluster2):
    for r in cluster2.run(_data_parallel_accumulation):
        assert max(r["errors"]) < ACCUMULATION_TOLERANCE, r["errors"]
        assert r["no_sync"] == (r["one_reduction"], 1)
        assert r["sync_every"] == (K * r["one_reduction"], K)
        # ZeRO-2 keeps only its shard: one reduce-scatter per segment per micro-batch.
        assert r["zero2_bytes"] > 0
        assert r["zero2_reduce_scatters"] == K * r["zero2_segments"]
        assert r["no_sync"][0] == r["ddp_formula"]  # 2(N-1)/N·Ψ·4 bytes: one all-reduce
        assert r["fsdp_sync"] == K  # without no_sync: a reduce-scatter every micro-batch
        fsdp_accumulated, fsdp_one_batch = r["fsdp_bytes"]
        assert fsdp_accumulated == K * fsdp_one_batch > 0  # gathers + reduce-scatter, K times


def _fsdp_no_sync_accumulation() -> dict:
    import contextlib

    rank, world = dtlab.rank(), dtlab.world_size()
    micro = split_batch(*shard_for_rank(_global_batch(), rank, world), K)
    fsdp = FullyShardedDataParallel(GPT(CONFIG, seed=0), collectives="dtlab")
    held = []
    for i, (x, y) in enumerate(micro):
        last = i == K - 1
        with contextlib.nullcontext() if last else fsdp.no_sync():
            (loss_fn(fsdp(x), y) / K).backward()
        held.append((fsdp.unsynced_gradient_bytes(), fsdp.held_bytes()["grads"]))
    by_hand = fsdp.comm_stats.bytes_sent
    padded = sum(u.seg.padded_numel for u in fsdp.units)  # every trained parameter is sharded

    again = FullyShardedDataParallel(GPT(CONFIG, seed=0), collectives="dtlab")
    step = accumulate_gradients(again, micro, loss_fn)  # no_sync=True: every backward but the last
    replicated_norms = FullyShardedDataParallel(
        GPT(CONFIG, seed=0), shard=lambda name, _p: "norm" not in name
    )  # replicas keep their full gradient too and all-reduce it once
    accumulate_gradients(replicated_norms, micro, loss_fn)
    return {
        "held": held,
        "full_gradient_bytes": padded * 4,
        "sent": (by_hand, step.comm_bytes),
        # K·2 all-gathers (forward and backward of every micro-batch) + 1 reduce-scatter.
        "formula": (2 * K + 1) * (world - 1) / world * padded * 4,
        "synced_backwards": step.synced_backwards,
        "errors": [
            max_abs_difference(fsdp.full_gradients(), _big_batch_grads()),
            max_abs_difference(again.full_gradients(), _big_batch_grads()),
            max_abs_difference(replicated_norms.full_gradients(), _big_batch_grads()),
        ],
    }


def test_fsdp_no_sync_reduces_once_and_holds_a_full_gradient_meanwhile(cluster2):
    for r in cluster2.run(_fsdp_no_sync_accumulation):
        assert max(r["errors"]) < ACCUMULATION_TOLERANCE, r["errors"]
        full, shard = r["full_gradient_bytes"], r["full_gradient_bytes"] // 2
        assert r["held"] == [(full, full)] * (K - 1) + [(0, shard)], r  # counted as gradients
        assert r["sent"][0] == r["sent"][1] == r["formula"], r
        assert r["synced_backwards"] == 1


def _pipeline_micro_batches_on_rank(m: int) -> dict:
    from dtlab.mesh import Mesh
    from dtlab.parallel.pipeline import one_f_one_b, pipeline_gpt

    config = GPTConfig.tiny(seq_len=8, d_model=16, n_heads=2, n_layers=2)
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=2 * m, seed=3)[0]
    pipe = pipeline_gpt(GPT(config, seed=0, dtype=torch.float64), Mesh(pp=2), one_f_one_b(2, m))
    pipe.step(tokens, targets)
    piped = {n: p.grad for stage in pipe.stages.values() for n, p in stage.named_parameters()}
    model = GPT(config, seed=0, dtype=torch.float64)
    accumulate_gradients(model, split_batch(tokens, targets, m), loss_fn, no_sync=False)
    accumulated = dict(model.named_parameters())
    accumulated["lm_head.weight"] = model.lm_head.weight  # tied: the same tensor
    return {"gap": max((g - accumulated[n].grad).abs().max().item() for n, g in piped.items())}


def test_a_pipelines_micro_batches_are_gradient_accumulation(cluster2):
    # 1F1B over m micro-batches scales each loss by 1/m and sums the gradients: the same update
    # as accumulating the m micro-batches in one process (fp64: only the sum order differs).
    for r in cluster2.run(_pipeline_micro_batches_on_rank, 4):
        assert r["gap"] < 1e-12
