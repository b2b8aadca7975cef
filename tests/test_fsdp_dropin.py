"""Our FSDP and ZeRO drop into an ordinary torch training loop and train like torch's own.

The loop is the one a PyTorch user already has: ``torch.optim.AdamW`` over ``model.parameters()``,
a cosine ``LRScheduler``, ``zero_grad``/``backward``/``step``. Compared after a few steps:
(i) one process, (ii) our FSDP, (iii) torch FSDP2 ``fully_shard``, (iv) our ZeRO-1/2 and torch's
``ZeroRedundancyOptimizer``; with bf16 compute and fp32 norms, ours against ``fully_shard`` with
``MixedPrecisionPolicy``.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint as ckpt
from torch import nn

import dtlab
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank
from dtlab.parallel import FullyShardedDataParallel, MixedPrecision, ZeroOptimizer, norms_in_fp32
from dtlab.parallel.data.equivalence import (
    FP32_STEP_TOLERANCE,
    max_abs_difference,
    parameters_by_name,
)
from dtlab.parallel.zero.full_state import gather_full_parameters

STEPS = 4
CONFIG = GPTConfig.tiny(seq_len=8, d_model=32, n_layers=2)
ADAM_TOLERANCE = 1e-4
"""Adam divides by sqrt(v): where a gradient element is ~0 its update is sensitive to the last
bits of a sum whose order differs between one process and two ranks; 1e-4 after 4 steps of lr
1e-2 is ~1 % of one update."""
BF16_PARITY_TOLERANCE = 1e-3
"""Ours and torch's FSDP2 run the same bf16 recipe; they differ only in the order bf16 gradients
are summed, about one bf16 ulp of a gradient (2**-8 relative), times lr 1e-2, over 4 steps."""


def _batches():
    return list(SyntheticTokens(CONFIG, n_batches=STEPS, batch_size=4, seed=0))


def _plain_loop(model_forward, params, batches, shard_batch=True) -> list[float]:
    """The user's own loop: plain AdamW, cosine schedule, nothing dtlab-specific."""
    rank, world = dtlab.rank(), dtlab.world_size()
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    lrs = []
    for tokens, targets in batches:
        x, y = shard_for_rank((tokens, targets), rank, world) if shard_batch else (tokens, targets)
        opt.zero_grad()
        loss_fn(model_forward(x), y).backward()
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    return lrs


def _fsdp2(model: nn.Module, policy_of=None) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dtlab.world_size(),))

    def shard(module):
        fully_shard(module, mesh=mesh, **({"mp_policy": policy_of(module)} if policy_of else {}))

    for block in model.blocks:
        if policy_of is not None:
            shard(block.attn_norm)
            shard(block.mlp_norm)
        shard(block)
    shard(model)
    return model


def _full_fsdp2(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}


def _fp32_loop_everywhere() -> dict:
    batches = _batches()
    reference = GPT(CONFIG, seed=0)
    _plain_loop(reference, reference.parameters(), batches, shard_batch=False)
    ref = parameters_by_name(reference)

    ours_model = GPT(CONFIG, seed=0)
    ours = FullyShardedDataParallel(ours_model)
    lrs = _plain_loop(ours, ours.parameters(), batches)
    registered = {n: tuple(p.shape) for n, p in ours.module.named_parameters()}

    theirs = _fsdp2(GPT(CONFIG, seed=0))
    _plain_loop(theirs, theirs.parameters(), batches)

    replicated_model = GPT(CONFIG, seed=0)  # biases and norms kept whole, the rest sharded
    replicated = FullyShardedDataParallel(
        replicated_model, shard=lambda name, p: p.dim() > 1 and "norm" not in name
    )
    _plain_loop(replicated, replicated.parameters(), batches)

    z1_model, z2_model = GPT(CONFIG, seed=0), GPT(CONFIG, seed=0)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    zro_model = GPT(CONFIG, seed=0)
    zero = {}
    for name, model in (("zero1", z1_model), ("zero2", z2_model), ("zero_redundancy", zro_model)):
        if name == "zero_redundancy":
            opt = ZeroRedundancyOptimizer(
                model.parameters(), torch.optim.AdamW, lr=1e-2, weight_decay=0.1
            )
        else:
            opt = ZeroOptimizer(
                model.parameters(), torch.optim.AdamW, stage=int(name[-1]), bucket_cap_mb=0.02,
                lr=1e-2, weight_decay=0.1,
            )  # fmt: skip
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
        rank, world = dtlab.rank(), dtlab.world_size()
        for tokens, targets in batches:
            x, y = shard_for_rank((tokens, targets), rank, world)
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            if name == "zero_redundancy":  # torch's ZeRO leaves gradient averaging to the user
                for p in model.parameters():
                    torch.distributed.all_reduce(p.grad)
                    p.grad.div_(world)
            opt.step()
            sched.step()
        zero[name] = parameters_by_name(model)
        zero[f"{name}.lr"] = opt.param_groups[0]["lr"]
    return {
        "ours_vs_single": max_abs_difference(gather_full_parameters(ours), ref),
        "fsdp2_vs_single": max_abs_difference(_full_fsdp2(theirs), ref),
        "ours_vs_fsdp2": max_abs_difference(gather_full_parameters(ours), _full_fsdp2(theirs)),
        "replicated_vs_single": max_abs_difference(gather_full_parameters(replicated), ref),
        "replicated_norm_is_whole": tuple(replicated_model.blocks[0].attn_norm.weight.shape),
        "zero1_vs_single": max_abs_difference(zero["zero1"], ref),
        "zero2_vs_single": max_abs_difference(zero["zero2"], ref),
        "zero1_vs_torch": max_abs_difference(zero["zero1"], zero["zero_redundancy"]),
        "lrs": lrs,
        "zero_lrs": (zero["zero1.lr"], zero["zero2.lr"], zero["zero_redundancy.lr"]),
        "registered": registered,
    }


