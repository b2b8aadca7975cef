"""FP8 weight all-gather under FSDP: cast each weight shard to E4M3 *before* it travels.

Under FSDP every rank holds 1/N of each weight and all-gathers the rest before the layer runs.
If the layer computes in FP8 it casts the gathered weight to E4M3 anyway, so the cast can move
in front of the gather: the wire then carries 1 byte per element instead of BF16's 2 (torchao's
``enable_fsdp_float8_all_gather`` with FSDP2; Llama-3 / torchtitan float8 training).

The catch is the scale. A per-tensor E4M3 scale is ``amax / 448`` of the **whole** weight, but
each rank sees only its shard. If every rank scaled its shard by its own amax, the gathered
weight would carry N different scales. So before the gather:

1. each rank takes the amax of its shard of every FP8 weight (``k`` numbers, no bytes);
2. **one** all-reduce (MAX) of those ``k`` amaxes — ``4k`` bytes of payload, one small message
   for all the unit's weights (torchao's ``precompute_float8_dynamic_scale_for_fsdp``) — gives
   every rank the global amax of every weight, hence the same scale ``s = amax / 448``;
3. each rank casts its shard with ``s`` (saturating at ±448) and all-gathers the raw E4M3 bytes;
4. every rank dequantises ``q · s`` — identical on every rank, and bit-equal to quantising the
   full weight in one process (the tests hold both).

Only the weights of FP8 GEMMs travel in FP8; embeddings, norms, biases and the LM head keep
their high-precision compute copy (BF16), as an FP8 recipe computes them in BF16.

Layout (FSDP2's per-parameter sharding): each parameter, flattened and padded to a multiple of N,
is cut into N equal chunks; rank r sends chunk r of every parameter of a bucket laid end to end,
so one all-gather per bucket (FP8, BF16) brings every parameter whole. Bytes each rank sends
(ring, :func:`gather_bytes_per_rank`): ``(N−1) · Σ_p ⌈numel_p/N⌉ · bytes_per_element`` per
bucket, and ``2(N−1)/N · 4k'`` for the amax all-reduce (``k`` padded to ``k'``, a multiple of N).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from dtlab.comm import Communicator
from dtlab.models import GPT, GPTConfig
from dtlab.precision.formats import E4M3_MAX

GATHER_DTYPES = ("bf16", "fp8")


def is_fp8_weight(name: str, param: nn.Parameter) -> bool:
    """The weights an FP8 recipe multiplies in FP8: a transformer block's Linear weights.
    Embeddings, norms, biases and the LM head stay in BF16 (:mod:`dtlab.precision.cast_overhead`
    says why)."""
    return param.dim() == 2 and name.startswith("blocks.") and name.endswith(".weight")


class ShardedWeights:
    """Every rank's FP32 master shards of a model's parameters, gathered in BF16 or FP8.

    ``masters[name]`` is this rank's chunk (an ``nn.Parameter`` an optimizer steps); the full
    model is cut from one identically seeded copy, so a one-process reference always exists."""

    def __init__(
        self,
        model: nn.Module,
        comm: Communicator,
        fp8_weight: Callable[[str, nn.Parameter], bool] = is_fp8_weight,
    ) -> None:
        self.comm, self.world = comm, comm.world_size
        self.shapes = {n: p.shape for n, p in model.named_parameters()}
        self.chunk = {n: math.ceil(p.numel() / self.world) for n, p in model.named_parameters()}
        self.fp8_names = [n for n, p in model.named_parameters() if fp8_weight(n, p)]
        self.bf16_names = [n for n in self.shapes if n not in self.fp8_names]
        self.masters = {
            n: nn.Parameter(self._my_chunk(p.detach().float(), n))
            for n, p in model.named_parameters()
        }
        self.scales: dict[str, float] = {}
        self._device = next(iter(self.masters.values())).device
        self.bytes_by_bucket: dict[str, int] = {}  # counted from each gather's own messages

    def _padded(self, full: torch.Tensor, name: str) -> torch.Tensor:
        flat = full.reshape(-1)
        return torch.cat([flat, flat.new_zeros(self.chunk[name] * self.world - flat.numel())])

    def _my_chunk(self, full: torch.Tensor, name: str) -> torch.Tensor:
        c = self.chunk[name]
        return self._padded(full, name)[self.comm.rank * c : (self.comm.rank + 1) * c].clone()

    # -- the scale every rank agrees on ----------------------------------------------------------
    def agree_scales(self) -> dict[str, float]:
        """Steps 1–2 of the module docstring: local amaxes, one all-reduce (MAX), ``amax / 448``."""
        k = len(self.fp8_names)
        # the ring splits the amaxes into N chunks, so their count is padded to a multiple of N
        amax = torch.zeros(math.ceil(k / self.world) * self.world, device=self._device)
        for i, name in enumerate(self.fp8_names):
            amax[i] = self.masters[name].detach().abs().max()
        self.comm.all_reduce(amax, name="fp8_amax", op="max")
        self.scales = {
            n: float(a / E4M3_MAX) if a > 0 else 1.0
            for n, a in zip(self.fp8_names, amax.tolist(), strict=False)
        }
        return self.scales

    # -- the gathers -------------------------------------------------------------------------------
    def _gather_bucket(
        self, names: list[str], send: torch.Tensor, bucket: str
    ) -> list[torch.Tensor]:
        full = send.new_empty(send.numel() * self.world)
        before = self.comm.comm_stats.snapshot()
        self.comm.all_gather(full, send, name=f"{bucket}.all_gather")
        sent = (self.comm.comm_stats - before).bytes_sent
        self.bytes_by_bucket[bucket] = self.bytes_by_bucket.get(bucket, 0) + sent
        per_rank = full.reshape(self.world, -1)
        out, offset = [], 0
        for name in names:
            c = self.chunk[name]
            whole = per_rank[:, offset : offset + c].reshape(-1)[: math.prod(self.shapes[name])]
            out.append(whole.reshape(self.shapes[name]))
            offset += c
        return out

    @torch.no_grad()
    def gather(self, dtype: str = "fp8") -> dict[str, torch.Tensor]:
        """Every parameter whole, in fp32 holding the values the wire carried: ``"bf16"``
        gathers all of them in BF16; ``"fp8"`` gathers the FP8 weights as E4M3 bytes with the
        agreed scales (:meth:`agree_scales` first) and the rest in BF16."""
        if dtype not in GATHER_DTYPES:
            raise ValueError(f"gather dtype {dtype!r}: choose one of {GATHER_DTYPES}")
        fp8 = self.fp8_names if dtype == "fp8" else []
        rest = [n for n in self.shapes if n not in fp8]
        full: dict[str, torch.Tensor] = {}
        if fp8:
            scales = self.agree_scales()
            codes = [self._to_e4m3(self.masters[n], scales[n]).view(torch.uint8) for n in fp8]
            gathered = self._gather_bucket(fp8, torch.cat(codes), "fp8_weights")
            for name, q in zip(fp8, gathered, strict=True):
                full[name] = q.view(torch.float8_e4m3fn).float() * scales[name]
        send = torch.cat([self.masters[n].detach().to(torch.bfloat16) for n in rest])
        for name, w in zip(rest, self._gather_bucket(rest, send, "bf16_weights"), strict=True):
            full[name] = w.float()
        return {n: full[n] for n in self.shapes}

    @staticmethod
    def _to_e4m3(values: torch.Tensor, scale: float) -> torch.Tensor:
        return (values.detach() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)

    # -- gradients -----------------------------------------------------------------------------
    @torch.no_grad()
    def reduce_gradients(self, grads: dict[str, torch.Tensor]) -> None:
        """Reduce-scatter the full FP32 gradients (summed, then divided by N: the mean over
        ranks) into each master shard's ``.grad``."""
        full = torch.cat([self._padded(grads[n].float(), n).reshape(self.world, -1)
                          for n in self.shapes], dim=1)  # fmt: skip
        shard = full.new_empty(full.shape[1])
        self.comm.reduce_scatter(shard, full.reshape(-1), name="grads.reduce_scatter")
        offset = 0
        for name in self.shapes:
            c = self.chunk[name]
            self.masters[name].grad = shard[offset : offset + c] / self.world
            offset += c


