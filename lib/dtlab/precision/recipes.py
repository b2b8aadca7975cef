"""Train the lab GPT under one precision recipe, written out step by step, and record what broke.

=================  ===============================================================================
recipe             what computes, what the optimizer steps
=================  ===============================================================================
``fp32``           everything fp32 (the reference)
``bf16_master``    a bf16 working copy computes; its bf16 gradients are accumulated into fp32
                   ``.grad`` of fp32 **master** weights; AdamW steps the masters; the working
                   copy is re-rounded from them (Micikevicius et al. 2018)
``bf16_pure``      the bf16 model *is* the optimizer's parameters: an update smaller than half
                   the bf16 spacing of its weight (2⁻⁸ relative) is rounded away — the counter-
                   example
``fp16_scaled``    as ``bf16_master`` in fp16, with :class:`~dtlab.precision.DynamicLossScaler`
``fp16_unscaled``  the same without loss scaling: small gradients flush to zero
``fp8_tensor``     fp32 masters, every block Linear an :class:`Fp8Linear` with per-tensor scales
``fp8_tile``       the same with 1×128 activation / 128×128 weight tiles (DeepSeek-V3)
``nvfp4``          fp32 masters, every block Linear an :class:`~dtlab.precision.nvfp4_linear.
                   Nvfp4Linear` (NVIDIA's recipe by default; pass ``nvfp4=`` to switch parts off)
=================  ===============================================================================

``massive_activation=F`` plants an outlier the way LLMs grow them (Sun et al., "Massive
Activations in Large Language Models", 2024): token 0's input to every block Linear is
multiplied by ``F`` and its output divided by ``F``. ``F`` is a power of two, so in fp32 the
model computes the same function; only a quantiser that lets token 0 set everyone's scale
notices.

Measured along the way: ``lost_update_fraction`` (elements whose stepped value equals the old
one although their gradient was nonzero — read from the tensors) and, for fp16, the
``underflow_fraction`` of the first step's gradient (nonzero in an fp32 backward at the same
weights, zero in the fp16 one).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
from dtlab.precision.fp8_linear import PER_TENSOR, PER_TILE, Fp8Recipe, convert_to_fp8
from dtlab.precision.loss_scaler import DynamicLossScaler, ScalerConfig
from dtlab.precision.nvfp4_linear import NVFP4_RECIPE, Nvfp4Recipe, convert_to_nvfp4

TRAINING_RECIPES = (
    "fp32",
    "bf16_master",
    "bf16_pure",
    "fp16_scaled",
    "fp16_unscaled",
    "fp8_tensor",
    "fp8_tile",
    "nvfp4",
)
_WORKING_DTYPE = {"bf16_master": torch.bfloat16, "fp16_scaled": torch.float16}
_WORKING_DTYPE["fp16_unscaled"] = torch.float16


@dataclass
class RecipeRun:
    """What one training run produced."""

    recipe: str
    losses: list[float] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    lost_update_fraction: float = 0.0
    underflow_fraction: float = 0.0

    @property
    def final_loss(self) -> float:
        """Mean of the last quarter of the losses (one step is noisy)."""
        tail = self.losses[-max(1, len(self.losses) // 4) :]
        return sum(tail) / len(tail)


def plant_massive_activation(model: nn.Module, factor: float) -> list:
    """Scale token 0's input to every block Linear by ``factor`` and its output back (see the
    module docstring). Returns the hook handles."""
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and "lm_head" not in name:

            def pre(m, args):
                x = args[0].clone()
                x[..., 0, :] *= factor
                return (x,)

            def post(m, args, out):
                out = out.clone()
                bias = m.bias if m.bias is not None else 0.0
                out[..., 0, :] = (out[..., 0, :] - bias) / factor + bias
                return out

            handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    return handles


def _count_lost(before: list[torch.Tensor], params: list[nn.Parameter], moved: list) -> tuple:
    lost = total = 0
    for old, p, update in zip(before, params, moved, strict=True):
        nonzero = update != 0
        lost += int(((p.detach() == old) & nonzero).sum())
        total += int(nonzero.sum())
    return lost, total


@contextmanager
def fp32_denormals_flushed(enabled: bool = True):
    """Run the block with the CPU's flush-to-zero / denormals-are-zero flags set, then clear them.

    Why FP16 runs want it on a CPU: torch converts FP16 to FP32 for every CPU op, and its
    vectorised conversion of an FP16 *subnormal* (exactly what an unscaled FP16 backward is full
    of) passes through FP32 denormal intermediates, which x86 handles in microcode, about 1000×
    slower. The flags change no value here: the converted numbers are normal FP32 (the smallest
    FP16 subnormal, 2^-24, is far above FP32's denormals, < 2^-126), and
    ``tests/test_precision_recipes.py`` holds an FP16 run's losses bit-identical with and without
    them. torch has no getter for the flags, so they are cleared afterwards (their default)."""
    if not enabled:
        yield
        return
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def train_recipe(
    recipe: str,
    steps: int = 30,
    config: GPTConfig | None = None,
    batch_size: int = 8,
    lr: float = 3e-3,
    seed: int = 0,
    massive_activation: float | None = None,
    scaler_config: ScalerConfig | None = None,
    fp8: Fp8Recipe | None = None,
    accumulation: int = 1,
    flush_denormals: bool = True,
    nvfp4: Nvfp4Recipe | None = None,
) -> RecipeRun:
    """Train ``GPT(config, seed)`` for ``steps`` AdamW steps under ``recipe`` (module doc).

    ``accumulation=k`` divides each batch's loss by ``k``, as a loop accumulating ``k``
    micro-batches does: every gradient is ``k`` times smaller, which is where FP16 underflow
    bites. (Each step still uses one micro-batch, so the runs stay seconds long.) FP16 recipes
    run under :func:`fp32_denormals_flushed` unless ``flush_denormals=False`` (same values,
    faster on a CPU)."""
    if recipe not in TRAINING_RECIPES:
        raise ValueError(f"no recipe {recipe!r}; choose one of {TRAINING_RECIPES}")
    with fp32_denormals_flushed(flush_denormals and recipe.startswith("fp16")):
        return _train(
            recipe, steps, config, batch_size, lr, seed, massive_activation, scaler_config, fp8,
            accumulation, nvfp4,
        )  # fmt: skip


def _train(
    recipe, steps, config, batch_size, lr, seed, massive_activation, scaler_config, fp8,
    accumulation, nvfp4,
) -> RecipeRun:  # fmt: skip
    config = config or GPTConfig.tiny()
    data = SyntheticTokens(config, steps, batch_size, seed=seed)
    master = GPT(config, seed=seed)
    run = RecipeRun(recipe)
    if recipe.startswith("fp8"):
        convert_to_fp8(master, fp8 or (PER_TENSOR if recipe == "fp8_tensor" else PER_TILE))
    if recipe == "nvfp4":
        convert_to_nvfp4(master, nvfp4 or NVFP4_RECIPE)
    working = master
    if recipe == "bf16_pure":
        working = master.to(torch.bfloat16)
    elif recipe in _WORKING_DTYPE:
        working = copy.deepcopy(master).to(_WORKING_DTYPE[recipe])
    for model in {id(master): master, id(working): working}.values():
        if massive_activation is not None:
            plant_massive_activation(model, massive_activation)
    opt = torch.optim.AdamW(master.parameters(), lr=lr, weight_decay=0.0)
    scaler = DynamicLossScaler(scaler_config or ScalerConfig(), enabled=recipe == "fp16_scaled")
    masters, workers = list(master.parameters()), list(working.parameters())
    lost = total = 0
    for step, (x, y) in enumerate(data):
        loss = loss_fn(working(x).float(), y)
        run.losses.append(loss.item())
        loss = loss / accumulation
        run.scales.append(scaler.get_scale())
        if step == 0 and recipe.startswith("fp16"):
            run.underflow_fraction = _underflow_against_fp32(
                master, working, scaler, x, y, accumulation
            )
        scaler.scale(loss).backward()
        if working is not master:  # fp32 gradient accumulation into the masters
            for m, w in zip(masters, workers, strict=True):
                if w.grad is not None:
                    g = w.grad.float()
                    m.grad = g if m.grad is None else m.grad.add_(g)
                    w.grad = None
        before = [p.detach().clone() for p in masters]
        if scaler.step(opt):
            moved = [p.grad if p.grad is not None else torch.zeros_like(p) for p in masters]
            counts = _count_lost(before, masters, moved)
            lost, total = lost + counts[0], total + counts[1]
        scaler.update()
        opt.zero_grad()
        if working is not master:
            with torch.no_grad():
                for m, w in zip(masters, workers, strict=True):
                    w.copy_(m)
    run.skipped_steps = scaler.skipped_steps
    run.lost_update_fraction = lost / max(total, 1)
    return run


def _underflow_against_fp32(master, working, scaler, x, y, accumulation: int) -> float:
    """Fraction of the first step's gradient elements nonzero in fp32, zero in the fp16 run."""
    reference = copy.deepcopy(master).float()
    (loss_fn(reference(x), y) / accumulation).backward()
    probe = copy.deepcopy(working)
    scaler.scale(loss_fn(probe(x).float(), y) / accumulation).backward()
    flushed = nonzero = 0
    for r, p in zip(reference.parameters(), probe.parameters(), strict=True):
        if r.grad is None or p.grad is None:
            continue
        alive = r.grad != 0
        flushed += int(((p.grad == 0) & alive).sum())
        nonzero += int(alive.sum())
    return flushed / max(nonzero, 1)