def test_fsdp_and_zero_in_a_plain_adamw_loop_match_single_process_and_torch(cluster2):
    for r in cluster2.run(_fp32_loop_everywhere):
        for key in ("ours_vs_single", "fsdp2_vs_single", "replicated_vs_single"):
            assert r[key] < ADAM_TOLERANCE, (key, r[key])
        assert r["ours_vs_fsdp2"] < ADAM_TOLERANCE
        for key in ("zero1_vs_single", "zero2_vs_single", "zero1_vs_torch"):
            assert r[key] < ADAM_TOLERANCE, (key, r[key])
        assert r["replicated_norm_is_whole"] == (CONFIG.d_model,)
        assert r["lrs"][-1] == r["zero_lrs"][0] == r["zero_lrs"][2] < 1e-3  # the schedule ran
        # What the module registers between steps is this rank's 1-D shard, never a full weight.
        assert r["registered"]["blocks.0.mlp.fc_in.weight"][0] < CONFIG.d_model * CONFIG.d_ff


def _bf16_with_fp32_norms() -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    batches = _batches()
    policy = MixedPrecision(torch.bfloat16)
    ours_model = GPT(CONFIG, seed=0)
    norms = [m for b in ours_model.blocks for m in (b.attn_norm, b.mlp_norm)]
    ours = FullyShardedDataParallel(
        ours_model, units=list(ours_model.blocks) + norms, mixed_precision=norms_in_fp32(policy)
    )
    seen = {}  # what each layer computes with, read inside its forward (hooks return None)
    ours_model.blocks[0].attn_norm.register_forward_pre_hook(
        lambda m, a: seen.update(norm=(m.weight.dtype, a[0].dtype))
    )
    ours_model.blocks[0].mlp.fc_in.register_forward_pre_hook(
        lambda m, a: seen.update(linear=m.weight.dtype)
    )
    _plain_loop(ours, ours.parameters(), batches)

    def torch_policy(module):
        if isinstance(module, nn.LayerNorm):
            return MixedPrecisionPolicy(
                param_dtype=torch.float32, reduce_dtype=torch.float32, output_dtype=torch.bfloat16
            )
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16)

    theirs = _fsdp2(GPT(CONFIG, seed=0), torch_policy)
    _plain_loop(theirs, theirs.parameters(), batches)
    ours_full = gather_full_parameters(ours)

    # The same bf16 recipe with biases and norms replicated (all-reduced in bf16) instead of
    # sharded (reduce-scattered in bf16): on two ranks each element is the same two-term sum.
    sharded = FullyShardedDataParallel(GPT(CONFIG, seed=0), mixed_precision=policy)
    _plain_loop(sharded, sharded.parameters(), batches)
    replicated = FullyShardedDataParallel(
        GPT(CONFIG, seed=0), mixed_precision=policy, shard=lambda name, p: p.dim() > 1
    )
    _plain_loop(replicated, replicated.parameters(), batches)
    return {
        "replicated_vs_sharded": max_abs_difference(
            gather_full_parameters(replicated), gather_full_parameters(sharded)
        ),
        "ours_vs_fsdp2": max_abs_difference(ours_full, _full_fsdp2(theirs)),
        "master_dtype": next(iter(ours_full.values())).dtype,
        "seen": seen,
    }


def test_bf16_blocks_with_fp32_norms_match_fsdp2_mixed_precision_policy(cluster2):
    for r in cluster2.run(_bf16_with_fp32_norms):
        assert r["ours_vs_fsdp2"] < BF16_PARITY_TOLERANCE, r["ours_vs_fsdp2"]
        assert r["replicated_vs_sharded"] < 1e-6, r["replicated_vs_sharded"]
        assert r["master_dtype"] == torch.float32
        assert r["seen"]["norm"] == (torch.float32, torch.float32)  # input cast to fp32 too
        assert r["seen"]["linear"] == torch.bfloat16


