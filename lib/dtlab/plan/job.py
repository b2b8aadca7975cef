"""A training job as an interviewer states it: the model, the data, the cluster and the targets.

:class:`Requirements` is the first stage of the system-design answer ("what must the job do, on
what?"). The three presets are shaped like the Llama 2 models (Touvron et al. 2023, "Llama 2:
Open Foundation and Fine-Tuned Chat Models", Table 1: 80/40/32 layers, d = 8192/5120/4096, 4k
context) on clusters of the size such runs use; lab 14 walks through :data:`LLAMA_70B`.
:data:`LARGE_JOBS` (:mod:`dtlab.plan.large_jobs`) adds a Llama-3-405B-shaped dense job and a
DeepSeek-V3-shaped mixture of experts, whose extra fields (grouped-query K/V heads, routed
experts, a trimmed first and last pipeline stage) default to a dense Llama 2 model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Requirements:
    """What the job must do and what it runs on (sizes as in the Llama 2 paper's models)."""

    name: str
    params: float
    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    tokens: float  # training tokens
    global_batch_tokens: int  # tokens per optimizer step
    n_gpus: int
    gpu: str = "h100_sxm"  # a preset of dtlab.cost.GPUS
    gpus_per_node: int = 8
    mfu: float = 0.4
    per_gpu_mtbf_hours: float = 50_000.0  # ~Llama 3's 16k-GPU run: a failure every ~3 hours
    storage_write_bytes_per_s: float = 100e9  # aggregate checkpoint write bandwidth
    usable_memory_fraction: float = 0.9  # leave 10% for buffers, fragmentation, NCCL
    max_bubble: float = 0.15  # at most 15% of a step idle in the pipeline
    n_kv_heads: int = 0  # grouped-query attention's K/V heads; 0: as many as n_heads
    n_experts: int = 0  # routed experts per MoE layer; 0: a dense model
    top_k: int = 0  # routed experts per token
    expert_params: float = 0.0  # parameters of all routed experts, all layers together
    moe_layers: int = 0  # layers with routed experts (the rest have a dense MLP)
    pipeline_end_trim: int = 0  # layers fewer on the first and the last pipeline stage

    @property
    def global_batch_sequences(self) -> int:
        """Sequences per optimizer step: ``global_batch_tokens // seq_len``."""
        return self.global_batch_tokens // self.seq_len

    @property
    def is_moe(self) -> bool:
        """Whether the model routes tokens to experts (``n_experts > 1``)."""
        return self.n_experts > 1

    @property
    def kv_heads(self) -> int:
        """K/V heads: ``n_kv_heads``, or ``n_heads`` without grouped-query attention."""
        return self.n_kv_heads or self.n_heads

    @property
    def kv_width(self) -> int:
        """Width of K (and of V) per token: ``kv_heads · d_model / n_heads``."""
        return self.kv_heads * self.d_model // self.n_heads

    @property
    def dense_params(self) -> float:
        """Parameters every token uses and every data-parallel rank holds: all but the routed
        experts (attention, embeddings, dense and shared-expert MLPs, norms, router)."""
        return self.params - self.expert_params

    @property
    def active_params(self) -> float:
        """Parameters one token runs through: the dense ones plus ``top_k/n_experts`` of the
        routed experts' (the ``N`` of ``6·N·T`` for an MoE model; ``params`` when dense)."""
        if not self.is_moe:
            return self.params
        return self.dense_params + self.expert_params * self.top_k / self.n_experts

    @property
    def pipeline_layer_slots(self) -> int:
        """Layers as the pipeline splits them: ``n_layers + 2·pipeline_end_trim`` (the first and
        last stage each count ``pipeline_end_trim`` empty slots, their embedding and head)."""
        return self.n_layers + 2 * self.pipeline_end_trim


LLAMA_70B = Requirements("70B on 2048 H100", 70e9, 80, 8192, 64, 4096, 2e12, 4 * 2**20, 2048)
LLAMA_13B = Requirements(
    "13B on 256 A100-80GB",
    13e9,
    40,
    5120,
    40,
    4096,
    1e12,
    4 * 2**20,
    256,
    gpu="a100_80gb",
    mfu=0.45,
)
LLAMA_7B = Requirements("7B on 64 H100", 7e9, 32, 4096, 32, 4096, 1e12, 2 * 2**20, 64)
JOBS = (LLAMA_70B, LLAMA_13B, LLAMA_7B)
"""The jobs lab 14 plans: 70B on 2,048 H100, 13B on 256 A100-80GB, 7B on 64 H100."""
