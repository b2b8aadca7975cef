"""One model, four ways to data-parallelise it: the ZeRO stages side by side.

``shard_by_zero_stage(model, stage, torch.optim.AdamW, lr=...)`` wraps ``model`` the way stage
``stage`` of ZeRO (Rajbhandari et al. 2020) holds it, so a lab or a test can train every stage
with the same loop and compare bytes:

======  =============================================  ============================  ==============
stage   wrapper                                        held per rank (mixed Adam)    sent per step
======  =============================================  ============================  ==============
0       :class:`BucketedDDP` + a plain optimizer       ``16Ψ``                       ``2(N-1)/N·2Ψ``
1       :class:`ZeroOptimizer` (optimizer state)       ``4Ψ + 12Ψ/N``                same as DDP
2       :class:`ZeroOptimizer` (+ gradients)           ``2Ψ + 14Ψ/N``                same as DDP
3       :class:`FullyShardedDataParallel` (+ params)   ``16Ψ/N`` (FSDP2 layout)      ``1.5×`` DDP
======  =============================================  ============================  ==============

(``Ψ`` trained parameters, ``N`` ranks; the formulas live in :mod:`dtlab.memory.formulas`.)
Stage 3 holds the same 16Ψ/N as the paper but in FSDP2's layout: the fp32 shards are at once the
parameters and the master weights (4Ψ/N), gradients land as fp32 shards (4Ψ/N), and the optimizer
holds only Adam's moments (8Ψ/N); see :func:`dtlab.memory.formulas.fsdp2_state_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dtlab.collectives.stats import CommStats
from dtlab.memory import measure_model_state
from dtlab.parallel.data import BucketedDDP  # stage 0 is DDP: the data family's public surface
from dtlab.parallel.zero.fsdp import FullyShardedDataParallel
from dtlab.parallel.zero.optimizer import ZeroOptimizer
from dtlab.precision.mixed_precision import MixedPrecision


@dataclass
class ZeroStageSetup:
    """What a training loop needs: call ``forward``, step ``optimizer``, read ``comm_stats``."""

    stage: int
    model: nn.Module
    forward: nn.Module
    optimizer: object
    comm_stats: CommStats

    def held_by_category(self) -> dict[str, int]:
        """Bytes this rank holds now: parameters, gradients, optimizer state (and, for DDP,
        its gradient buckets as communication buffers), measured from the tensors."""
        if self.stage == 0:
            buckets = [bucket.buffer for bucket in self.forward.buckets]
            report = measure_model_state(self.model, self.optimizer, extra_buffers=buckets)
            return dict(report.by_category)
        if self.stage == 3:
            held = self.forward.held_bytes(self.optimizer)
        else:
            held = self.optimizer.held_bytes()
        return {
            "parameters": held["params"],
            "gradients": held["grads"],
            "optimizer_state": held["optimizer_state"],
        }


def shard_by_zero_stage(
    model: nn.Module,
    stage: int,
    optimizer_cls: type[torch.optim.Optimizer],
    *,
    mixed_precision: MixedPrecision | None = None,
    units: list[nn.Module] | None = None,
    collectives: str = "torch",
    **optimizer_kwargs,
) -> ZeroStageSetup:
    """Wrap ``model`` for ZeRO ``stage`` (0 = plain DDP) with an ``optimizer_cls`` over it.

    ``units`` are the ZeRO-3 gather units (default: one per ``nn.ModuleList`` element plus the
    root). Mixed precision (compute-dtype params and grads, fp32 master weights) needs stage ≥ 1.
    ``collectives="dtlab"`` runs every collective on dtlab's counted rings, so ``comm_stats``
    holds bytes counted from real messages (see :mod:`dtlab.comm`).
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage {stage!r} does not exist; choose 0 (DDP), 1, 2 or 3")
    if stage == 0:
        if mixed_precision is not None:
            raise ValueError(
                "mixed precision keeps fp32 master weights in the sharded optimizer; "
                "choose stage 1, 2 or 3, or train DDP in fp32"
            )
        forward = BucketedDDP(model, collectives=collectives)
        optimizer = optimizer_cls(model.parameters(), **optimizer_kwargs)
        return ZeroStageSetup(0, model, forward, optimizer, forward.comm_stats)
    if stage in (1, 2):
        optimizer = ZeroOptimizer(
            model.parameters(),
            optimizer_cls,
            stage=stage,
            mixed_precision=mixed_precision,
            collectives=collectives,
            **optimizer_kwargs,
        )
        if mixed_precision is not None:  # frozen weights and buffers compute in bf16 too
            model.to(mixed_precision.param_dtype)
        return ZeroStageSetup(stage, model, model, optimizer, optimizer.comm_stats)
    forward = FullyShardedDataParallel(
        model, units=units, mixed_precision=mixed_precision, collectives=collectives
    )
    optimizer = optimizer_cls(forward.parameters(), **optimizer_kwargs)
    return ZeroStageSetup(3, model, forward, optimizer, forward.comm_stats)
