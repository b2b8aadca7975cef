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

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class MixedPrecision:
    """Which dtype computes and communicates, and which dtype the optimizer keeps.

    The first four fields are torch FSDP2's ``MixedPrecisionPolicy``, in its order and with its
    defaults: **nothing is cast** unless asked (``MixedPrecision()`` trains in the parameters'
    own dtype). For bf16 compute say so: ``MixedPrecision(torch.bfloat16)``.

    * ``param_dtype``: the dtype forward and backward compute in and the all-gathers move
      (``None``: the parameters' own dtype, no cast);
    * ``reduce_dtype``: the dtype gradients are reduced in (``None``: ``param_dtype``, or the
      parameters' own dtype when that is ``None`` too; :attr:`gradient_dtype`);
    * ``output_dtype``: casts a unit's floating outputs (an fp32 norm inside a bf16 block hands
      bf16 back to the block); ``None``: no cast;
    * ``cast_forward_inputs``: casts a unit's floating inputs to ``param_dtype`` (nothing to do
      when ``param_dtype`` is ``None``).

    FSDP (:class:`~dtlab.parallel.FullyShardedDataParallel`) follows FSDP2: the sharded
    parameters keep their own dtype (fp32: they *are* the masters, made from the original
    weights), each all-gather casts the shard to ``param_dtype``, and gradients are
    reduce-scattered in ``reduce_dtype`` and land in the sharded parameter's dtype.

    ``master_dtype`` (keyword only) is dtlab's own, for ZeRO-1/2
    (:class:`~dtlab.parallel.ZeroOptimizer`), whose model is not sharded: the model's parameters
    become ``param_dtype`` views, gradients are reduce-scattered in that dtype, and the optimizer
    keeps ``master_dtype`` copies (the other three fields need a wrapped model; ZeRO-1/2 reads
    only ``param_dtype`` and ``master_dtype``). FSDP2 has no such field because its sharded
    parameters are the masters; FSDP here ignores it for the same reason. With
    ``param_dtype=None`` ZeRO-1/2 still keeps the copies (useful for a model that is already
    bf16; for an fp32 model they only repeat the weights: pass ``mixed_precision=None``).
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True
    master_dtype: torch.dtype = field(default=torch.float32, kw_only=True)

    def __post_init__(self) -> None:
        dtypes = (self.param_dtype, self.reduce_dtype, self.output_dtype, self.master_dtype)
        if any(d is not None and not d.is_floating_point for d in dtypes):
            raise ValueError("mixed precision dtypes must be floating point, e.g. torch.bfloat16")
        param_bits = torch.finfo(self.param_dtype).bits if self.param_dtype is not None else 0
        if torch.finfo(self.master_dtype).bits < param_bits:
            raise ValueError(
                f"master dtype {self.master_dtype} is narrower than compute dtype "
                f"{self.param_dtype}; masters exist to be *more* precise (use torch.float32)"
            )

    @property
    def gradient_dtype(self) -> torch.dtype | None:
        """The dtype gradients are reduced in (``None``: the parameters' own, as in FSDP2)."""
        return self.reduce_dtype or self.param_dtype


def compute_dtype(mixed_precision: MixedPrecision | None, fallback: torch.dtype) -> torch.dtype:
    """The dtype parameters compute in: the policy's ``param_dtype``, else ``fallback`` (their
    own dtype) when there is no policy or it casts nothing."""
    if mixed_precision is None or mixed_precision.param_dtype is None:
        return fallback
    return mixed_precision.param_dtype


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
