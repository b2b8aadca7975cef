"""The lab GPT trained FSDP-style with its weights all-gathered in BF16 or in FP8, and the
one-process reference that plays every rank.

Every step, on every rank (:class:`~dtlab.precision.fp8_all_gather.ShardedWeights`):

1. gather the full weights from the FP32 master shards — all in BF16, or the block Linears'
   weights as E4M3 bytes with one agreed scale each (one amax all-reduce) and the rest in BF16;
2. forward and backward this rank's rows of the global batch on an FP32 model whose block
   Linears are :class:`~dtlab.precision.Fp8Linear` (per-tensor E4M3 forward, E5M2 backward):
   the GEMMs are FP8 in both runs, only *where* the weight was cast differs;
3. reduce-scatter the FP32 gradients (mean over ranks) and step AdamW on the master shards.

Why the two runs agree: an FP8 layer casts its weight to E4M3 with ``amax / 448`` anyway. Cast
before the gather (FP8 run) or after it (BF16 run), the GEMM sees the same E4M3 grid; the FP8
run skips the BF16 rounding in between, so a handful of weight elements that sit near a rounding
boundary land one E4M3 step apart. The lab and the tests hold the loss curves to
:data:`GATHER_LOSS_TOLERANCE`; :func:`train_one_process` must match each run's own losses to
float rounding.
"""

from __future__ import annotations

import torch

from dtlab.comm import Communicator
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank
from dtlab.precision.fp8_all_gather import (
    ShardedWeights,
    gather_bytes_per_rank,
    is_fp8_weight,
    quantize_whole_weight,
)
from dtlab.precision.fp8_linear import PER_TENSOR, convert_to_fp8
from dtlab.runtime.context import device as rank_device

GATHER_LOSS_TOLERANCE = 0.02  # nats, per step: FP8 vs BF16 all-gather on the lab GPT


def _fp8_model(config: GPTConfig, seed: int) -> GPT:
    return convert_to_fp8(GPT(config, seed=seed), PER_TENSOR)


@torch.no_grad()
def _load(model: GPT, weights: dict[str, torch.Tensor]) -> None:
    for name, p in model.named_parameters():
        p.copy_(weights[name])
        p.grad = None


def train_with_gather(
    dtype: str,
    steps: int = 8,
    config: GPTConfig | None = None,
    batch_size: int = 8,
    lr: float = 3e-3,
    seed: int = 0,
    collectives: str = "dtlab",
) -> dict:
    """Run on every rank (``cluster.run``). Returns the mean loss over ranks per step, this
    rank's counted bytes per op, the formula's, and a checksum of the first gathered weights."""
    config = config or GPTConfig.tiny()
    comm = Communicator(collectives=collectives)
    device = rank_device()
    model = _fp8_model(config, seed).to(device)
    sharded = ShardedWeights(model, comm)
    opt = torch.optim.AdamW(sharded.masters.values(), lr=lr, weight_decay=0.0)
    losses, first = [], None
    for batch in SyntheticTokens(config, steps, batch_size, seed=seed):
        x, y = (t.to(device) for t in shard_for_rank(batch, comm.rank, comm.world_size))
        weights = sharded.gather(dtype)
        if first is None:
            first = {n: weights[n].clone() for n in sharded.fp8_names[:2]}
        _load(model, weights)
        loss = loss_fn(model(x), y)
        loss.backward()
        sharded.reduce_gradients({n: p.grad for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
        mean = loss.detach().reshape(1) / comm.world_size
        comm.all_reduce_control(mean, name="loss report")
        losses.append(float(mean))
    first = {n: w.cpu() for n, w in first.items()}
    numels = {n: p.numel() for n, p in model.named_parameters()}
    formula = gather_bytes_per_rank(numels, sharded.fp8_names, comm.world_size, dtype)
    return {
        "losses": losses,
        "bytes_by_op": dict(comm.comm_stats.bytes_by_op),
        "bytes_by_bucket": dict(sharded.bytes_by_bucket),
        "counted": comm.comm_stats.counted,
        "formula_per_step": formula,
        "first_gathered": first,
        "rank": comm.rank,
    }


def train_one_process(
    dtype: str,
    world_size: int,
    steps: int = 8,
    config: GPTConfig | None = None,
    batch_size: int = 8,
    lr: float = 3e-3,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> list[float]:
    """The reference: one process plays all ``world_size`` ranks — the weights each step are the
    FP32 masters rounded as the wire would carry them (BF16, or E4M3 with the whole weight's
    amax), each rank's rows run forward and backward on them, the gradients are averaged, and
    AdamW steps the full FP32 weights. Returns the mean loss over ranks per step. ``device``: where
    it runs; compare with ranks on the same kind of device (CPU and CUDA sum in other orders,
    and an FP8 rounding flipped by that difference moves the loss by ~1e-3 within 3 steps)."""
    config = config or GPTConfig.tiny()
    model = _fp8_model(config, seed).to(device)
    masters = {n: p.detach().float().clone().requires_grad_() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(masters.values(), lr=lr, weight_decay=0.0)
    losses = []
    for batch in SyntheticTokens(config, steps, batch_size, seed=seed):
        with torch.no_grad():
            weights = {
                n: quantize_whole_weight(m)
                if dtype == "fp8" and is_fp8_weight(n, m)
                else m.detach().to(torch.bfloat16).float()
                for n, m in masters.items()
            }
        _load(model, weights)
        total = 0.0
        for rank in range(world_size):
            x, y = (t.to(device) for t in shard_for_rank(batch, rank, world_size))
            loss = loss_fn(model(x), y)
            (loss / world_size).backward()
            total += float(loss.detach()) / world_size
        for n, p in model.named_parameters():
            masters[n].grad = p.grad.float()
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses
