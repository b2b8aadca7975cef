"""Which ranks each kind of parameter reduces its gradient over in an N-D mesh, and the global norm.

In a ``(pp, dp, cp, tp)`` mesh with experts carved out of ``dp`` (:class:`dtlab.mesh.Layout`),
every rank's gradient of a parameter is a partial contribution that must be summed with exactly
the ranks that hold *the same parameter shard* and saw *different data*:

* **dense, tensor-parallel sharded** (column/row-parallel weights): the same shard lives on every
  rank with the same ``pp`` and ``tp`` coordinates; they saw different batches (``dp``) and
  different sequence chunks (``cp``): reduce over ``dp × cp``.
* **replicated across TP** (LayerNorm weights, the row-parallel bias): without sequence
  parallelism every TP rank computes the same gradient from the same full activations, so
  ``dp × cp`` again. *With* sequence parallelism each TP rank saw only its slice of the sequence,
  so the TP copies hold partial sums and must be all-reduced over ``tp`` too: ``dp × cp × tp``
  (Megatron-LM's ``allreduce_layernorm_grads``; Korthikanti et al. 2022).
* **expert** (an MoE expert's weights): the same experts live on the ranks at the same position
  of every ``ep`` block, the expert-data-parallel group (``dp / ep`` ranks), times ``cp``.

**Global gradient-norm clipping.** The norm is over the whole model once: each rank sums the
squares of what it holds, but a parameter that several ranks hold *identical* copies of must be
counted once. Summing every rank's local square norm over the model-parallel ranks counts a
TP-replicated parameter ``tp`` times (and a DP-replicated one ``dp`` times if summed over the
world): :func:`naive_norm_inflation`. Frameworks count replicated parameters on one rank only
(Megatron-LM's ``param_is_not_tensor_parallel_duplicate``) and all-reduce the squared norm over
the model-parallel group (``tp × pp × ep`` — every rank holding a *different* piece).
"""

from __future__ import annotations

import math

from dtlab.mesh.layout import Layout

KINDS = ("dense", "tp_replicated", "tp_replicated_sp", "expert")


def gradient_reduction_ranks(layout: Layout, kind: str, rank: int = 0) -> list[int]:
    """The global ranks ``rank`` all-reduces its gradient of a ``kind`` parameter with."""
    if kind not in KINDS:
        raise ValueError(f"unknown parameter kind {kind!r}; choose one of {KINDS}")
    me = layout.coordinates(rank)
    if kind == "expert":
        same = ("pp", "tp", "ep")
    elif kind == "tp_replicated_sp":
        same = ("pp",)
    else:
        same = ("pp", "tp")
    return [
        r for r in range(layout.world_size) if all(layout.coordinates(r)[d] == me[d] for d in same)
    ]


def gradient_reduction_size(
    kind: str, dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1
) -> int:
    """How many ranks reduce a ``kind`` gradient together (see :func:`gradient_reduction_ranks`)."""
    return len(gradient_reduction_ranks(Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep), kind))


def norm_reduction_size(tp: int = 1, pp: int = 1, ep: int = 1) -> int:
    """Ranks whose local squared norms are summed for the global norm: the model-parallel group,
    every rank holding a different piece of the model (``tp · pp · ep``)."""
    for name, value in (("tp", tp), ("pp", pp), ("ep", ep)):
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")
    return tp * pp * ep


def naive_norm_inflation(replicated_sq: float, sharded_sq: float, copies: int) -> float:
    """How many times too large the global norm is when ``copies`` identical copies of the
    replicated parameters are all summed: ``sqrt((copies·R + S) / (R + S))`` for squared norms
    ``R`` (replicated) and ``S`` (sharded, counted once)."""
    if replicated_sq < 0 or sharded_sq < 0 or replicated_sq + sharded_sq == 0 or copies < 1:
        raise ValueError("squared norms must be >= 0 (not both 0) and copies >= 1")
    return math.sqrt((copies * replicated_sq + sharded_sq) / (replicated_sq + sharded_sq))


def mesh_rank(layout: Layout, pp: int = 0, dp: int = 0, cp: int = 0, tp: int = 0) -> int:
    """The global rank at these mesh coordinates (row-major over ``(pp, dp, cp, tp)``)."""
    for name, value in (("pp", pp), ("dp", dp), ("cp", cp), ("tp", tp)):
        if not 0 <= value < getattr(layout, name):
            raise ValueError(f"{name}={value} is outside 0..{getattr(layout, name) - 1}")
    return layout.rank_at(pp=pp, dp=dp, cp=cp, tp=tp)
