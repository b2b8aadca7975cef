"""Where each parameter lives on a composed mesh, which groups its gradient is reduced over, and
the global gradient norm that counts every element exactly once.

On a ``pp × dp × cp × tp`` mesh (:mod:`dtlab.mesh`) a parameter of the lab GPT is, per dimension:

======  =====================================================================================
dim     this rank's tensor, against the same parameter on the other ranks of the group
======  =====================================================================================
tp      a different *shard* (Megatron column/row splits, vocabulary rows) — or a *replica*
        (LayerNorm, a row-parallel bias), whose gradient is a partial sum under sequence
        parallelism and is all-reduced over tp (:meth:`TensorParallel.finish_gradients`)
cp      a *replica*: every CP rank holds the whole layer and sees different tokens, so the
        gradient is averaged over cp
dp      a *replica* (DDP, ZeRO-1/2: gradient averaged over dp) or a *shard* (FSDP: each rank
        keeps 1/dp of the flat parameter; the reduce-scatter averages over dp)
pp      absent on the other stages — except the tied embedding, held by the first and the last
        stage and summed over their embedding group (Megatron)
ep      expert weights only: a different expert per rank; averaged over ``edp`` instead of dp
        (with tensor parallel the ``ep``/``edp`` groups are the folded mapping's, over
        tp × cp × dp: :mod:`~dtlab.parallel.compose.fold_experts`)
======  =====================================================================================

**Global norm for clipping.** ``||g||² = Σ`` over *distinct* elements of ``g²``. Each rank adds
the squares of its tensors only where it is the designated holder: coordinate 0 along every
dimension over which its tensor is a replica (and, for the tied embedding, the first stage only).
One all-reduce over the whole world sums the partial squares; every element is counted once, by
exactly one rank — no shard twice, none missed, and no 1/replicas weights to round.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dtlab.comm import Communicator
from dtlab.runtime import context


@dataclass(frozen=True)
class Placement:
    """One parameter on this rank: the mesh dimensions over which ranks hold different pieces
    (``sharded_over``), identical copies (``replicated_over``), and over which its gradient is
    reduced before the optimizer step (``reduced_over``: ``"dp"``/``"cp"``/``"edp"`` averaged,
    ``"tp"`` and ``"pp"`` (the tied embedding) summed)."""

    name: str
    sharded_over: tuple[str, ...]
    replicated_over: tuple[str, ...]
    reduced_over: tuple[str, ...]
    tied_across_stages: bool = False

    def counted_here(self, coordinates: dict[str, int]) -> bool:
        """Whether this rank adds this tensor's squares to the global norm."""
        if self.tied_across_stages and coordinates.get("pp", 0) != 0:
            return False
        return all(coordinates.get(dim, 0) == 0 for dim in self.replicated_over)


def place_parameters(
    names: Iterable[str],
    degrees: dict[str, int],
    *,
    tp_sharded: set[str] = frozenset(),
    tp_partial: set[str] = frozenset(),
    dp_sharded: set[str] = frozenset(),
    tied: set[str] = frozenset(),
    expert: set[str] = frozenset(),
    hybrid: bool = False,
    folded: bool = False,
) -> dict[str, Placement]:
    """Placements of ``names`` on a mesh of ``degrees`` (``{"pp": 2, "dp": 2, ...}``; a degree
    of 1 drops its dimension). ``tp_sharded``: names split over tp; ``tp_partial``: replicated
    over tp with partial gradients (sequence parallel); ``dp_sharded``: names FSDP shards over
    dp; ``tied``: names tied across the first and last pipeline stage; ``expert``: expert
    weights (sharded over ``ep``, reduced over ``edp``). ``hybrid`` (HSDP): the dp group is
    ``dp_shard`` × ``dp_replicate`` (give both degrees): sharded inside, replicated across.
    ``folded`` (MoE parallel folding): the ``ep`` and ``edp`` groups are another mapping of the
    stage's tp × cp × dp ranks, so an expert weight is placed by them alone — sharded over
    ``ep``, replicated and reduced over ``edp`` — not by tp, cp or dp."""

    def active(*dims: str) -> tuple[str, ...]:
        return tuple(d for d in dims if degrees.get(d, 1) > 1)

    placements = {}
    for name in names:
        sharded, replicated, reduced = [], [], []
        if folded and name in expert:
            sharded, replicated = [*active("ep"), *active("pp")], list(active("edp"))
            placements[name] = Placement(name, tuple(sharded), tuple(replicated), active("edp"))
            continue
        (sharded if name in tp_sharded else replicated).extend(active("tp"))
        if name in tp_partial:
            reduced.extend(active("tp"))
        replicated.extend(active("cp"))
        reduced.extend(active("cp"))
        if name in expert:
            sharded.extend(active("ep"))
            (sharded if name in dp_sharded else replicated).extend(active("edp"))
            reduced.extend(active("edp"))
        elif hybrid:
            sharded.extend(active("dp_shard"))
            replicated.extend(active("dp_replicate"))
            reduced.extend(active("dp_shard", "dp_replicate"))
        else:
            (sharded if name in dp_sharded else replicated).extend(active("dp"))
            reduced.extend(active("dp"))
        if name in tied:
            reduced.extend(active("pp"))
        elif degrees.get("pp", 1) > 1:
            sharded.append("pp")
        placements[name] = Placement(
            name, tuple(sharded), tuple(replicated), tuple(reduced), name in tied
        )
    return placements


def global_grad_norm(
    named_grads: Iterable[tuple[str, torch.Tensor | None]],
    placements: dict[str, Placement],
    coordinates: dict[str, int],
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """The norm of the whole model's gradient, the same fp64 scalar on every rank of ``group``
    (default: the world, which must hold every piece of the model). One scalar all-reduce; the
    squares are summed in fp64 so the sum's order (which rank adds what) does not show."""
    grads = [(n, g) for n, g in named_grads if g is not None]
    device = grads[0][1].device if grads else context.device()  # NCCL takes device tensors
    total = torch.zeros(1, dtype=torch.float64, device=device)
    for name, grad in grads:
        if placements[name].counted_here(coordinates):
            total += grad.detach().double().pow(2).sum()
    Communicator(group, dim="world" if group is None else "grad_norm").all_reduce_control(
        total, name="grad_norm"
    )  # a report, not training traffic: a control message, not in any comm's stats
    return total[0].sqrt()


def clip_global_grad_norm_(
    named_grads: Iterable[tuple[str, torch.Tensor | None]],
    placements: dict[str, Placement],
    coordinates: dict[str, int],
    max_norm: float,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Scale every local gradient by ``min(1, max_norm / (||g|| + 1e-6))`` with the global norm
    (what one process clipping the whole gradient does); returns the norm before clipping."""
    named_grads = [(n, g) for n, g in named_grads if g is not None]
    norm = global_grad_norm(named_grads, placements, coordinates, group)
    coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for _, grad in named_grads:
        grad.mul_(coefficient.to(grad.dtype))
    return norm