class _CheckpointedBlocks(nn.Module):
    """The lab GPT with every block run under non-reentrant activation checkpointing."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx):
        h = self.model.embed_tokens(idx)
        for block in self.model.blocks:
            h = ckpt.checkpoint(block, h, use_reentrant=False)
        return self.model.lm_logits(h)


def _recompute_inside_fsdp_units() -> dict:
    batches = _batches()
    reference = GPT(CONFIG, seed=0)
    _plain_loop(reference, reference.parameters(), batches, shard_batch=False)
    model = GPT(CONFIG, seed=0)
    wrapped = _CheckpointedBlocks(model)
    fsdp = FullyShardedDataParallel(wrapped, units=list(model.blocks))
    with ckpt.set_checkpoint_early_stop(False):  # the recompute runs the whole block forward
        _plain_loop(fsdp, fsdp.parameters(), batches)
    full = {k.removeprefix("model."): v for k, v in gather_full_parameters(fsdp).items()}
    return {"vs_single": max_abs_difference(full, parameters_by_name(reference))}


def test_fsdp_units_survive_backward_recompute_under_activation_checkpointing(cluster2):
    for r in cluster2.run(_recompute_inside_fsdp_units):
        assert r["vs_single"] < ADAM_TOLERANCE


def _gradients_and_optimizer_contract() -> dict:
    rank, world = dtlab.rank(), dtlab.world_size()
    (tokens, targets), *_ = _batches()
    x, y = shard_for_rank((tokens, targets), rank, world)
    reference = GPT(CONFIG, seed=0)
    loss_fn(reference(tokens), targets).backward()
    ref_grads = {n: p.grad.clone() for n, p in reference.named_parameters()}

    fsdp = FullyShardedDataParallel(GPT(CONFIG, seed=0))
    loss_fn(fsdp(x), y).backward()
    every_grad_local = all(p.grad is not None for p in fsdp.parameters())

    # ZeRO-2 built *after* a backward keeps the gradients already accumulated.
    late = GPT(CONFIG, seed=0)
    loss_fn(late(x), y).backward()
    opt = ZeroOptimizer(late.parameters(), torch.optim.SGD, stage=2, lr=1.0)
    late_grads = opt.full_gradients(late)
    saved = opt.state_dict()
    opt.load_state_dict(saved)
    opt.zero_grad(set_to_none=False)
    return {
        "fsdp_grads": max_abs_difference(fsdp.full_gradients(), ref_grads),
        "every_grad_local": every_grad_local,
        "late_zero2_grads": max_abs_difference(late_grads, ref_grads),
        "is_optimizer": isinstance(opt, torch.optim.Optimizer),
    }


def test_gradients_are_reachable_and_zero_keeps_grads_accumulated_before_it_was_built(cluster2):
    for r in cluster2.run(_gradients_and_optimizer_contract):
        assert r["every_grad_local"]
        assert r["fsdp_grads"] < FP32_STEP_TOLERANCE
        assert r["late_zero2_grads"] < FP32_STEP_TOLERANCE
        assert r["is_optimizer"]


def _zero_state_dict_resumes_training(mixed: bool) -> dict:
    rank, world = dtlab.rank(), dtlab.world_size()
    batches = _batches()

    def step(model, opt, batch):
        x, y = shard_for_rank(batch, rank, world)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    def build():
        model = GPT(CONFIG, seed=0)
        opt = ZeroOptimizer(
            model.parameters(), torch.optim.AdamW, stage=2, bucket_cap_mb=0.02, lr=1e-2,
            mixed_precision=MixedPrecision(torch.bfloat16) if mixed else None,
        )  # fmt: skip
        model.to(torch.bfloat16 if mixed else torch.float32)
        return model, opt

    straight, straight_opt = build()
    for batch in batches:
        step(straight, straight_opt, batch)

    first, first_opt = build()
    for batch in batches[:2]:
        step(first, first_opt, batch)
    saved_model = {k: v.clone() for k, v in first.state_dict().items()}
    saved_opt = first_opt.state_dict()
    resumed, resumed_opt = build()  # a fresh job: new model, new optimizer, then load both
    with torch.no_grad():
        for name, p in resumed.named_parameters():
            p.copy_(saved_model[name])
    resumed_opt.load_state_dict(saved_opt)  # under mixed precision: the fp32 masters too
    for batch in batches[2:]:
        step(resumed, resumed_opt, batch)
    return {
        "resumed_vs_straight": max_abs_difference(
            parameters_by_name(resumed), parameters_by_name(straight)
        ),
        "masters_vs_straight": max(
            (a - b).abs().max().item()
            for a, b in zip(resumed_opt.masters, straight_opt.masters, strict=True)
        ),
        "steps_in_state": int(next(iter(resumed_opt.state.values()))["step"]),
    }


@pytest.mark.parametrize("mixed", [False, True], ids=["fp32", "bf16_fp32_masters"])
def test_zero_optimizer_state_dict_resumes_training_exactly(cluster2, mixed):
    for r in cluster2.run(_zero_state_dict_resumes_training, mixed):
        assert r["resumed_vs_straight"] == 0.0
        assert r["masters_vs_straight"] == 0.0
        assert r["steps_in_state"] == STEPS
