"""Megatron-LM's GPT models on Selene, as jobs: GPT-3 175B, MT-NLG 530B and the 1T model.

Selene (Narayanan et al. 2021, Sec. 5; Korthikanti et al. 2022, Sec. 6): DGX A100 nodes, eight
80 GB A100s on NVSwitch, eight 200 Gb/s HDR InfiniBand NICs per node (25 GB/s each, one per
GPU). Every model has sequence length 2,048 and vocabulary 51,200, and its parameters count as
``12·L·h² + (V + s)·h`` (layers, embeddings and positions). Megatron-LM of 2021 and 2022 had no
flash attention: the scores go through HBM (``flash_attention=False``).

* :data:`GPT3_175B` — 96 layers, h 12,288, 96 heads; the 2021 paper's batch of 1,536
  sequences on 384 GPUs (Table 2).
* :data:`GPT_1T` — 128 layers, h 25,600, 160 heads; batch 3,072 on 3,072 GPUs (Table 1).
* :data:`MT_NLG_530B` — 105 layers, h 20,480, 128 heads (Smith et al. 2022; Korthikanti et al.
  2022, Table 3).
* :func:`fig13_gpt_162b` — the 32-layer, h 20,480, 128-head GPT (162.2B) of Narayanan et al.
  2021's Fig. 13 on 64 GPUs, which swept (t, p) at batch 32 and 128 and measured its peak at
  ``t = 8``, the GPUs of one server.
* :func:`fig14_gpt_5_9b` — the 32-layer, h 3,840, 32-head GPT (5.9B) of Figs. 14 and 15 on 64
  GPUs, which traded data parallelism for pipeline (Fig. 14) or tensor (Fig. 15) parallelism
  at batch 32, 128 and 512 and measured throughput falling as either grew.

Policy (each paper's, as far as it states one): 90 % of HBM planned, no bubble cap (the papers
report throughput whatever the bubble), and the software of the 2021 paper
(``"megatron-lm-2021"``, :mod:`dtlab.plan.software`: no sequence parallelism, no selective
recomputation); Korthikanti et al. 2022's rows give their jobs ``"megatron-lm-2022"``.
"""

from __future__ import annotations

from dataclasses import replace

from dtlab.plan.job import Requirements


def gpt_params(layers: int, hidden: int, vocab: int = 51_200, seq: int = 2048) -> int:
    """``12·L·h² + (V + s)·h``: a GPT's layers, token embedding and learned positions."""
    return 12 * layers * hidden**2 + (vocab + seq) * hidden


GPT3_175B = Requirements(
    "GPT-3 175B (Megatron-LM 2021)",
    gpt_params(96, 12288),
    96,
    12288,
    96,
    2048,
    300e9,
    1536 * 2048,
    384,
    gpu="a100_80gb",
    nic_bytes_per_s=25e9,
    vocab_size=51_200,
    max_bubble=1.0,
    flash_attention=False,
    software="megatron-lm-2021",
)


def selene_gpt(
    name: str, layers: int, hidden: int, heads: int, gpus: int, batch: int | None = None
) -> Requirements:
    """GPT-3 175B's job with another shape, on ``gpus`` GPUs with a batch of ``batch``
    sequences (default: as many as GPUs)."""
    return replace(
        GPT3_175B,
        name=name,
        params=gpt_params(layers, hidden),
        n_layers=layers,
        d_model=hidden,
        n_heads=heads,
        global_batch_tokens=(batch or gpus) * 2048,
        n_gpus=gpus,
    )


GPT_1T = selene_gpt("GPT 1T (Megatron-LM 2021)", 128, 25600, 160, 3072)
MT_NLG_530B = selene_gpt("MT-NLG 530B", 105, 20480, 128, 280)
SELENE_MODELS = (GPT3_175B, MT_NLG_530B, GPT_1T)
"""The three GPT shapes Megatron-LM ran on Selene, smallest first."""


def fig13_gpt_162b(batch: int) -> Requirements:
    """Narayanan et al. 2021, Fig. 13's job: the 162.2B GPT on 64 GPUs with ``batch`` sequences
    (32 or 128), swept over ``(t, p)`` with ``t·p = 64`` and no data parallelism."""
    return selene_gpt(f"GPT 162B, batch {batch}, 64 A100", 32, 20480, 128, 64, batch)


def fig14_gpt_5_9b(batch: int) -> Requirements:
    """Narayanan et al. 2021, Figs. 14 and 15's job: the 5.9B GPT on 64 GPUs with ``batch``
    sequences (32, 128 or 512), micro-batch 1, swept over ``(p, d)`` and ``(t, d)`` with
    ``p·d = t·d = 64``."""
    return selene_gpt(f"GPT 5.9B, batch {batch}, 64 A100", 32, 3840, 32, 64, batch)
