"""MoE parallel folding: one mapping of the ranks for attention, another for the MoE layers.

Liu et al., "MoE Parallel Folding: Heterogeneous Parallelism Mappings for Efficient Large-Scale
MoE Model Training with Megatron Core" (arXiv 2504.14960, 2025), as Megatron-Core implements it
(``--expert-tensor-parallel-size``, ``--expert-model-parallel-size``). The same ``pp`` stages hold
both; inside one stage's ``tp · cp · dp`` ranks there are two independent mappings:

===========  =========================  ===========================================================
part         mapping (innermost first)  what each group carries
===========  =========================  ===========================================================
attention    ``tp`` × ``cp`` × ``dp``    Megatron's all-reduces / the K/V ring / dense gradients
MoE          ``etp`` × ``ep`` × ``edp``   expert-TP all-reduces / the dispatch all-to-all /
                                        expert gradients
===========  =========================  ===========================================================

with ``etp · ep · edp = tp · cp · dp``. Both number the stage's ranks row-major with the first
dimension innermost (consecutive ranks), so a small ``etp · ep`` is a block of consecutive ranks —
one node when ``etp · ep`` ≤ ranks per node — whatever ``tp``, ``cp`` and ``dp`` are.

**Why EP carved out of DP lands across nodes.** Without folding (:mod:`dtlab.mesh.layout`,
Megatron before folding, what :func:`~dtlab.parallel.compose.compose_gpt` runs for ``tp = 1``
and a mesh's ``ep``) an EP group is
``ep`` consecutive *dp* indices at the same ``tp``/``cp`` coordinates: ranks ``tp·cp`` apart.
Once ``tp · cp`` fills a node — the usual choice, TP kept on NVLink — every EP group has one rank
per node, and each dispatch and combine all-to-all crosses the slow network. Folding lets EP take
the ranks TP uses for attention (``etp = 1``, ``ep = tp``): the all-to-all stays inside the node,
and EP is no longer bounded by ``dp`` (``ep ≤ dp`` unfolded; ``ep ≤ tp · cp · dp`` folded).

**ETP = 1 for thin experts.** Splitting an expert's matrices (``etp > 1``) adds an all-reduce per
expert GEMM over an already small per-expert batch; fine-grained experts (DeepSeek-V3's
``d_ff = 2048``) are kept whole and only EP spreads them — the paper's and Megatron's default.
With ``tp > 1`` Megatron runs MoE layers under sequence parallelism, so the ranks of a tp group
hold different tokens and an EP group over them dispatches distinct tokens; dtlab does the same,
and without sequence parallelism gives each TP rank a ``1/tp`` slice of the replicated sequence
(:mod:`dtlab.parallel.expert.tensor_split`).

This file is the mapping only — groups, node crossings, the per-rank table the lab prints. The
ranks train it in :func:`~dtlab.parallel.compose.compose_gpt` whenever ``tp > 1`` (or
``expert_parallel=`` is given): :mod:`~dtlab.parallel.compose.fold_experts` makes the ``ep`` and
``edp`` groups from :meth:`FoldedMapping.groups` with ``etp = 1`` — equal to one process under
tp × dp, tp × cp and tp × pp (``tests/test_compose_ep_tp.py``). ``etp > 1`` is not trained.
"""

from __future__ import annotations

from dataclasses import dataclass

ATTENTION = ("tp", "cp", "dp")  # innermost first
MOE = ("etp", "ep", "edp")


