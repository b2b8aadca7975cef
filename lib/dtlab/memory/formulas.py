"""Memory a training job needs per rank, in closed form: model state, ZeRO stages, activations.

**Model state** (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", Sec. 3.1). Mixed-precision Adam keeps, per parameter: fp16/bf16 weights (2 B)
and gradients (2 B), plus an fp32 master copy, Adam's momentum and variance (4 + 4 + 4 = "K = 12"
bytes): **16 bytes per parameter**. A 7B model needs 112 GB and a 70B model 1.12 TB of model state
before a single activation — not the 14 GB / 140 GB its bf16 weights alone take.

**ZeRO** partitions that state over the ``N`` data-parallel ranks (Ψ = parameter count):

=========  ============================  =========  ===========  ============
stage      per-rank bytes                params     grads        optimizer
=========  ============================  =========  ===========  ============
0 (DDP)    ``16Ψ``                       ``2Ψ``     ``2Ψ``       ``12Ψ``
1          ``4Ψ + 12Ψ/N``                ``2Ψ``     ``2Ψ``       ``12Ψ/N``
2          ``2Ψ + 14Ψ/N``                ``2Ψ``     ``2Ψ/N``     ``12Ψ/N``
3          ``16Ψ/N``                     ``2Ψ/N``   ``2Ψ/N``     ``12Ψ/N``
=========  ============================  =========  ===========  ============

Rounding: a sharded quantity is stored as one flat buffer padded to a multiple of ``N``
elements, so each rank holds ``ceil(Ψ/N)`` elements of it (the last rank's tail is padding).
When ``N`` divides ``Ψ`` every number above is exact.

**Communication** per rank per step (Sec. 7): DDP, ZeRO-1 and ZeRO-2 move ``2(N-1)/N · Ψ``
elements (a reduce-scatter plus an all-gather, which together are one all-reduce); ZeRO-3 adds
an all-gather of the parameters in the backward pass as well as the forward: ``3(N-1)/N · Ψ``,
the paper's "1.5x" of data parallelism.

**Activations** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Sec. 4): one transformer layer in 16-bit stores ``s·b·h·(34 + 5·a·s/h)`` bytes for
sequence length ``s``, micro-batch ``b``, hidden size ``h`` and ``a`` heads — ``34·sbh`` for the
linear-in-``s`` tensors (11 attention, 19 MLP, 4 LayerNorm, dropout masks at 1 byte included) and
``5·a·s²·b`` for the attention scores, softmax output and its dropout mask. Tensor parallelism of
degree ``t`` splits all but ``10·sbh`` (LayerNorm and dropout inputs kept in full); adding
sequence parallelism splits those too; selective recomputation drops the ``5·a·s²·b`` term.
:mod:`dtlab.memory.activation_families` splits the count by tensor family and writes the same
derivation for the lab GPT (fp32, GELU, CPU dropout masks), which the saved-tensor hooks match
exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter of each model-state category under one precision/optimizer recipe."""

    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    name: str = ""

    @property
    def bytes_per_param(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


RECIPES: dict[str, Recipe] = {
    # bf16/fp16 params and grads; fp32 master weights + Adam m + v (the ZeRO paper's K = 12).
    "mixed_adam": Recipe(2, 2, 12, "mixed_adam"),
    # Everything fp32: Adam m + v only (the params are their own master copy).
    "fp32_adam": Recipe(4, 4, 8, "fp32_adam"),
    "fp32_sgd": Recipe(4, 4, 0, "fp32_sgd"),
    "fp32_sgd_momentum": Recipe(4, 4, 4, "fp32_sgd_momentum"),
    # Pure bf16 training without an fp32 master copy: bf16 Adam m + v.
    "bf16_adam_no_master": Recipe(2, 2, 4, "bf16_adam_no_master"),
}


def resolve_recipe(name_or_recipe: str | Recipe) -> Recipe:
    """Look up a preset by name (one of :data:`RECIPES`) or pass a :class:`Recipe` through."""
    if isinstance(name_or_recipe, Recipe):
        return name_or_recipe
    try:
        return RECIPES[name_or_recipe]
    except KeyError:
        raise KeyError(
            f"no memory recipe {name_or_recipe!r}; choose one of {sorted(RECIPES)} "
            "or pass Recipe(param_bytes, grad_bytes, optimizer_bytes)"
        ) from None


@dataclass(frozen=True)
class StateBytes:
    """Model-state bytes held by one rank."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def by_category(self) -> dict[str, int]:
        """The same numbers under :class:`~dtlab.memory.measure.MemoryReport`'s category names."""
        return {
            "parameters": self.params,
            "gradients": self.grads,
            "optimizer_state": self.optimizer,
        }


def _check_zero(world_size: int, zero_stage: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be >= 1")
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage {zero_stage} does not exist; choose one of {ZERO_STAGES}")


def shard_numel(num_params: int, world_size: int) -> int:
    """Elements one rank holds of a flat buffer of ``num_params`` padded to a multiple of N."""
    return -(-num_params // world_size)


def model_state_bytes(
    num_params: int,
    world_size: int = 1,
    zero_stage: int = 0,
    recipe: str | Recipe = "mixed_adam",
) -> StateBytes:
    """Per-rank bytes of parameters, gradients and optimizer state under ZeRO ``zero_stage``.

    See the module docstring for the table and the ``ceil(Ψ/N)`` padding convention.
    """
    _check_zero(world_size, zero_stage)
    r = resolve_recipe(recipe)
    full, shard = num_params, shard_numel(num_params, world_size)
    return StateBytes(
        params=(shard if zero_stage >= 3 else full) * r.param_bytes,
        grads=(shard if zero_stage >= 2 else full) * r.grad_bytes,
        optimizer=(shard if zero_stage >= 1 else full) * r.optimizer_bytes,
    )


def fsdp2_state_bytes(
    num_params: int, world_size: int, recipe: str | Recipe = "mixed_adam", master_bytes: int = 4
) -> StateBytes:
    """Per-rank bytes of ZeRO-3 as torch FSDP2 (and dtlab's FSDP) lay it out.

    Same total as :func:`model_state_bytes` at stage 3, other categories: under mixed precision
    the sharded parameters stay fp32 and *are* the master weights (``master_bytes``·Ψ/N), the
    averaged gradient lands as an fp32 shard (``master_bytes``·Ψ/N), and the optimizer holds only
    its moments (``optimizer_bytes − master_bytes``; 8 for Adam). The low-precision copies exist
    only while a unit is gathered. Without mixed precision both layouts coincide.
    """
    _check_zero(world_size, 3)
    r = resolve_recipe(recipe)
    shard = shard_numel(num_params, world_size)
    if r.param_bytes >= master_bytes:
        return model_state_bytes(num_params, world_size, 3, r)
    return StateBytes(
        params=shard * master_bytes,
        grads=shard * master_bytes,
        optimizer=shard * (r.optimizer_bytes - master_bytes),
    )


def zero_comm_bytes_per_rank(
    num_params: int, world_size: int, stage: int, bytes_per_elem: int = 2
) -> int:
    """Bytes each rank sends (and receives) per training step under ZeRO ``stage``.

    Stages 0–2: ``2(N-1)·ceil(Ψ/N)·b`` (reduce-scatter of gradients + all-gather of parameters,
    i.e. one all-reduce). Stage 3: ``3(N-1)·ceil(Ψ/N)·b`` — parameters are all-gathered in forward
    *and* backward, 1.5× data parallelism (Rajbhandari et al. 2020, Sec. 7.2.2).
    """
    _check_zero(world_size, stage)
    collectives = 3 if stage == 3 else 2
    return collectives * (world_size - 1) * shard_numel(num_params, world_size) * bytes_per_elem


def activation_bytes_per_layer(
    seq_len: int,
    batch_size: int,
    d_model: int,
    n_heads: int,
    tensor_parallel: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> int:
    """Bytes of activations one transformer layer keeps for backward (16-bit, Korthikanti et al.).

    ``recompute`` is ``"none"``, ``"selective"`` (recompute attention scores/softmax/dropout: the
    ``5·a·s²·b`` term goes) or ``"full"`` (keep only the layer's input, ``2·s·b·h``).

    ====================  =====================================
    none, t = 1           ``sbh·34 + 5·a·s²·b``
    TP only               ``sbh·(10 + 24/t) + 5·a·s²·b/t``
    TP + SP               ``(sbh·34 + 5·a·s²·b) / t``
    selective, TP only    ``sbh·(10 + 24/t)``
    selective, TP + SP    ``sbh·34 / t``
    full                  ``2·sbh`` (``/t`` with SP)
    ====================  =====================================
    """
    s, b, h, a, t = seq_len, batch_size, d_model, n_heads, tensor_parallel
    if min(s, b, h, a, t) < 1:
        raise ValueError("seq_len, batch_size, d_model, n_heads and tensor_parallel must be >= 1")
    if a % t:
        divisors = [k for k in range(1, a + 1) if a % k == 0]
        raise ValueError(
            f"TP degree {t} does not divide {a} attention heads; choose one of {divisors}"
        )
    if h % t:
        raise ValueError(f"TP degree {t} does not divide d_model {h}")
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute={recompute!r}; choose 'none', 'selective' or 'full'")
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh // t if sequence_parallel else 2 * sbh
    scores = 0 if recompute == "selective" else 5 * a * s * s * b // t
    linear = 34 * sbh // t if sequence_parallel else 10 * sbh + 24 * sbh // t
    return linear + scores


def activation_bytes(
    n_layers: int, seq_len: int, batch_size: int, d_model: int, n_heads: int, **kwargs
) -> int:
    """All ``n_layers`` layers' activations: ``n_layers · activation_bytes_per_layer(...)``."""
    return n_layers * activation_bytes_per_layer(seq_len, batch_size, d_model, n_heads, **kwargs)


def activation_checkpointing_bytes(
    n_layers: int,
    seq_len: int,
    batch_size: int,
    d_model: int,
    n_heads: int,
    layers_per_checkpoint: int = 1,
    tensor_parallel: int = 1,
    sequence_parallel: bool = False,
) -> int:
    """Peak activation bytes with checkpoints every ``layers_per_checkpoint`` layers.

    Forward keeps only each segment's input (``a = 2·s·b·h`` bytes in 16-bit, ``/t`` with SP);
    backward recomputes one segment of ``k`` layers at a time and holds its full activations
    (``b`` = :func:`activation_bytes_per_layer` per layer) meanwhile::

        ceil(L / k) · a  +  k · b

    The first term falls with ``k``, the second grows; the continuous optimum is
    ``k* = sqrt(L · a / b)`` (:func:`best_layers_per_checkpoint` finds the integer one). Chen et
    al. 2016 ("Training Deep Nets with Sublinear Memory Cost") assume ``a = b`` and get ``√L``;
    a transformer layer's ``b`` is ``17 + 2.5·a_heads·s/h`` times its input when the attention
    scores are stored (``b/a`` is 57 for GPT-3), so ``k* < √(L/17)``: checkpoint **every layer**
    (every second one only past about ``2·b/a`` layers), not every ``√L``-th. With flash
    attention the score term is gone, ``b/a = 17``, and two layers per checkpoint win from
    about 36 layers (``k* = √(80/17) ≈ 2.2`` at 80).
    """
    k = layers_per_checkpoint
    if not 1 <= k <= n_layers:
        raise ValueError(f"layers_per_checkpoint={k} must be between 1 and n_layers={n_layers}")
    full = activation_bytes_per_layer(
        seq_len, batch_size, d_model, n_heads, tensor_parallel, sequence_parallel, "full"
    )
    one_layer = activation_bytes_per_layer(
        seq_len, batch_size, d_model, n_heads, tensor_parallel, sequence_parallel, "none"
    )
    return -(-n_layers // k) * full + k * one_layer


def checkpoint_interval_optimum(n_layers: int, input_bytes: int, layer_bytes: int) -> float:
    """The continuous minimiser ``k* = sqrt(L · a / b)`` of ``(L / k) · a + k · b``.

    ``a`` = ``input_bytes`` (a checkpointed segment's stored input), ``b`` = ``layer_bytes`` (one
    layer's full activations). ``√L`` only when ``a = b``.
    """
    if min(n_layers, input_bytes, layer_bytes) < 1:
        raise ValueError("n_layers, input_bytes and layer_bytes must be >= 1")
    return math.sqrt(n_layers * input_bytes / layer_bytes)


def best_layers_per_checkpoint(
    n_layers: int,
    seq_len: int,
    batch_size: int,
    d_model: int,
    n_heads: int,
    tensor_parallel: int = 1,
    sequence_parallel: bool = False,
) -> int:
    """The integer ``k`` in ``1..L`` minimising :func:`activation_checkpointing_bytes` (the
    smallest one on a tie)."""
    return min(
        range(1, n_layers + 1),
        key=lambda k: activation_checkpointing_bytes(
            n_layers, seq_len, batch_size, d_model, n_heads, k, tensor_parallel, sequence_parallel
        ),
    )