def quantize_whole_weight(weight: torch.Tensor) -> torch.Tensor:
    """The one-process reference: the full weight in E4M3 with ``amax / 448`` of the whole
    tensor, dequantised in fp32 — what every rank's FP8 all-gather must reproduce bit for bit."""
    amax = float(weight.detach().float().abs().max())
    scale = amax / E4M3_MAX if amax > 0 else 1.0
    return ShardedWeights._to_e4m3(weight.float(), scale).float() * scale


def gather_bytes_per_rank(numels: dict[str, int], fp8_names: list[str], world: int, dtype: str):
    """Bytes one rank sends to gather every parameter once (ring), by bucket: ``{
    "fp8_weights", "bf16_weights" (each bucket's all-gather), "all_gather" (their sum),
    "amax_all_reduce"}``. ``numels``: each parameter's element count; ``fp8_names``: those
    gathered in E4M3 under ``dtype="fp8"`` (1 B each; everything else 2 B, BF16)."""
    if dtype not in GATHER_DTYPES:
        raise ValueError(f"gather dtype {dtype!r}: choose one of {GATHER_DTYPES}")
    fp8 = set(fp8_names) if dtype == "fp8" else set()
    fp8_chunk = sum(math.ceil(n / world) for name, n in numels.items() if name in fp8)
    bf16_chunk = sum(2 * math.ceil(n / world) for name, n in numels.items() if name not in fp8)
    amaxes = math.ceil(len(fp8) / world) * world
    return {
        "fp8_weights": (world - 1) * fp8_chunk,
        "bf16_weights": (world - 1) * bf16_chunk,
        "all_gather": (world - 1) * (fp8_chunk + bf16_chunk),
        "amax_all_reduce": 2 * (world - 1) * amaxes * 4 // world if fp8 else 0,
    }


def gpt_gather_bytes(config, world: int, dtype: str, bucket: str = "all_gather") -> int:
    """:func:`gather_bytes_per_rank` for the lab GPT of ``config`` (a :class:`GPTConfig` or the
    name of one of its presets, e.g. ``"tiny"``): one step's bytes of ``bucket`` per rank."""
    config = getattr(GPTConfig, config)() if isinstance(config, str) else config
    model = GPT(config, seed=0)
    numels = {n: p.numel() for n, p in model.named_parameters()}
    fp8 = [n for n, p in model.named_parameters() if is_fp8_weight(n, p)]
    return gather_bytes_per_rank(numels, fp8, world, dtype)[bucket]