@dataclass(frozen=True)
class FoldedMapping:
    """Degrees of both mappings; ``edp`` is what is left: ``tp·cp·dp / (etp·ep)``."""

    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1
    etp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        degrees = {d: getattr(self, d) for d in ("tp", "cp", "dp", "pp", "etp", "ep")}
        if any(not isinstance(v, int) or v < 1 for v in degrees.values()):
            raise ValueError(f"every degree must be a positive integer, got {degrees}")
        if self.stage_ranks % (self.etp * self.ep):
            raise ValueError(
                f"etp·ep = {self.etp * self.ep} must divide a stage's tp·cp·dp = "
                f"{self.stage_ranks} ranks; choose etp·ep from "
                f"{[d for d in range(1, self.stage_ranks + 1) if self.stage_ranks % d == 0]}"
            )

    @property
    def stage_ranks(self) -> int:
        return self.tp * self.cp * self.dp

    @property
    def edp(self) -> int:
        return self.stage_ranks // (self.etp * self.ep)

    @property
    def world_size(self) -> int:
        return self.pp * self.stage_ranks

    def coordinates(self, rank: int) -> dict[str, int]:
        """``rank``'s index along every dimension of both mappings (and ``pp``)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a {self.world_size}-rank mapping")
        coords = {"pp": rank // self.stage_ranks}
        for dims in (ATTENTION, MOE):
            rest = rank % self.stage_ranks
            for dim in dims:
                size = getattr(self, dim)
                coords[dim], rest = rest % size, rest // size
        return coords

    def groups(self, dim: str) -> list[list[int]]:
        """Every group along ``dim`` (``tp cp dp etp ep edp pp``), each a list of global ranks."""
        if dim not in (*ATTENTION, *MOE, "pp"):
            raise ValueError(f"unknown dimension {dim!r}; choose one of {(*ATTENTION, *MOE, 'pp')}")
        mapping = ("pp",) + (MOE if dim in MOE else ATTENTION)
        seen: dict[tuple, list[int]] = {}
        for rank in range(self.world_size):
            c = self.coordinates(rank)
            seen.setdefault(tuple(c[d] for d in mapping if d != dim), []).append(rank)
        return list(seen.values())

    def crosses_node(self, dim: str, ranks_per_node: int) -> bool:
        """Whether some group along ``dim`` has ranks on two nodes (``rank // ranks_per_node``)."""
        return any(len({r // ranks_per_node for r in g}) > 1 for g in self.groups(dim))

    def node_crossings(self, ranks_per_node: int) -> dict[str, bool]:
        """Every dimension of degree > 1 → whether its groups leave a node."""
        dims = [d for d in (*ATTENTION, *MOE, "pp") if getattr(self, d) > 1]
        return {d: self.crosses_node(d, ranks_per_node) for d in dims}

    def rank_table(self, ranks_per_node: int) -> list[dict]:
        """One row per rank: its node and the ranks of each of its groups (degree > 1)."""
        dims = [d for d in (*ATTENTION, *MOE, "pp") if getattr(self, d) > 1]
        groups = {d: self.groups(d) for d in dims}
        return [
            {"rank": r, "node": r // ranks_per_node}
            | {d: next(g for g in groups[d] if r in g) for d in dims}
            for r in range(self.world_size)
        ]


def ep_carved_from_dp(tp: int, cp: int, dp: int, ep: int, pp: int = 1) -> list[list[int]]:
    """The EP groups without folding (:meth:`dtlab.mesh.Layout.groups` ``("ep")``): ``ep``
    consecutive dp indices at one ``tp``/``cp`` coordinate, ranks ``tp·cp`` apart."""
    from dtlab.mesh import Layout

    return Layout(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep).groups("ep")


def ep_group_nodes(tp: int, cp: int, dp: int, ep: int, ranks_per_node: int, *, folded: bool) -> int:
    """Nodes one EP group spans (the most over all groups): EP carved out of dp (``folded``
    False: ranks ``tp·cp`` apart) or folded onto the stage's innermost ranks (``etp = 1``)."""
    if folded:
        groups = FoldedMapping(tp=tp, cp=cp, dp=dp, ep=ep).groups("ep")
    else:
        groups = ep_carved_from_dp(tp, cp, dp, ep)
    return max(len({r // ranks_per_node for r in g}) for g in groups)
