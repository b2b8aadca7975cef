"""Memory one GPU needs for a plan, by category: parameters, gradients, optimizer, activations.

* **Dense parameters** (everything but the routed experts): the ``Ψ_d/(tp·pp)`` shard of a
  stage, 16 B/param for mixed-precision Adam, ZeRO sharding it over the ``dp·cp`` ranks that
  hold the same shard (context-parallel ranks hold the same weights, Megatron-Core's
  data-parallel group includes them) — Rajbhandari et al. 2020, "ZeRO", Sec. 5.
* **Routed experts** of an MoE model: ``Ψ_e/(tp·pp·ep)`` per GPU (each EP rank holds ``E/ep``
  experts, TP splits them as it splits a dense MLP), ZeRO over the ``dp·cp/ep`` ranks that hold
  the same experts (the expert-data-parallel group; Lepikhin et al. 2020, GShard; DeepSeek-V3
  shards experts over EP 64 and the rest with ZeRO-1 over DP, DeepSeek-AI 2024, Sec. 3.2).
* **ZeRO-3's gathered layers**: stage 3 keeps parameters sharded but must materialise a layer's
  full (TP- and EP-sharded) weights to run it — two layers in bf16, the one running and the one
  prefetched (FSDP's default). A dense layer's is a GB or two; an MoE layer's 256 experts are
  tens of GB unless EP splits them.
* **Activations**: :func:`~dtlab.plan.layout_cost.activation_bytes_per_gpu` — Korthikanti et
  al. 2022's per-layer bytes for ``s/cp`` tokens under the plan's recomputation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dtlab.memory import model_state_bytes
from dtlab.plan.job import Requirements
from dtlab.plan.layout_cost import activation_bytes_per_gpu
from dtlab.plan.parallel_plan import ParallelPlan


@dataclass(frozen=True)
class MemoryPerGPU:
    """Bytes one GPU holds at its peak, by category."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    zero3_gathered: float = 0.0

    @property
    def model_state(self) -> float:
        return self.parameters + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.model_state + self.activations + self.zero3_gathered

    @property
    def by_category(self) -> dict[str, float]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "zero3_gathered": self.zero3_gathered,
        }

    def summary(self) -> str:
        """``params 1.2 + grads 1.2 + optimizer 3.4 + activations 40.1 = 45.9 GB``."""
        parts = [
            f"params {self.parameters / 1e9:.1f}",
            f"grads {self.gradients / 1e9:.1f}",
            f"optimizer {self.optimizer / 1e9:.1f}",
            f"activations {self.activations / 1e9:.1f}",
        ]
        if self.zero3_gathered:
            parts.append(f"ZeRO-3 gathered layers {self.zero3_gathered / 1e9:.1f}")
        return " + ".join(parts) + f" = {self.total / 1e9:.1f} GB"


def dense_shard_params(req: Requirements, plan: ParallelPlan) -> int:
    """Dense parameters of one GPU's model shard: ``ceil(Ψ_d/(tp·pp))``."""
    return math.ceil(req.dense_params / (plan.tp * plan.pp))


def expert_shard_params(req: Requirements, plan: ParallelPlan) -> int:
    """Routed-expert parameters on one GPU: ``ceil(Ψ_e/(tp·pp·ep))`` (0 when dense)."""
    return math.ceil(req.expert_params / (plan.tp * plan.pp * plan.ep))


def memory_per_gpu(req: Requirements, plan: ParallelPlan) -> MemoryPerGPU:
    """Parameters, gradients, optimizer state, activations (and ZeRO-3's gathered layers) on one
    GPU of the first pipeline stage (module docstring)."""
    dense = model_state_bytes(dense_shard_params(req, plan), plan.dp * plan.cp, plan.zero_stage)
    experts = model_state_bytes(
        expert_shard_params(req, plan), plan.dp * plan.cp // plan.ep, plan.zero_stage
    )
    gathered = 0.0
    if plan.zero_stage == 3:
        layer = req.dense_params / req.n_layers / plan.tp
        if req.is_moe:
            layer += req.expert_params / req.moe_layers / (plan.tp * plan.ep)
        gathered = 2 * 2 * layer  # two layers, bf16
    return MemoryPerGPU(
        float(dense.params + experts.params),
        float(dense.grads + experts.grads),
        float(dense.optimizer + experts.optimizer),
        activation_bytes_per_gpu(req, plan),
        gathered,
    )
