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
* **Activations**: :func:`~dtlab.plan.layout_cost.activation_bytes_by_device` — per-layer bytes
  for ``s/cp`` tokens under the plan's recomputation, times what the schedule keeps in flight,
  plus the working set of the one layer whose backward reruns its forward.
* **Per device, the worst one reported**: stages hold different layers (trimmed ends, uneven
  cuts, the embedding on the first and the head on the last, DualPipe's two copies), so every
  device is priced and :func:`memory_per_gpu` returns the one with the largest total.
* **The software's own optimizer**: Megatron-LM of 2021 held 20 B per parameter without ZeRO
  (an FP32 copy of every FP16 gradient; 18 B with FP32 accumulation: :func:`state_by_category`).
* **Options**: ``fp32_grad_accum`` (4 B gradients), ``reshard_after_forward=False`` (ZeRO-3
  that keeps gathered weights through the step: ZeRO-1's memory; Llama 3's FSDP).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dtlab.plan.job import Requirements
from dtlab.plan.layout_cost import activation_bytes_by_device
from dtlab.plan.parallel_plan import ParallelPlan
from dtlab.plan.software import software_of
from dtlab.plan.stages import held_layers, holds_head, representative_devices


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
    """Dense parameters of one GPU's model shard on its pipeline device with the most:
    ``ceil(Ψ_d/(tp·pp))`` for equal stages (:func:`held_params` in general)."""
    return math.ceil(max(held_params(req, plan, i)[0] for i in range(plan.pp)))


def expert_shard_params(req: Requirements, plan: ParallelPlan) -> int:
    """Routed-expert parameters on one GPU: ``ceil(Ψ_e/(tp·pp·ep))`` (0 when dense)."""
    return math.ceil(max(held_params(req, plan, i)[1] for i in range(plan.pp)))


def held_params(req: Requirements, plan: ParallelPlan, device: int) -> tuple[float, float]:
    """(dense, routed-expert) parameters one GPU of pipeline device ``device`` holds: its
    layers' share (:func:`dtlab.plan.stages.held_layers`) of the layer parameters over ``tp``
    (experts also over ``ep``), plus the embedding on the first device and the head on the
    last (``vocab·d`` each, when the job gives a vocabulary)."""
    layers = held_layers(req, plan)[device]
    dense_layers = req.dense_params - req.embedding_params
    dense = dense_layers * layers / req.n_layers
    if holds_head(plan, device) or plan.pp == 1:
        dense += req.embedding_params / 2
    if device == 0:
        dense += req.embedding_params / 2
    experts = req.expert_params * layers / req.n_layers / plan.ep
    return dense / plan.tp, experts / plan.tp


def state_by_category(
    params: float, ranks: int, plan: ParallelPlan, fp32_main_grads: bool = False
) -> tuple[float, float, float]:
    """(parameters, gradients, optimizer) bytes of ``params`` sharded over ``ranks``: bf16
    weights 2 B, gradients 2 B (4 B with ``fp32_grad_accum``), FP32 master and Adam's two
    moments 12 B; ZeRO-1 shards the 12, ZeRO-2 the gradients too, ZeRO-3 the weights too —
    unless ``reshard_after_forward`` is off, when the weights stay gathered through the step
    and the gradients accumulate unsharded (ZeRO-1's memory). ``fp32_main_grads`` adds 4 B of
    gradient per parameter without ZeRO when the gradients are 16-bit: Megatron-LM's FP16
    optimizer of 2021 (``Float16OptimizerWithFloat16Params``) gave every FP32 master weight an
    FP32 copy of its FP16 gradient (``main_param.grad = model_param.main_grad.float()``) and its
    ``zero_grad`` never freed it, so a GPU held 20 B per parameter through the whole step. With
    FP32 accumulation (``fp32_grad_accum``) the gradient is already FP32, ``.float()`` returns
    it, and the copy costs nothing: 18 B."""
    grad_bytes = 4 if plan.fp32_grad_accum else 2
    if fp32_main_grads and plan.zero_stage == 0 and not plan.fp32_grad_accum:
        grad_bytes += 4
    stage = plan.zero_stage
    if stage == 3 and not plan.reshard_after_forward:
        stage = 1
    weights = 2 * params / (ranks if stage >= 3 else 1)
    grads = grad_bytes * params / (ranks if stage >= 2 else 1)
    optimizer = 12 * params / (ranks if stage >= 1 else 1)
    return weights, grads, optimizer


def memory_by_device(
    req: Requirements, plan: ParallelPlan, devices: tuple[int, ...] | None = None
) -> list[MemoryPerGPU]:
    """:class:`MemoryPerGPU` for one GPU of each pipeline device in ``devices`` (default all;
    module docstring)."""
    activations = activation_bytes_by_device(req, plan)
    main_grads = software_of(req).fp32_main_grads
    rows = []
    for device in range(plan.pp) if devices is None else devices:
        dense, experts = held_params(req, plan, device)
        d = state_by_category(dense, plan.dp * plan.cp, plan, main_grads)
        e = state_by_category(experts, max(1, plan.dp * plan.cp // plan.ep), plan, main_grads)
        gathered = 0.0
        if plan.zero_stage == 3 and plan.reshard_after_forward:
            layer = (req.dense_params - req.embedding_params) / req.n_layers / plan.tp
            if req.is_moe:
                layer += req.expert_params / req.moe_layers / (plan.tp * plan.ep)
            gathered = 2 * 2 * layer  # two layers, bf16
        rows.append(
            MemoryPerGPU(d[0] + e[0], d[1] + e[1], d[2] + e[2], activations[device], gathered)
        )
    return rows


def memory_per_gpu(req: Requirements, plan: ParallelPlan) -> MemoryPerGPU:
    """Parameters, gradients, optimizer state, activations (and ZeRO-3's gathered layers) on one
    GPU of the pipeline device whose total is largest — with trimmed or uneven stages the peak
    is rarely on stage 0 (module docstring)."""
    worst_candidates = representative_devices(req, plan)
    return max(memory_by_device(req, plan, worst_candidates), key=lambda m: m.total)
