"""An FP8 linear layer: E4M3 inputs and weights forward, E5M2 output gradients backward.

The recipe of Micikevicius et al. ("FP8 Formats for Deep Learning", 2022) and Transformer
Engine: forward tensors need precision (E4M3, 3 mantissa bits), gradients need range (E5M2,
max 57,344). What is quantised where, for ``y = x Wᵀ``:

=========  ===============================  =========================  ===================
GEMM       inputs                           formats                    scale granularity
=========  ===============================  =========================  ===================
forward    ``x`` (M×K), ``W`` (N×K)         E4M3 × E4M3                activation, weight
dgrad      ``dy`` (M×N), ``W``              E5M2 × E4M3 (saved W)      activation, weight
wgrad      ``dyᵀ``, ``x``                   E5M2 × E4M3 (saved x)      activation, activation
=========  ===============================  =========================  ===================

Backward reuses the FP8 ``x`` and ``W`` saved by forward: 1 byte per saved element, not 2.

**Which GEMM ran.** ``torch._scaled_mm`` multiplies FP8 matrices with per-tensor scales (and,
in recent builds, per-row); whether this build also takes a block layout is *probed*: the first
time a (device, granularity) pair is seen, one small ``_scaled_mm`` call runs and its result is
compared with the simulation; only if it runs and agrees is it used. Otherwise the GEMM is a
faithful **simulation** — the same FP8 values (real torch FP8 casts, saturated), dequantised and
multiplied in fp32. Every call is counted in :data:`GEMM_PATHS` (``"forward:scaled_mm"``,
``"wgrad:simulated"``, …) so a lab or bench says which one it timed. On a CPU ``_scaled_mm``
is a reference kernel: its time is not an FP8 speed-up.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

from dtlab.precision.fp8 import (
    ACTIVATION_TILE,
    WEIGHT_TILE,
    AmaxHistory,
    Quantized,
    quantize_fp8,
)

GEMM_PATHS: Counter[str] = Counter()
_SUPPORT: dict[tuple, bool] = {}


@dataclass(frozen=True)
class Fp8Recipe:
    """Scale granularity per tensor role; ``"delayed"`` scaling keeps an amax history (per
    tensor granularity only)."""

    granularity: str = "tensor"  # "tensor", "row" or "tile"
    scaling: str = "current"  # or "delayed"
    history: int = 16
    use_scaled_mm: bool = True

    def __post_init__(self) -> None:
        if self.granularity not in ("tensor", "row", "tile"):
            raise ValueError(f"granularity {self.granularity!r}: choose tensor, row or tile")
        if self.scaling not in ("current", "delayed"):
            raise ValueError(f"scaling {self.scaling!r}: choose 'current' or 'delayed'")
        if self.scaling == "delayed" and self.granularity != "tensor":
            raise ValueError("delayed scaling keeps one amax per tensor: use granularity='tensor'")

    def blocks(self) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        """(activation block, weight block) for :func:`quantize_fp8`."""
        return (ACTIVATION_TILE, WEIGHT_TILE) if self.granularity == "tile" else (None, None)


PER_TENSOR = Fp8Recipe("tensor")
PER_ROW = Fp8Recipe("row")
PER_TILE = Fp8Recipe("tile")


def _simulated(a: Quantized, b: Quantized, out_dtype: torch.dtype) -> torch.Tensor:
    return (a.dequantize() @ b.dequantize().t()).to(out_dtype)


def _scaled_mm(a: Quantized, b: Quantized, out_dtype: torch.dtype) -> torch.Tensor:
    """``a @ bᵀ`` on FP8 data; ``b`` is N×K row-major, so ``b.data.t()`` is column-major."""
    return torch._scaled_mm(
        a.data.contiguous(),
        b.data.contiguous().t(),
        scale_a=a.scales.contiguous(),
        scale_b=b.scales.t().contiguous(),
        out_dtype=out_dtype,
    )


def scaled_mm_runs(a: Quantized, b: Quantized, out_dtype: torch.dtype) -> bool:
    """Whether this build's ``torch._scaled_mm`` takes these operands' layout *and* agrees with
    the simulation (probed once per device, formats and scale layout)."""
    if not hasattr(torch, "_scaled_mm") or any(
        d % 16 for d in (*a.data.shape, b.data.shape[0])
    ):  # FP8 GEMM kernels want every dimension a multiple of 16
        return False
    key = (a.data.device.type, a.fmt, b.fmt, _scale_layout(a), _scale_layout(b), out_dtype)
    if key not in _SUPPORT:
        try:
            got = _scaled_mm(a, b, out_dtype).float()
            want = _simulated(a, b, torch.float32)
            tolerance = 1e-2 if out_dtype != torch.float32 else 1e-4
            _SUPPORT[key] = bool((got - want).norm() <= tolerance * want.norm() + 1e-6)
        except (RuntimeError, ValueError, NotImplementedError, TypeError):
            _SUPPORT[key] = False
    return _SUPPORT[key]


def _scale_layout(q: Quantized) -> str:
    """ "tensor" (one scale), "row" (one per row) or the block shape the scales serve."""
    rows = q.data.numel() // q.data.shape[-1]
    if q.scales.numel() == 1:
        return "tensor"
    if tuple(q.scales.shape) == (rows, 1):
        return "row"
    return f"block {q.block}"


def fp8_gemm(
    a: Quantized, b: Quantized, out_dtype: torch.dtype, role: str, use_scaled_mm: bool = True
) -> torch.Tensor:
    """``a @ bᵀ`` from FP8 operands, on ``_scaled_mm`` where it runs, else simulated; counted."""
    if use_scaled_mm and scaled_mm_runs(a, b, out_dtype):
        GEMM_PATHS[f"{role}:scaled_mm"] += 1
        return _scaled_mm(a, b, out_dtype)
    GEMM_PATHS[f"{role}:simulated"] += 1
    return _simulated(a, b, out_dtype)


class _Fp8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight, layer):
        act_block, weight_block = layer.recipe.blocks()
        gran = layer.recipe.granularity
        xq = layer.quantize("x", x2d, "e4m3", gran, act_block)
        wq = layer.quantize("w", weight, "e4m3", gran, weight_block)
        ctx.save_for_backward(xq.data, wq.data, xq.scales, wq.scales)
        ctx.meta = (xq.block, wq.block, layer, x2d.dtype)
        return fp8_gemm(xq, wq, x2d.dtype, "forward", layer.recipe.use_scaled_mm)

    @staticmethod
    def backward(ctx, grad_out):
        x_data, w_data, x_scales, w_scales = ctx.saved_tensors
        x_block, w_block, layer, dtype = ctx.meta
        xq = Quantized(x_data, x_scales, x_block, "e4m3", 0)
        wq = Quantized(w_data, w_scales, w_block, "e4m3", 0)
        act_block, _ = layer.recipe.blocks()
        gran = layer.recipe.granularity
        use = layer.recipe.use_scaled_mm
        dyq = layer.quantize("dy", grad_out, "e5m2", gran, act_block)
        # dgrad contracts over N: W's scales must run along K, so W is used transposed.
        w_t = _transposed(wq)
        grad_x = fp8_gemm(dyq, w_t, dtype, "dgrad", use and layer.recipe.granularity == "tensor")
        # wgrad contracts over M (tokens): both operands transposed.
        dyq_t, xq_t = _transposed(dyq), _transposed(xq)
        grad_w = fp8_gemm(dyq_t, xq_t, dtype, "wgrad", use and layer.recipe.granularity == "tensor")
        return grad_x, grad_w.to(layer.weight.dtype), None


def _transposed(q: Quantized) -> Quantized:
    """The same FP8 values and scales, as the transposed matrix (blocks transposed too)."""
    rows = q.data.numel() // q.data.shape[-1]
    data = q.data.reshape(rows, -1).t()
    return Quantized(data, q.scales.t(), (q.block[1], q.block[0]), q.fmt, q.saturated)


class Fp8Linear(nn.Linear):
    """``nn.Linear`` whose GEMMs take FP8 operands (module docstring). The parameters stay in
    their own dtype (fp32 masters); only the GEMM inputs are quantised, on the fly."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        recipe: Fp8Recipe = PER_TENSOR,
        **kw,
    ) -> None:
        super().__init__(in_features, out_features, bias, **kw)
        self.recipe = recipe
        self.histories: dict[str, AmaxHistory] = {}
        self.saturated: Counter[str] = Counter()

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: Fp8Recipe) -> Fp8Linear:
        """An FP8 layer sharing ``linear``'s parameters."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.weight, layer.bias = linear.weight, linear.bias
        layer.recipe, layer.histories, layer.saturated = recipe, {}, Counter()
        return layer

    def quantize(self, role: str, t: torch.Tensor, fmt: str, granularity: str, block) -> Quantized:
        """Quantise ``t`` (role "x", "w" or "dy") by the recipe; count saturated values."""
        if self.recipe.scaling == "delayed":
            history = self.histories.setdefault(role, AmaxHistory(self.recipe.history))
            q = history.quantize(t, fmt)
        else:
            q = quantize_fp8(t, fmt, granularity, block)
        self.saturated[role] += q.saturated
        return q

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _Fp8Matmul.apply(x.reshape(-1, x.shape[-1]), self.weight, self)
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out + self.bias.to(out.dtype) if self.bias is not None else out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe}"


def convert_to_fp8(model: nn.Module, recipe: Fp8Recipe, skip=("lm_head",)) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (except names containing one of ``skip``: the
    output head stays in high precision, as in DeepSeek-V3) by an :class:`Fp8Linear` sharing its
    parameters. In place; returns ``model``."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and not any(s in full for s in skip):
                setattr(module, child_name, Fp8Linear.from_linear(child, recipe))
    return model
