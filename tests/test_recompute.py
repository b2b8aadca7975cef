"""Recomputation written from scratch: bit-for-bit training, parity with torch, and real ranks.

Full (``Recomputed``) and selective (``recompute_attention_core``) recomputation must leave the
gradients *identical* to plain autograd (dropout included: the RNG state is restored for the
re-run), match ``torch.utils.checkpoint`` and its op-level selective policy, and keep working
under DDP, our ZeRO-3/FSDP and tensor parallelism — where full recomputation re-runs the
forward collectives, counted here.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint as ckpt

import dtlab
from dtlab.mesh import Mesh
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank
from dtlab.parallel import BucketedDDP, FullyShardedDataParallel, gather_full_parameters
from dtlab.parallel.activations.op_level_checkpointing import (
    checkpoint_saving_matmuls,
    has_op_level_sac,
)
from dtlab.parallel.activations.recomputation import (
    Recomputed,
    plain_attention_core,
    recompute,
    recompute_attention_core,
)
from dtlab.parallel.tensor import parallelize_gpt
from dtlab.parallel.tensor.accounting import comm_bytes_per_layer

CONFIG = GPTConfig.tiny(seq_len=16, d_model=32, n_heads=4, n_layers=3, dropout=0.1)
B = 4


def _batch(seed: int = 0):
    return next(iter(SyntheticTokens(CONFIG, n_batches=1, batch_size=B, seed=seed)))


def _grads_after_one_step(mode: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Gradients of one training step, and the RNG's next draw (it must not be disturbed)."""
    model = GPT(CONFIG, seed=0)
    model.train()
    tokens, targets = _batch()
    torch.manual_seed(1)
    if mode == "full":
        logits = Recomputed(model)(tokens)
    elif mode == "every2":
        logits = Recomputed(model, every=2)(tokens)
    elif mode == "selective":
        logits = recompute_attention_core(model)(tokens)
    elif mode in ("torch", "torch_sac"):
        run = ckpt.checkpoint if mode == "torch" else checkpoint_saving_matmuls
        kwargs = {"use_reentrant": False} if mode == "torch" else {}
        h, positions = model.embed_tokens(tokens), torch.arange(tokens.shape[1])
        for block in model.blocks:
            h = run(block, h, positions, **kwargs)
        logits = model.lm_logits(h)
    else:
        logits = model(tokens)
    loss_fn(logits, targets).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, torch.rand(4)


@pytest.mark.parametrize("mode", ["full", "every2", "selective", "torch", "torch_sac"])
def test_recomputed_training_equals_plain_training_bit_for_bit(mode):
    if mode == "torch_sac" and not has_op_level_sac():
        pytest.skip("op-level selective checkpointing needs torch >= 2.4")
    plain, plain_next = _grads_after_one_step("none")
    grads, next_draw = _grads_after_one_step(mode)
    for name, grad in plain.items():
        assert torch.equal(grads[name], grad), name
    assert torch.equal(next_draw, plain_next)  # the re-run drew nothing from the global RNG


def test_a_recomputed_region_really_reruns_and_sees_the_same_dropout_mask():
    calls = []

    def region(x):
        calls.append(1)
        return torch.nn.functional.dropout(x, 0.5) * x

    x = torch.randn(64, requires_grad=True)
    torch.manual_seed(3)
    recompute(region, x).sum().backward()
    torch.manual_seed(3)
    expected = torch.autograd.grad(region(x).sum(), x)[0]
    assert len(calls) == 3  # forward, the backward re-run, the reference
    assert torch.equal(x.grad, expected)


def test_a_second_backward_through_a_recomputed_region_is_refused():
    x = torch.randn(8, requires_grad=True)
    y = recompute(lambda t: (t * t).sum(), x)
    y.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.backward()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="every=4"):
        Recomputed(GPT(CONFIG), every=4)
    with pytest.raises(ValueError, match="blocks"):
        recompute_attention_core(torch.nn.Linear(2, 2))
    model = recompute_attention_core(GPT(CONFIG))
    plain_attention_core(model)
    assert model.blocks[0].attn.core.__name__ == "math_attention"


def _train(wrap, steps: int = 2) -> torch.nn.Module:
    rank, world = dtlab.rank(), dtlab.world_size()
    model = GPT(CONFIG, seed=0)
    model.train()
    wrapped = wrap(model)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    torch.manual_seed(10 + rank)
    for step in range(steps):
        x, y = shard_for_rank(_batch(step), rank, world)
        opt.zero_grad()
        loss_fn(wrapped(x), y).backward()
        opt.step()
    return wrapped


def _under_ddp_and_fsdp() -> dict:
    ddp = {
        name: {n: p.detach().clone() for n, p in _train(wrap).module.named_parameters()}
        for name, wrap in (
            ("plain", lambda m: BucketedDDP(m)),
            ("full", lambda m: BucketedDDP(Recomputed(m))),
            ("selective", lambda m: BucketedDDP(recompute_attention_core(m))),
        )
    }
    fsdp = {
        name: gather_full_parameters(_train(wrap))
        for name, wrap in (
            ("plain", lambda m: FullyShardedDataParallel(m, units=list(m.blocks))),
            ("full", lambda m: FullyShardedDataParallel(Recomputed(m), units=list(m.blocks))),
        )
    }
    unprefixed = {k.removeprefix("model."): v for k, v in fsdp["full"].items()}
    return {
        "ddp_full": all(torch.equal(ddp["full"][f"model.{n}"], p) for n, p in ddp["plain"].items()),
        "ddp_selective": all(torch.equal(ddp["selective"][n], p) for n, p in ddp["plain"].items()),
        "fsdp_full": all(torch.equal(unprefixed[n], p) for n, p in fsdp["plain"].items()),
    }


