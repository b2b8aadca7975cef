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

Beyond the layout, the choices production runs make and the model prices: the pipeline
``schedule`` (``"1f1b"`` — interleaved when ``virtual_stages > 1`` —, ``"zb-h1"``, Qi et al.
2024's zero-bubble schedule that defers weight gradients, ``"dualpipe"``, DeepSeek-V3's
bidirectional schedule that overlaps one micro-batch's all-to-alls with another's compute and
holds two copies of its stage, or ``"dualpipev"``, its one-copy V-shaped variant); ``cp_kind``
(``"ring"`` attention, or Llama 3's ``"allgather"`` of K and V before attention);
``reshard_after_forward`` (ZeRO-3/FSDP only: ``False`` keeps the gathered parameters from the
step's first forward to its last backward — Llama 3's FSDP — which costs, in bytes and memory,
what ZeRO-1 costs); ``fp32_grad_accum`` (gradients accumulated across micro-batches and reduced
in FP32: 4 B per parameter instead of 2, Llama 3 Sec. 3.3.4); ``async_tp`` (collective matmul
hides forward's TP collectives too); ``zero3_collectives`` (ZeRO-3 only: ``"per_layer"``, a
flat buffer per layer as FSDP gathers it, or ``"per_parameter"``, DeepSpeed's 2021 stage 3 —
one list collective per tensor behind a device sync, :mod:`dtlab.plan.zero3_per_parameter`);
``sequence_parallel`` (Korthikanti et al. 2022, Sec. 4.2.2: the LayerNorm and dropout
activations sharded over the TP ranks along the sequence, the all-reduces split into
reduce-scatters and all-gathers of the same bytes, plus backward's re-gathers of the stored
shards; ``False`` is Megatron-LM before 2022, every TP rank keeping those activations for the
whole sequence and running its LayerNorms and dropouts on all of it).
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.mesh import Layout
from dtlab.plan.job import fields_hash_once

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "zb-h1", "dualpipe", "dualpipev")
CP_KINDS = ("ring", "allgather")
ZERO3_COLLECTIVES = ("per_layer", "per_parameter")


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
    schedule: str = "1f1b"  # one of SCHEDULES; "1f1b" with virtual_stages > 1 is interleaved
    cp_kind: str = "ring"  # "ring" or "allgather" (Llama 3)
    reshard_after_forward: bool = True  # ZeRO-3 only; False: Llama 3's FSDP
    fp32_grad_accum: bool = False  # gradients accumulated and reduced in FP32
    async_tp: bool = False  # collective matmul: forward TP collectives hidden under GEMMs
    zero3_collectives: str = "per_layer"  # ZeRO-3: "per_layer" (FSDP) or "per_parameter" (DS 2021)
    sequence_parallel: bool = True  # TP's LayerNorm/dropout activations sharded too (2022 on)

    __hash__ = fields_hash_once

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
        extras = [
            self.schedule if self.schedule != "1f1b" else "",
            "all-gather CP" if self.cp_kind == "allgather" and self.cp > 1 else "",
            "no reshard" if self.zero_stage == 3 and not self.reshard_after_forward else "",
            "fp32 grads" if self.fp32_grad_accum else "",
            "async TP" if self.async_tp else "",
            "no SP" if not self.sequence_parallel and self.tp > 1 else "",
            "per-parameter"
            if self.zero_stage == 3 and self.zero3_collectives != "per_layer"
            else "",
        ]
        tail = "".join(f" {e}" for e in extras if e)
        return (
            f"tp{self.tp} cp{self.cp} pp{self.pp} v{self.virtual_stages} dp{self.dp} ep{self.ep} "
            f"ZeRO-{self.zero_stage} mbs{self.micro_batch_size} {self.recompute}{tail}"
        )
