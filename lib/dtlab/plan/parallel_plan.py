"""How a job's GPUs are split: a mesh layout, plus the choices that go with it.

A :class:`ParallelPlan` is a :class:`dtlab.mesh.Layout` over ``(dp, tp, pp)`` — the same
row-major rank order, ``tp`` innermost so a TP group is a block of consecutive GPUs inside one
node — plus three choices the layout alone does not make: the ZeRO stage that shards model state
over ``dp`` (Rajbhandari et al. 2020), the micro-batch size, and the number of model chunks per
pipeline device for interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2). Its degrees are kept as
given, even impossible ones, so :func:`dtlab.plan.plan_problems` can say what is wrong with them.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.mesh import Layout


@dataclass(frozen=True)
class ParallelPlan:
    """How the GPUs are split: ``dp · tp · pp`` must equal the GPU count."""

    dp: int
    tp: int
    pp: int
    zero_stage: int = 1
    micro_batch_size: int = 1
    virtual_stages: int = 1  # > 1: interleaved 1F1B

    @property
    def world_size(self) -> int:
        """GPUs this plan uses: ``dp · tp · pp``."""
        return self.dp * self.tp * self.pp

    @property
    def layout(self) -> Layout:
        """The mesh layout of this plan, whose ``groups("tp")`` etc. are the ranks of each group
        (raises ``ValueError`` for a degree that is not a whole number ≥ 1)."""
        return Layout(dp=self.dp, tp=self.tp, pp=self.pp)

    @classmethod
    def from_layout(
        cls, layout: Layout, zero_stage: int = 1, micro_batch_size: int = 1, virtual_stages: int = 1
    ) -> ParallelPlan:
        """The plan of a ``(dp, tp, pp)`` layout; context and expert parallelism are not planned
        here, so a layout with ``cp`` or ``ep`` above 1 is refused."""
        if layout.cp > 1 or layout.ep > 1:
            raise ValueError(
                f"a ParallelPlan splits dp, tp and pp only; got cp={layout.cp}, ep={layout.ep} "
                "(use cp=1, ep=1)"
            )
        return cls(layout.dp, layout.tp, layout.pp, zero_stage, micro_batch_size, virtual_stages)
