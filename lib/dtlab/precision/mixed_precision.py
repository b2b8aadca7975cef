"""Mixed precision inside ZeRO/FSDP: compute in a low-precision dtype, keep fp32 masters.

The recipe of Micikevicius et al. ("Mixed Precision Training", ICLR 2018) as ZeRO accounts for
it (Rajbhandari et al., SC 2020, §3): per parameter, 2 bytes of bf16 parameter (what forward and
backward compute with and what all-gathers move), 2 bytes of bf16 gradient (what backward
produces and reduce-scatters move), and K = 12 bytes of optimizer state in fp32 — the master
weight (4), Adam's first moment (4) and second moment (4). That is the "2 + 2 + 12 = 16Ψ" that
ZeRO shards:

=========  ===============================  ============
stage      bytes per rank                   N = 4
=========  ===============================  ============
DDP        2Ψ + 2Ψ + 12Ψ                    16Ψ
ZeRO-1     2Ψ + 2Ψ + 12Ψ/N                  7Ψ
ZeRO-2     2Ψ + (2Ψ + 12Ψ)/N                5.5Ψ
ZeRO-3     (2Ψ + 2Ψ + 12Ψ)/N                4Ψ
=========  ===============================  ============

At the optimizer step each rank upcasts its bf16 gradient shard to an fp32 gradient shard
(transient, Ψ/N elements), steps its fp32 master shard, and rounds the result back into the bf16
parameters. Small updates survive because they accumulate in fp32 (a bf16 weight of 1.0 cannot
represent 1.0 + 2**-9).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MixedPrecision:
    """Which dtype computes and communicates, and which dtype the optimizer keeps.

    ZeRO-1/2 (:class:`~dtlab.parallel.ZeroOptimizer`) use ``param_dtype`` for the model and keep
    ``master_dtype`` copies in the optimizer. FSDP (:class:`~dtlab.parallel.FullyShardedDataParallel`)
    follows torch FSDP2's ``MixedPrecisionPolicy``: the sharded parameters keep their own dtype
    (fp32: they *are* the masters, made from the original weights), each all-gather casts the shard
    to ``param_dtype``, gradients are reduce-scattered in ``reduce_dtype`` (default: ``param_dtype``)
    and land in the sharded parameter's dtype. ``cast_forward_inputs`` casts a unit's floating
    inputs to ``param_dtype``; ``output_dtype`` casts its floating outputs (an fp32 norm inside a
    bf16 block hands bf16 back to the block).
    """

    param_dtype: torch.dtype = torch.bfloat16
    master_dtype: torch.dtype = torch.float32
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True

    def __post_init__(self) -> None:
        if not self.param_dtype.is_floating_point or not self.master_dtype.is_floating_point:
            raise ValueError("mixed precision dtypes must be floating point, e.g. torch.bfloat16")
        if torch.finfo(self.master_dtype).bits < torch.finfo(self.param_dtype).bits:
            raise ValueError(
                f"master dtype {self.master_dtype} is narrower than compute dtype "
                f"{self.param_dtype}; masters exist to be *more* precise (use torch.float32)"
            )

    @property
    def gradient_dtype(self) -> torch.dtype:
        """The dtype gradients are reduced in."""
        return self.reduce_dtype or self.param_dtype


def compute_dtype(mixed_precision: MixedPrecision | None, fallback: torch.dtype) -> torch.dtype:
    return mixed_precision.param_dtype if mixed_precision is not None else fallback


def norms_in_fp32(policy: MixedPrecision, norm_types: tuple[type, ...] = (torch.nn.LayerNorm,)):
    """A per-module policy for FSDP: ``policy`` everywhere, but norms compute in fp32.

    Normalisation layers divide by a variance computed from the activations; in bf16 that sum
    loses digits, so recipes often keep them in fp32. Pass the result as ``mixed_precision=`` to
    :class:`~dtlab.parallel.FullyShardedDataParallel` and list the norms among its units.
    """
    fp32 = MixedPrecision(
        param_dtype=torch.float32, reduce_dtype=torch.float32, output_dtype=policy.param_dtype
    )
    return lambda module: fp32 if isinstance(module, norm_types) else policy
