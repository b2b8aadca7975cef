"""Alternatives to FP32 master weights: stochastic rounding and Kahan summation, kept in BF16.

A BF16 weight ``w`` cannot absorb an update smaller than half its spacing (2⁻⁸·|w| up to a factor
of two): round-to-nearest returns ``w`` and the update is lost. Three ways to keep it:

=================  =========================================================  =====================
mode               what is kept, how an update ``u`` lands                    weight bytes / param
=================  =========================================================  =====================
``fp32_master``    an FP32 master steps (``m += u``); the BF16 copy that      2 + 4 = 6
                   computes is re-rounded from it (Micikevicius et al. 2018)
``kahan``          the BF16 weight plus a BF16 compensation buffer holding    2 + 2 = 4
                   the rounding error of each addition (Kahan 1965;
                   Zamirai et al. 2020, "Revisiting BFloat16 Training")
``stochastic``     the BF16 weight only, rounded up or down at random with    2
                   probability proportional to distance, so E[w'] = w + u
                   (Gupta et al. 2015; NVFP4's gradient path, NVIDIA 2025)
``bf16``           the BF16 weight only, round to nearest: the counter-       2
                   example that stalls
=================  =========================================================  =====================

Memory, stated carefully: Kahan's 4 B per parameter equals the FP32 master's own 4 B, but mixed
precision also keeps the BF16 copy the forward reads, so masters cost 6 B of weight state against
Kahan's 4 (FSDP2 with a BF16 ``param_dtype`` keeps only the 4 B FP32 shard and casts a transient
BF16 copy per all-gather, so there the two tie, and Kahan saves that cast). Optimizer moments
come on top in every mode. Kahan's two BF16 numbers carry about 16 significant bits, not FP32's
24: it tracks the master closely, not exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

UPDATE_MODES = ("fp32_master", "kahan", "stochastic", "bf16")
_WEIGHT_BYTES = {"fp32_master": 2 + 4, "kahan": 2 + 2, "stochastic": 2, "bf16": 2}
_DROPPED_BITS = 16  # fp32 keeps 23 mantissa bits, bf16 7: the low 16 bits of the pattern go


def weight_bytes_per_parameter(mode: str) -> int:
    """Persistent weight-state bytes per parameter in ``mode`` (moments not counted).

    ``fp32_master`` counts the BF16 working copy (2) and the FP32 master (4); ``kahan`` the BF16
    weight and its BF16 compensation; ``stochastic`` and ``bf16`` the BF16 weight alone.
    """
    if mode not in _WEIGHT_BYTES:
        raise ValueError(f"unknown update mode {mode!r}; choose one of {UPDATE_MODES}")
    return _WEIGHT_BYTES[mode]


def stochastic_round_to_bf16(x: torch.Tensor, generator: torch.Generator | None = None):
    """Round fp32 ``x`` to BF16, up or down at random with probability proportional to distance.

    Bit-exact construction: BF16 is FP32 with the low 16 bits of the pattern cut off, so add a
    uniform random integer in ``[0, 2¹⁶)`` to the FP32 bit pattern and truncate those 16 bits. The
    carry into bit 16 happens with probability ``(x - lo) / (hi - lo)``, where ``lo`` and ``hi``
    are the BF16 neighbours around ``x`` (``lo`` nearer zero), so ``E[round(x)] = x``. Signs take
    care of themselves: the pattern is sign-magnitude, the random bits grow the magnitude, and
    truncation shrinks it, identically for ``-x``. Zeros and exact BF16 values stay put (their
    low bits are 0 and the added bits never carry). Values between BF16's largest finite and
    FP32's may round up to ``inf``, with that probability; ``inf`` and NaN pass through.
    """
    if x.dtype != torch.float32:
        raise TypeError(
            f"stochastic_round_to_bf16 takes fp32 values, got {x.dtype}; pass x.float()"
        )
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(
        0, 1 << _DROPPED_BITS, x.shape, generator=generator, dtype=torch.int32, device=x.device
    )
    truncated = (bits + noise) & ~((1 << _DROPPED_BITS) - 1)
    rounded = truncated.view(torch.float32)
    return torch.where(torch.isfinite(x), rounded, x).to(torch.bfloat16)


def round_up_probability(x: float) -> float:
    """The probability that :func:`stochastic_round_to_bf16` rounds ``x`` away from zero.

    ``(|x| - lo) / spacing`` with ``lo`` the BF16 value at or below ``|x|``: computed from the
    bit pattern, so it is exactly the fraction of the 2¹⁶ random values that carry.
    """
    bits = torch.tensor([abs(x)], dtype=torch.float32).view(torch.int32).item()
    return (bits & ((1 << _DROPPED_BITS) - 1)) / (1 << _DROPPED_BITS)


def kahan_add_(param: torch.Tensor, compensation: torch.Tensor, update: torch.Tensor) -> None:
    """``param += update`` in BF16 without losing what rounds away: Kahan-compensated summation.

    ``compensation`` (BF16, same shape, zeros at the start) holds the part of past updates the
    BF16 weight could not absorb. Each call, as the ``optimi`` optimizers do it:

    1. ``c ← c + u`` (the pending amount; BF16 has the precision for a small ``c``);
    2. ``w' ← round(w + c)``: the weight moves by whole BF16 spacings once ``c`` reaches half one;
    3. ``c ← c - (w' - w)``: what the weight took is removed; ``w' - w`` is exact in FP32.

    Each step computes in FP32 and rounds to nearest into BF16, as BF16 CPU and GPU kernels do.
    The pair ``w + c`` carries about 16 significant bits, so it tracks an FP32 sum closely but
    not exactly. In place on both tensors.
    """
    if param.dtype != torch.bfloat16 or compensation.dtype != torch.bfloat16:
        raise TypeError(
            f"kahan_add_ keeps param and compensation in bf16, got {param.dtype} and "
            f"{compensation.dtype}; create compensation with torch.zeros_like(param)"
        )
    pending = (compensation.float() + update.float()).to(torch.bfloat16)
    old = param.float()
    param.copy_((old + pending.float()).to(torch.bfloat16))
    compensation.copy_((pending.float() - (param.float() - old)).to(torch.bfloat16))


@dataclass
class BF16Updater:
    """SGD-style updates ``p ← p - lr·g`` applied in one of :data:`UPDATE_MODES`.

    ``weight`` is the BF16 tensor the model computes with; ``master`` (``fp32_master``) and
    ``compensation`` (``kahan``) are the extra state the mode keeps.
    """

    mode: str
    weight: torch.Tensor
    master: torch.Tensor | None = None
    compensation: torch.Tensor | None = None
    generator: torch.Generator | None = field(default=None, repr=False)

    @classmethod
    def start(cls, initial: torch.Tensor, mode: str, seed: int = 0) -> BF16Updater:
        """A BF16 weight rounded from ``initial``, with the state ``mode`` needs."""
        weight_bytes_per_parameter(mode)  # validates the name
        weight = initial.to(torch.bfloat16)
        updater = cls(mode, weight)
        if mode == "fp32_master":
            updater.master = weight.float()
        elif mode == "kahan":
            updater.compensation = torch.zeros_like(weight)
        elif mode == "stochastic":
            updater.generator = torch.Generator().manual_seed(seed)
        return updater

    def step(self, grad: torch.Tensor, lr: float) -> None:
        """Apply ``-lr·grad``; the update is formed in FP32."""
        update = -lr * grad.float()
        if self.mode == "fp32_master":
            self.master += update
            self.weight = self.master.to(torch.bfloat16)
        elif self.mode == "kahan":
            kahan_add_(self.weight, self.compensation, update)
        elif self.mode == "stochastic":
            self.weight = stochastic_round_to_bf16(self.weight.float() + update, self.generator)
        else:
            self.weight = (self.weight.float() + update).to(torch.bfloat16)

    def value(self) -> torch.Tensor:
        """The weight as FP32: the master itself for ``fp32_master``, else the BF16 weight."""
        return self.master.clone() if self.mode == "fp32_master" else self.weight.float()


@dataclass
class UpdatesLostRun:
    """Trajectories of :func:`updates_lost_demo`: RMS distance from the FP32 master per step."""

    lr: float
    steps: int
    master_travel: list[float]  # RMS distance the master has moved from the start
    distance: dict[str, list[float]]  # mode → RMS distance from the master, per step

    def final(self, mode: str) -> float:
        """The last step's RMS distance of ``mode`` from the FP32 master."""
        return self.distance[mode][-1]


def updates_lost_demo(
    steps: int = 400, lr: float = 1e-5, n: int = 4096, seed: int = 0, scale: float = 0.02
) -> UpdatesLostRun:
    """The updates-lost setting of lab 08, reduced to one tensor, in every mode of this module.

    Weights and a target drawn at the lab GPT's init scale (``scale`` = 0.02); SGD on the L1 loss
    ``Σ|w - target|``, whose gradient is ``sign(w - target)``, so every step moves a weight by
    exactly ``lr`` — the size of the Adam steps in lab 08 — and at ``lr = 1e-5`` that is below
    half the BF16 spacing of most weights (half of 2⁻¹³ ≈ 6·10⁻⁵ at |w| ≈ 0.02). Each mode computes
    its gradient at its own BF16 weight (the master's at its BF16 copy), and after every step
    reports the RMS distance of its weight (the master itself for ``fp32_master``) from the master.
    """
    gen = torch.Generator().manual_seed(seed)
    start = (scale * torch.randn(n, generator=gen)).to(torch.bfloat16).float()
    target = scale * torch.randn(n, generator=gen)
    runs = {mode: BF16Updater.start(start, mode, seed=seed + 1) for mode in UPDATE_MODES}
    travel, distance = [], {mode: [] for mode in UPDATE_MODES if mode != "fp32_master"}
    for _ in range(steps):
        for run in runs.values():
            run.step(torch.sign(run.weight.float() - target), lr)
        master = runs["fp32_master"].value()
        travel.append(float((master - start).pow(2).mean().sqrt()))
        for mode in distance:
            distance[mode].append(float((runs[mode].value() - master).pow(2).mean().sqrt()))
    return UpdatesLostRun(lr, steps, travel, distance)
