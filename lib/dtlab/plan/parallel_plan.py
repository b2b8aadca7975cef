"""How a job's GPUs are split: a mesh layout, plus the choices that go with it.

A :class:`ParallelPlan` is a :class:`dtlab.mesh.Layout` over ``(dp, tp, pp, cp)`` with ``ep``
carved out of ``dp`` — the same row-major rank order ``(pp, dp, cp, tp)``, ``tp`` innermost so a
TP group is a block of consecutive GPUs inside one node — plus the choices the layout alone does
not make: the ZeRO stage that shards model state over the data-parallel ranks (Rajbhandari et al.
2020), the micro-batch size, the number of model chunks per pipeline device for interleaved 1F1B
(Narayanan et al. 2021, Sec. 2.2), and what the backward pass recomputes (Korthikanti et al.
2022: ``"none"``, ``"selective"`` — the attention core — or ``"full"`` — every layer from its
input). Its degrees are kept as given, even impossible ones, so
:func:`dtlab.plan.plan_problems` can say what is wrong with them.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.mesh import Layout

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class ParallelPlan:
    """How the GPUs are split: ``dp · tp · pp · cp`` must equal the GPU count; ``ep`` divides
    ``dp`` (expert-data-parallel degree ``dp / ep``)."""

    dp: int
    tp: int
    pp: int
    zero_stage: int = 1
    micro_batch_size: int = 1
    virtual_stages: int = 1  # > 1: interleaved 1F1B
    cp: int = 1  # context parallel: the sequence split over cp ranks (ring attention)
    ep: int = 1  # expert parallel, inside dp: each rank of an ep group holds n_experts/ep experts
    recompute: str = "selective"  # "none", "selective" or "full"

    @property
    def world_size(self) -> int:
        """GPUs this plan uses: ``dp · tp · pp · cp`` (``ep`` reuses the dp ranks)."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def expert_data_parallel(self) -> int:
        """Ranks holding the same experts inside one dp group: ``dp / ep``."""
        return self.dp // self.ep

    @property
    def layout(self) -> Layout:
        """The mesh layout of this plan, whose ``groups("tp")`` etc. are the ranks of each group
        (raises ``ValueError`` for a degree that is not a whole number ≥ 1, or ep ∤ dp)."""
        return Layout(dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp, ep=self.ep)

    @classmethod
    def from_layout(
        cls,
        layout: Layout,
        zero_stage: int = 1,
        micro_batch_size: int = 1,
        virtual_stages: int = 1,
        recompute: str = "selective",
    ) -> ParallelPlan:
        """The plan of a layout, its ``cp`` and ``ep`` included."""
        return cls(
            layout.dp,
            layout.tp,
            layout.pp,
            zero_stage,
            micro_batch_size,
            virtual_stages,
            layout.cp,
            layout.ep,
            recompute,
        )

    def describe(self) -> str:
        """One line: ``tp8 cp2 pp16 v2 dp64 ep1 ZeRO-1 mbs1 selective``."""
        return (
            f"tp{self.tp} cp{self.cp} pp{self.pp} v{self.virtual_stages} dp{self.dp} ep{self.ep} "
            f"ZeRO-{self.zero_stage} mbs{self.micro_batch_size} {self.recompute}"
        )
