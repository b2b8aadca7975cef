"""The two jobs at the frontier: a 405B dense model on 16,384 H100 and a 671B mixture of experts.

Facts from the papers; every other number is this module's assumption and says so.

* :data:`LLAMA3_405B` — Dubey et al. 2024, "The Llama 3 Herd of Models": 405B parameters, 126
  layers, d_model 16,384, 128 heads with 8 K/V heads (Table 3), 8,192-token context, 16,384 H100
  GPUs and a 16M-token batch (Table 4: TP 8, CP 1, PP 16, DP 128 at 38–43 % BF16 MFU), 15.6T
  tokens; the pipeline drops one layer from its first and its last stage, which also hold the
  embedding and the output head (Sec. 3.3.2), so 126 layers split as 128 slots. FFN 53,248
  (SwiGLU), vocabulary 128,256 (Table 3).
* :data:`DEEPSEEK_V3` — DeepSeek-AI 2024, "DeepSeek-V3 Technical Report": 671B parameters of
  which 37B are active per token, 61 layers, d_model 7,168, 128 heads; every layer but the first
  three is MoE with 1 shared and 256 routed experts of intermediate size 2,048, 8 routed per
  token (Sec. 4.2); 14.8T tokens at sequence length 4,096 and a batch of 15,360 sequences
  (after the ramp); 2,048 H800 GPUs with PP 16, EP 64 over 8 nodes and ZeRO-1 data parallelism,
  no TP (Sec. 3.2). Assumptions: the routed experts' parameters are computed from those shapes
  (58 layers · 256 · 3·7,168·2,048 = 654B: SwiGLU's three matrices; the 37B active agrees);
  on ``h800_sxm`` (the H100's compute, NVLink cut to 400 GB/s bidirectional); dense layers'
  FFN 18,432, one shared expert, vocabulary 129,280, at most 4 nodes per token, FP8 GEMMs, 20
  of 132 SMs for communication, one multi-token-prediction block; multi-head latent attention
  priced as attention of width 20,480 (128 heads of 192 for ``Q·Kᵀ`` and 128 for ``A·V``,
  averaged) that keeps its latents (1,536 + 576 per token) for backward
  (:mod:`dtlab.plan.published` cites the sections).
"""

from __future__ import annotations

from dtlab.plan.job import LLAMA_7B, LLAMA_70B, Requirements

DEEPSEEK_V3_EXPERT_PARAMS = 58 * 256 * 3 * 7168 * 2048
"""Routed-expert parameters of DeepSeek-V3: 58 MoE layers × 256 experts × SwiGLU 3·d·2048."""

LLAMA3_405B = Requirements(
    "405B on 16384 H100",
    405e9,
    126,
    16384,
    128,
    8192,
    15.6e12,
    16 * 2**20,
    16384,
    n_kv_heads=8,
    pipeline_end_trim=1,
    vocab_size=128_256,
    d_ff=53_248,
    gated_mlp=True,
)
DEEPSEEK_V3 = Requirements(
    "671B MoE (37B active) on 2048 H800",
    671e9,
    61,
    7168,
    128,
    4096,
    14.8e12,
    15360 * 4096,
    2048,
    n_experts=256,
    top_k=8,
    expert_params=float(DEEPSEEK_V3_EXPERT_PARAMS),
    moe_layers=58,
    gpu="h800_sxm",
    vocab_size=129_280,
    d_ff=18_432,
    gated_mlp=True,
    expert_d_ff=2048,
    shared_experts=1,
    attention_width=20_480,
    node_limit=4,
    gemm_dtype="fp8",
    attention_saved_width=1536 + 576,
    comm_sm_fraction=20 / 132,
    mtp_layers=1,
)
LARGE_JOBS = (LLAMA3_405B, DEEPSEEK_V3)
"""The frontier jobs lab 11 plans end to end (lab 14's :data:`~dtlab.plan.job.JOBS` are kept)."""

CAPSTONE_JOBS = (LLAMA_7B, LLAMA_70B, LLAMA3_405B, DEEPSEEK_V3)
"""The capstone's 7B, 70B and 405B and one large MoE, smallest first."""
