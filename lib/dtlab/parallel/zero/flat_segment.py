"""Flat segments: the data structure under ZeRO-1/2/3 and FSDP-style sharding.

A *segment* is a list of parameters laid end to end in one flat buffer, padded with zeros to a
multiple of N so it splits into N equal chunks; rank r owns chunk r. Gradients are
reduce-scattered segment by segment (rank r receives the sum of chunk r) and parameters are
all-gathered segment by segment. Because every segment splits evenly, each rank holds exactly
1/N of the (padded) state — the Ψ/N in the ZeRO formulas (Rajbhandari et al., "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", SC 2020).

The optimizer never sees the model's parameters. It steps one *master shard* per segment: an fp32
tensor of ``shard_numel`` elements on ``master_device`` (the host when offloading). Elementwise
optimizers (SGD, Adam, AdamW, RMSprop, Adagrad, ...) therefore update every element exactly as
they would unsharded. Optimizers with per-tensor statistics (LARS/LAMB trust ratios, Adafactor's
factored moments) would see a chunk of a flat segment instead of a tensor; torch's
``ZeroRedundancyOptimizer`` assigns whole parameters to ranks for that reason.
"""

from __future__ import annotations

import torch
from torch import nn


class FlatSegment:
    """Parameters ``params`` flattened into ``padded_numel`` elements; this rank owns one chunk."""

    def __init__(self, params: list[nn.Parameter], rank: int, world_size: int) -> None:
        self.params = params
        self.numels = [p.numel() for p in params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(params))]
        self.numel = sum(self.numels)
        self.world_size, self.rank = world_size, rank
        self.padded_numel = -(-self.numel // world_size) * world_size
        self.shard_numel = self.padded_numel // world_size
        self.shapes = [p.shape for p in params]

    @property
    def my_range(self) -> tuple[int, int]:
        start = self.rank * self.shard_numel
        return start, start + self.shard_numel

    def flatten(
        self, tensors: list[torch.Tensor | None], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """One padded flat tensor from per-parameter tensors (``None`` contributes zeros)."""
        flat = torch.zeros(self.padded_numel, dtype=dtype, device=device)
        for t, off, n in zip(tensors, self.offsets, self.numels, strict=True):
            if t is not None:
                flat[off : off + n].copy_(t.reshape(-1))
        return flat

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Per-parameter views into a full flat buffer."""
        return [
            flat[off : off + n].view(shape)
            for off, n, shape in zip(self.offsets, self.numels, self.shapes, strict=True)
        ]

    def point_params_at(self, flat: torch.Tensor) -> None:
        """Make every parameter a view of ``flat`` (the all-gathered buffer)."""
        for p, view in zip(self.params, self.views(flat), strict=True):
            p.data = view

    def take_gradients(
        self, dtype: torch.dtype, device: torch.device, carried: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The parameters' ``.grad`` (``None`` = zeros) as one padded flat tensor, plus
        ``carried`` (a full gradient kept from earlier unreduced backwards); frees the ``.grad``."""
        full = self.flatten([p.grad for p in self.params], dtype, device)
        if carried is not None:
            full.add_(carried)
        for p in self.params:
            p.grad = None
        return full

    def reduce_scatter_gradients(
        self,
        comm,
        dtype: torch.dtype,
        device: torch.device,
        name: str,
        async_op: bool = False,
        carried: torch.Tensor | None = None,
    ) -> tuple[object, torch.Tensor]:
        """Flatten the parameters' ``.grad`` (plus ``carried``, see :meth:`take_gradients`),
        reduce-scatter the sum so this rank receives chunk r in a new ``shard``, and free the full
        gradients.

        Returns ``(pending, shard)``: ``pending.wait()`` (when not ``None``) before reading
        ``shard``; it still holds the *sum* over ranks. Shared by ZeRO-2 and ZeRO-3.
        """
        full = self.take_gradients(dtype, device, carried)
        shard = torch.empty(self.shard_numel, dtype=dtype, device=device)
        pending = comm.reduce_scatter(shard, full, name=name, async_op=async_op)
        return pending, shard

    def free_params(self) -> None:
        """Drop the full parameters, keeping the Parameter objects (autograd holds them)."""
        for p in self.params:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)


def normalize_param_groups(params, defaults: dict) -> list[dict]:
    """Accept a parameter iterator/generator or a list of param-group dicts, like torch optimizers.

    Frozen parameters are dropped and a parameter listed twice (tied weights) is kept once.
    """
    params = list(params)
    if not params:
        raise ValueError("the optimizer got an empty parameter list")
    groups = params if isinstance(params[0], dict) else [{"params": params}]
    seen: set[int] = set()
    out = []
    for group in groups:
        kept = []
        for p in group["params"]:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                kept.append(p)
        out.append({**defaults, **group, "params": kept})
    return out


def state_tensor_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of an optimizer's per-element state (momentum, variance, ...; not scalar counters)."""
    return sum(
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for t in state.values()
        if torch.is_tensor(t) and t.dim() > 0
    )
