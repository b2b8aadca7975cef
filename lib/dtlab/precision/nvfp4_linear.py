"""NVFP4 training, simulated bit-exactly: the three parts of NVIDIA's recipe, each switchable.

"Pretraining Large Language Models with NVFP4" (NVIDIA, 2025) trains with every GEMM of the
linear layers in NVFP4 (:func:`~dtlab.precision.microscaling.nvfp4_quantize`: E2M1 values, an
E4M3 scale per 16 values, an fp32 tensor scale; 4.5 bits per value) and adds three things to
make 4 bits train. For ``y = x Wᵀ`` (``x``: M×K, ``W``: N×K, ``dy``: M×N):

=========  ====================================  =================================================
GEMM       operands (blocks along the reduction)  recipe
=========  ====================================  =================================================
forward    ``x`` 1×16, ``W``                     round to nearest
dgrad      ``dy`` 1×16, ``W`` (transposed)       ``dy`` **stochastically rounded**
wgrad      ``dyᵀ`` 1×16, ``xᵀ`` 1×16 (along M)   **random Hadamard transform** on both, ``dy`` SR
=========  ====================================  =================================================

* **2-D weight blocks** (``two_d_weights``): ``W`` is quantised in 16×16 blocks, which read the
  same in ``W`` and ``Wᵀ``, so dgrad multiplies by exactly the weight forward used. With 1×16
  blocks dgrad needs a second, column-wise quantisation of ``W`` (:mod:`dtlab.precision.
  directional`) and the backward pass differentiates a *different* function than forward ran
  (:func:`weight_mismatch` counts the elements that differ).
* **Random Hadamard transform** (``rht``): wgrad sums over tokens, where outliers live. Before
  quantising, every 16 consecutive tokens of ``x`` and ``dy`` are rotated by the same orthogonal
  ``Q = H₁₆ · diag(random signs) / 4``: ``dyᵀ x = (Qᵀdy)ᵀ (Qᵀx)`` exactly, while the rotation
  spreads a token's outlier over 16 tokens, so a block's scale no longer serves one value. It is
  not a free win: a lone spike is kept almost exactly by its own block's scale, and once rotated
  its energy sits in 16 values that each round. The paper applies RHT to wgrad only and reports
  its benefit at scale (a 12B model, 10T tokens); lab 08 measures wgrad's error with and without
  it on small tensors, where it does not lower the error.
* **Stochastic rounding** (``stochastic_rounding``) on gradients (``dy`` in dgrad and wgrad):
  round-to-nearest at 4 bits is biased for values that repeat (a gradient that is always 0.4 of
  a step rounds to 0 every time); SR is unbiased, so the error averages out over steps.
  Forward tensors (``x``, ``W``) round to nearest, as the paper does.

The paper also keeps a few layers (the last ones) in BF16; here the LM head stays out
(:func:`convert_to_nvfp4`'s ``skip``). The GEMMs are simulated: dequantised NVFP4 values
multiplied in fp32 (exact products of exact NVFP4 numbers; the accumulation order is fp32's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dtlab.precision.microscaling import NVFP4_BLOCK, nvfp4_quantize

RHT_SIZE = 16


@dataclass(frozen=True)
class Nvfp4Recipe:
    """Which parts of NVIDIA's NVFP4 recipe are on (module docstring); ``seed`` seeds the
    Hadamard signs and the stochastic-rounding bits."""

    two_d_weights: bool = True
    rht: bool = True
    stochastic_rounding: bool = True
    seed: int = 0


NVFP4_RECIPE = Nvfp4Recipe()
NVFP4_NAIVE = Nvfp4Recipe(two_d_weights=False, rht=False, stochastic_rounding=False)


def sylvester_hadamard(size: int = RHT_SIZE) -> torch.Tensor:
    """The ``size``×``size`` Hadamard matrix (±1 entries, Sylvester's construction)."""
    if size < 1 or size & (size - 1):
        raise ValueError(f"a Sylvester Hadamard matrix has a power-of-two size, not {size}")
    h = torch.ones(1, 1)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def random_hadamard(seed: int, size: int = RHT_SIZE) -> torch.Tensor:
    """``Q = H · diag(s) / √size`` with random signs ``s``: orthogonal, ``QᵀQ = I``."""
    signs = torch.randint(0, 2, (size,), generator=torch.Generator().manual_seed(seed)) * 2 - 1
    return sylvester_hadamard(size) * signs.float() / size**0.5


def rotate_tokens(t: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``Qᵀ`` applied to every group of ``len(q)`` consecutive rows (tokens) of ``t`` (M×C)."""
    m, c = t.shape
    n = q.shape[0]
    if m % n:
        raise ValueError(f"{m} tokens do not split into Hadamard groups of {n}; pad to a multiple")
    return (q.t() @ t.reshape(m // n, n, c)).reshape(m, c)


def _weight_blocks(recipe: Nvfp4Recipe) -> tuple[int, int]:
    return (NVFP4_BLOCK, NVFP4_BLOCK) if recipe.two_d_weights else (1, NVFP4_BLOCK)


def dgrad_weight(weight: torch.Tensor, recipe: Nvfp4Recipe) -> torch.Tensor:
    """The N×K weight dgrad multiplies by: forward's own 16×16-block copy (2-D), or a second,
    column-wise 1×16 quantisation along N (1-D)."""
    if recipe.two_d_weights:
        return nvfp4_quantize(weight, _weight_blocks(recipe)).dequantize()
    return nvfp4_quantize(weight.t().contiguous(), (1, NVFP4_BLOCK)).dequantize().t()


def weight_mismatch(weight: torch.Tensor, recipe: Nvfp4Recipe) -> float:
    """Fraction of weight elements whose value in dgrad differs from the one forward used."""
    forward = nvfp4_quantize(weight, _weight_blocks(recipe)).dequantize()
    return float((forward != dgrad_weight(weight, recipe)).float().mean())


def wgrad(
    x: torch.Tensor, dy: torch.Tensor, recipe: Nvfp4Recipe, generator: torch.Generator
) -> torch.Tensor:
    """``dW = dyᵀ x`` from NVFP4 operands quantised along the tokens, as the recipe says."""
    if recipe.rht:
        q = random_hadamard(recipe.seed).to(x.device)
        x, dy = rotate_tokens(x, q), rotate_tokens(dy, q)
    xq = nvfp4_quantize(x.t().contiguous(), (1, NVFP4_BLOCK)).dequantize()
    dyq = nvfp4_quantize(
        dy.t().contiguous(), (1, NVFP4_BLOCK), recipe.stochastic_rounding, generator
    ).dequantize()
    return dyq @ xq.t()


class _Nvfp4Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight, layer):
        recipe = layer.recipe
        xq = nvfp4_quantize(x2d, (1, NVFP4_BLOCK)).dequantize()
        wq = nvfp4_quantize(weight, _weight_blocks(recipe)).dequantize()
        ctx.save_for_backward(x2d, weight, wq)
        ctx.layer = layer
        return (xq @ wq.t()).to(x2d.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        x2d, weight, wq = ctx.saved_tensors
        layer = ctx.layer
        recipe = layer.recipe
        dy = grad_out.float()
        dyq = nvfp4_quantize(
            dy, (1, NVFP4_BLOCK), recipe.stochastic_rounding, layer.generator
        ).dequantize()
        w_dgrad = wq if recipe.two_d_weights else dgrad_weight(weight, recipe)
        grad_x = (dyq @ w_dgrad).to(x2d.dtype)
        grad_w = wgrad(x2d.float(), dy, recipe, layer.generator).to(weight.dtype)
        return grad_x, grad_w, None


class Nvfp4Linear(nn.Linear):
    """``nn.Linear`` whose three GEMMs take NVFP4 operands by :class:`Nvfp4Recipe`; the
    parameters stay in their own dtype (FP32 masters)."""

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: Nvfp4Recipe) -> Nvfp4Linear:
        """An NVFP4 layer sharing ``linear``'s parameters."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.weight, layer.bias = linear.weight, linear.bias
        layer.recipe = recipe
        layer.generator = torch.Generator().manual_seed(recipe.seed)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _Nvfp4Matmul.apply(x.reshape(-1, x.shape[-1]), self.weight, self)
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out + self.bias.to(out.dtype) if self.bias is not None else out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe}"


def convert_to_nvfp4(model: nn.Module, recipe: Nvfp4Recipe, skip=("lm_head",)) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (except names containing one of ``skip``) by an
    :class:`Nvfp4Linear` sharing its parameters; each layer's random bits get their own seed.
    In place; returns ``model``."""
    index = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and not any(s in full for s in skip):
                layer_recipe = Nvfp4Recipe(
                    recipe.two_d_weights,
                    recipe.rht,
                    recipe.stochastic_rounding,
                    recipe.seed + index,
                )
                setattr(module, child_name, Nvfp4Linear.from_linear(child, layer_recipe))
                index += 1
    return model