def test_recompute_under_ddp_and_fsdp_trains_bit_for_bit_like_without(cluster2):
    for r in cluster2.run(_under_ddp_and_fsdp):
        assert r == {"ddp_full": True, "ddp_selective": True, "fsdp_full": True}


def _under_tensor_parallel(sequence_parallel: bool) -> dict:
    results = {}
    for mode in ("none", "full", "selective"):
        tp = parallelize_gpt(GPT(CONFIG, seed=0), Mesh(tp=2), sequence_parallel, "dtlab")
        tp.model.train()
        run = {"none": tp.model, "full": Recomputed(tp.model)}.get(mode)
        run = run if run is not None else recompute_attention_core(tp.model)
        tokens, targets = _batch()
        torch.manual_seed(5)
        tp.comm.comm_stats.reset()
        tp.loss(run(tokens), targets).backward()
        tp.finish_gradients()
        results[mode] = (tp.comm.comm_stats.bytes_sent, tp.full_gradients())
    plain_bytes, plain_grads = results["none"]
    block_forward = sum(comm_bytes_per_layer(B, 16, 32, 2, sequence_parallel).values())
    return {
        "same_grads": {
            m: all(torch.equal(results[m][1][n], g) for n, g in plain_grads.items())
            for m in ("full", "selective")
        },
        "extra_bytes": {m: results[m][0] - plain_bytes for m in ("full", "selective")},
        "expected_full_extra": CONFIG.n_layers * block_forward,
    }


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_recompute_under_tensor_parallel_reruns_exactly_the_forward_collectives(
    cluster2, sequence_parallel
):
    for r in cluster2.run(_under_tensor_parallel, sequence_parallel):
        assert r["same_grads"] == {"full": True, "selective": True}
        assert r["extra_bytes"] == {"full": r["expected_full_extra"], "selective": 0}


def test_nothing_of_a_recomputed_step_outlives_its_backward_without_the_garbage_collector():
    import gc

    from dtlab.parallel.activations import recomputation as recompute_module

    model = GPT(CONFIG, seed=0)
    tokens, targets = _batch()
    gc.collect()
    gc.disable()
    try:
        loss_fn(Recomputed(model)(tokens), targets).backward()
        alive = [o for o in gc.get_objects() if type(o) is recompute_module._Region]
    finally:
        gc.enable()
    assert alive == []  # a reference cycle would keep every re-run's tensors until gc runs


def _step_flops_and_saved(mode: str) -> tuple[int, int]:
    from torch.utils.flop_counter import FlopCounterMode

    from dtlab.memory import ActivationMeter

    model = GPT(CONFIG, seed=0)
    model.train()
    tokens, targets = _batch()
    if mode == "torch":
        positions = torch.arange(tokens.shape[1])

        def run(t):
            h = model.embed_tokens(t, positions=positions)  # one positions storage, as ours
            for block in model.blocks:
                h = ckpt.checkpoint(block, h, positions, use_reentrant=False)
            return model.lm_logits(h)
    else:
        run = {"none": model, "full": Recomputed(model)}.get(mode)
        run = run if run is not None else recompute_attention_core(model)
    counter = FlopCounterMode(display=False)
    with counter:
        with ActivationMeter(model) as meter:
            loss = loss_fn(run(tokens), targets)
        loss.backward()
    return counter.get_total_flops(), meter.total_bytes


def test_recompute_pays_exactly_the_flops_of_the_forward_it_reruns():
    from torch.utils.flop_counter import FlopCounterMode

    plain, _ = _step_flops_and_saved("none")
    full, full_saved = _step_flops_and_saved("full")
    theirs, theirs_saved = _step_flops_and_saved("torch")
    selective, _ = _step_flops_and_saved("selective")
    model = GPT(CONFIG, seed=0)
    h = torch.randn(B, CONFIG.seq_len, CONFIG.d_model)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        for block in model.blocks:
            h = block(h, torch.arange(CONFIG.seq_len))
    # Full: one more forward of every block, counted op by op; the same as torch's checkpoint,
    # which keeps the same bytes (each block's input; the positions are the embedding's).
    assert full - plain == counter.get_total_flops()
    assert (theirs, theirs_saved) == (full, full_saved)
    # Selective: the core's two matmuls, q·kᵀ and weights·v, 2·b·s²·h FLOPs each, per layer.
    s, h_ = CONFIG.seq_len, CONFIG.d_model
    assert selective - plain == CONFIG.n_layers * 2 * (2 * B * s * s * h_)


def _selective_under_fsdp() -> bool:
    plain = gather_full_parameters(
        _train(lambda m: FullyShardedDataParallel(m, units=list(m.blocks)))
    )
    selective = gather_full_parameters(
        _train(
            lambda m: FullyShardedDataParallel(recompute_attention_core(m), units=list(m.blocks))
        )
    )
    return all(torch.equal(selective[n], p) for n, p in plain.items())


def test_selective_recompute_under_fsdp_trains_bit_for_bit_like_without(cluster2):
    assert cluster2.run(_selective_under_fsdp) == [True, True]
