"""A training job as an interviewer states it: the model, the data, the cluster and the targets.

:class:`Requirements` is the first stage of the system-design answer ("what must the job do, on
what?"). The three presets are shaped like the Llama 2 models (Touvron et al. 2023, "Llama 2:
Open Foundation and Fine-Tuned Chat Models", Table 1: 80/40/32 layers, d = 8192/5120/4096, 4k
context) on clusters of the size such runs use; lab 14 walks through :data:`LLAMA_70B`.
:data:`LARGE_JOBS` (:mod:`dtlab.plan.large_jobs`) adds a Llama-3-405B-shaped dense job and a
DeepSeek-V3-shaped mixture of experts, whose extra fields (grouped-query K/V heads, routed
experts, a trimmed first and last pipeline stage) default to a dense Llama 2 model.

The **hardware is part of the job**: ``gpu`` (a :data:`dtlab.cost.GPUS` preset), ``gpus_per_node``
(the NVLink domain TP must stay inside), ``nics_per_node`` and ``nic_bytes_per_s`` (default: one
400 Gb/s NIC per GPU, rail-optimised) — :meth:`Requirements.on_fabric` copies a
:data:`dtlab.cost.hardware.FABRICS` preset in. The step-time model reads them everywhere.
The **shapes** the compute model needs (``d_ff``, a gated MLP's third matrix, the vocabulary,
an MoE's expert width, the attention width) default to a GPT layer (``d_ff = 4·d``, two MLP
matrices, no vocabulary counted). ``max_bubble`` and ``usable_memory_fraction`` are the job's
**policy**, defaults in :mod:`dtlab.plan.constants`; a rejection names the one it breaks. So are
``fp32_grads`` (numerics: FP32 gradient accumulation and reduction) and ``cp_kind`` (Llama 3
gathers K and V because its document masks are easier that way, Sec. 3.3.2): every plan the
search proposes carries them. ``software`` names the framework's techniques
(:data:`dtlab.plan.software.SOFTWARE`: ``"current"``, ``"megatron-lm-2022"``,
``"megatron-lm-2021"``): the search proposes only those, and a plan using another is refused.
``batch_ramp`` is a batch that grows during training (:mod:`dtlab.plan.batch_ramp`): every
stage must split into the plan's micro-batches, and the time to train prices each stage.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from dtlab.cost.alpha_beta import Link
from dtlab.cost.hardware import fabric
from dtlab.plan.constants import DEFAULT_MAX_BUBBLE, DEFAULT_USABLE_MEMORY_FRACTION


def fields_hash_once(obj) -> int:
    """A frozen dataclass's hash of its fields, computed once and kept on the instance: the
    planner hashes thousands of jobs and plans per search (the ``__hash__`` of both)."""
    cached = obj.__dict__.get("_hash")
    if cached is None:
        cached = hash(tuple(getattr(obj, f.name) for f in fields(obj)))
        object.__setattr__(obj, "_hash", cached)
    return cached


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
    usable_memory_fraction: float = DEFAULT_USABLE_MEMORY_FRACTION  # policy: share of HBM planned
    max_bubble: float = DEFAULT_MAX_BUBBLE  # policy: largest idle share of a step
    n_kv_heads: int = 0  # grouped-query attention's K/V heads; 0: as many as n_heads
    n_experts: int = 0  # routed experts per MoE layer; 0: a dense model
    top_k: int = 0  # routed experts per token
    expert_params: float = 0.0  # parameters of all routed experts, all layers together
    moe_layers: int = 0  # layers with routed experts (the rest have a dense MLP)
    pipeline_end_trim: int = 0  # layers fewer on the first and the last pipeline stage
    nics_per_node: int = 0  # 0: one NIC per GPU (rail-optimised)
    nic_bytes_per_s: float = 50e9  # one NIC, per direction (400 Gb/s)
    vocab_size: int = 0  # 0: embedding and head not priced apart from the layers
    d_ff: int = 0  # MLP width; 0: 4·d_model
    gated_mlp: bool = False  # SwiGLU: three MLP matrices instead of two
    expert_d_ff: int = 0  # a routed expert's width (MoE)
    shared_experts: int = 0  # experts every token runs through (MoE)
    attention_width: int = 0  # heads × head dim of Q·Kᵀ and A·V; 0: d_model
    node_limit: int = 0  # MoE: a token's experts on at most this many nodes; 0: no limit
    gemm_dtype: str = "bf16"  # "bf16" or "fp8" (DeepSeek-V3's linear layers)
    attention_saved_width: int = 0  # values/token attention keeps besides in/out; 0: Q, K, V
    comm_sm_fraction: float = 0.0  # SMs reserved for communication kernels (DeepSeek-V3: 20/132)
    mtp_layers: int = 0  # multi-token-prediction blocks (and heads) on the last stage
    flash_attention: bool = True  # False: scores through HBM (Megatron-LM 2021's GPTs)
    fp32_grads: bool = False  # policy: gradients accumulated and reduced in FP32 (Llama 3)
    cp_kind: str = "ring"  # requirement: "allgather" CP where document masks must work (Llama 3)
    software: str = "current"  # policy: the techniques its framework offers (dtlab.plan.software)
    batch_ramp: tuple[tuple[float, int], ...] = ()  # (tokens, batch tokens) before the final batch

    __hash__ = fields_hash_once

    @property
    def counts_tensors(self) -> bool:
        """Whether the job states its shapes (``d_ff``, a gated MLP or expert widths), so its
        activations are counted tensor by tensor instead of with Korthikanti's GPT layer."""
        return bool(self.d_ff or self.gated_mlp or (self.is_moe and self.expert_d_ff))

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
    def nics(self) -> int:
        """NICs per node: ``nics_per_node``, or one per GPU when 0."""
        return self.nics_per_node or self.gpus_per_node

    @property
    def nic(self) -> Link:
        """One NIC, per direction."""
        return Link(5e-6, self.nic_bytes_per_s, f"NIC {self.nic_bytes_per_s * 8 / 1e9:.0f} Gb/s")

    @property
    def ffn(self) -> int:
        """MLP width: ``d_ff``, or ``4·d_model``."""
        return self.d_ff or 4 * self.d_model

    @property
    def attn_width(self) -> int:
        """Width of the attention products: ``attention_width``, or ``d_model``."""
        return self.attention_width or self.d_model

    @property
    def embedding_params(self) -> float:
        """Input embedding plus an untied output head: ``2·vocab·d`` (0 without a vocabulary)."""
        return 2.0 * self.vocab_size * self.d_model

    def on_fabric(self, name: str) -> Requirements:
        """This job on the node type ``name`` of :data:`dtlab.cost.hardware.FABRICS`."""
        node = fabric(name)
        return replace(
            self,
            gpu=node.gpu,
            gpus_per_node=node.gpus_per_node,
            nics_per_node=node.nics_per_node,
            nic_bytes_per_s=node.nic.bandwidth_bytes_per_s,
        )

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
