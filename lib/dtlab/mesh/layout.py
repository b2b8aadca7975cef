"""A parallel layout as plain numbers, checked before any process starts.

A layout names how many ways each kind of parallelism splits the job:

====  ====================================================================================
dim   what it splits
====  ====================================================================================
pp    the layers, into pipeline stages (Huang et al. 2019; Narayanan et al. 2021)
dp    the batch: replicas (DDP) or shards of the model state (ZeRO/FSDP)
cp    the sequence, inside attention (context parallel: ring attention, Ulysses)
tp    each layer's matrices (Megatron tensor parallel; Shoeybi et al. 2019)
ep    the experts of a mixture-of-experts layer, carved out of ``dp`` (ep must divide dp)
====  ====================================================================================

``world = pp · dp · cp · tp``. Ranks are laid out row-major over ``(pp, dp, cp, tp)``, the order
torchtitan and Megatron use: ``tp`` innermost, so a TP group is a block of consecutive ranks —
the GPUs of one NVLink domain when a node holds ``tp`` or more of them — and ``pp`` outermost,
whose point-to-point sends are the cheapest traffic to push across nodes. Expert parallelism
reuses the data-parallel ranks: within each dp group, consecutive blocks of ``ep`` ranks hold
different experts (the EP group); ranks at the same position of different blocks hold the same
experts and average their gradients (the expert-data-parallel group, ``dp / ep`` ranks).

:meth:`Layout.check` refuses an impossible layout with a message that says what to choose;
``model_check`` (e.g. :func:`dtlab.mesh.layout_rules.fit_check` of a GPT config) adds the model's
own limits (heads divisible by tp, layers by pp, ...); every such rule lives in
:mod:`~dtlab.mesh.layout_rules`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dtlab.mesh.layout_rules import degree_problems, divisors, expert_inside_dp_problems

ORDER = ("pp", "dp", "cp", "tp")
"""Mesh dimensions from outermost (largest rank stride) to innermost (consecutive ranks)."""


@dataclass(frozen=True)
class Layout:
    """Degrees of each parallelism; ``Layout(dp=2, tp=2)`` needs 4 ranks."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        degrees = {name: getattr(self, name) for name in ("dp", "tp", "pp", "cp", "ep")}
        problems = degree_problems(**degrees) or expert_inside_dp_problems(self.ep, self.dp)
        if problems:
            raise ValueError(problems[0])

    @property
    def world_size(self) -> int:
        """Ranks this layout needs: pp · dp · cp · tp."""
        return self.pp * self.dp * self.cp * self.tp

    @property
    def shape(self) -> tuple[int, ...]:
        """The mesh shape in :data:`ORDER`."""
        return tuple(getattr(self, name) for name in ORDER)

    def check(self, world_size: int, model_check: Callable[[Layout], None] | None = None) -> None:
        """Raise ``ValueError`` saying what to change unless this layout fits ``world_size`` ranks
        (and ``model_check`` accepts it)."""
        if self.world_size != world_size:
            product = " · ".join(f"{n}={getattr(self, n)}" for n in ORDER if getattr(self, n) > 1)
            others = self.pp * self.cp * self.tp
            hint = (
                f"; with these tp, pp and cp, dp={world_size // others} fills {world_size} ranks"
                if world_size % others == 0
                else f"; the degrees must multiply to {world_size}"
            )
            raise ValueError(
                f"{product or 'the layout'} uses {self.world_size} ranks, not {world_size}{hint}"
            )
        if model_check is not None:
            model_check(self)

    def coordinates(self, rank: int) -> dict[str, int]:
        """This rank's index along each dimension (row-major over :data:`ORDER`), plus its index
        in its ep group (``ep``) and in its expert-data-parallel group (``edp``)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a {self.world_size}-rank layout")
        coords, rest = {}, rank
        for name in reversed(ORDER):
            size = getattr(self, name)
            coords[name], rest = rest % size, rest // size
        coords["ep"] = coords["dp"] % self.ep
        coords["edp"] = coords["dp"] // self.ep
        return {name: coords[name] for name in (*ORDER, "ep", "edp")}

    def rank_at(self, **coords: int) -> int:
        """The global rank at the given coordinates (missing ones are 0)."""
        rank = 0
        for name in ORDER:
            rank = rank * getattr(self, name) + coords.get(name, 0)
        return rank

    def groups(self, dim: str) -> list[list[int]]:
        """Every group along ``dim`` (``pp``, ``dp``, ``cp``, ``tp``, ``ep`` or ``edp``), each
        a list of global ranks in coordinate order; together they cover every rank once."""
        if dim not in (*ORDER, "ep", "edp"):
            raise ValueError(
                f"unknown mesh dimension {dim!r}; choose one of {(*ORDER, 'ep', 'edp')}"
            )
        seen: dict[tuple, list[int]] = {}
        for rank in range(self.world_size):
            c = self.coordinates(rank)
            if dim in ORDER:
                key = tuple(c[n] for n in ORDER if n != dim)
            elif dim == "ep":  # same block of ep consecutive dp indices
                key = (c["pp"], c["cp"], c["tp"], c["edp"])
            else:  # edp: same position inside the blocks
                key = (c["pp"], c["cp"], c["tp"], c["ep"])
            seen.setdefault(key, []).append(rank)
        return list(seen.values())

    def group_of(self, dim: str, rank: int) -> list[int]:
        """The ranks of ``rank``'s group along ``dim``."""
        return next(g for g in self.groups(dim) if rank in g)


def layouts_of(
    world_size: int, dims: tuple[str, ...] = ("dp", "tp", "pp", "cp", "ep")
) -> list[Layout]:
    """Every valid layout of ``world_size`` ranks over ``dims`` (ep only where it divides dp)."""
    found = []

    def extend(i: int, left: int, chosen: dict[str, int]) -> None:
        if i == len(dims):
            if left == 1:
                found.append(Layout(**chosen))
            return
        name = dims[i]
        options = divisors(chosen.get("dp", 1)) if name == "ep" else divisors(left)
        for d in options:
            extend(i + 1, left if name == "ep" else left // d, {**chosen, name: d})

    extend(0, world_size, {})
    return found
