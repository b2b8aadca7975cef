"""The planner's prediction of the activation memory one rank of a composed lab GPT holds: the
peak of bytes saved for backward during one training step, from the config and layout alone.

What is counted — exactly what :class:`dtlab.memory.ActivationMeter` sees through autograd's
saved-tensor hooks (parameters and the global batch the caller passed excluded):

* **blocks** — per block and micro-batch,
  :func:`dtlab.memory.activation_families.lab_layer_families` (Korthikanti et al. 2022,
  "Reducing Activation Recomputation in Large Transformer Models", §4, derived for the lab GPT)
  at the rank's micro-batch ``b = B/(dp·m)`` and tokens ``s = S/cp``, with TP degree ``t`` (and
  sequence parallelism), without or with selective recomputation of the attention core (which
  drops ``scores`` and ``causal_mask``). Under context parallelism the attention core is ring
  attention (:mod:`dtlab.parallel.context.ring`), which keeps no ``s × s`` block: ``scores``
  and ``causal_mask`` vanish and the core keeps its output and log-sum-exp beside q, k, v:
  ``qkv`` gains ``b·s·d/t·e + b·(a/t)·s·e``.
* **embedding** (first stage) — the token ids the embedding keeps when the step made its own copy
  (``8·b·s``: the vocabulary-parallel shard's local ids under TP, the CP shard's tokens), the
  out-of-shard mask under TP (``b·s`` bools).
* **head** (last stage) — the final LayerNorm's input and fp32 statistics (sequence-sharded under
  SP) and the LM head's input ``b·s·d·e``.
* **loss** (last stage) — the softmax of the rank's logits ``b·s·V/t·e``; under TP the
  vocabulary-parallel loss' local targets (``8·b·s``) and mask (``b·s``); else the targets when CP
  copied them, and one scalar.
* **positions** — without CP the first stage's position embedding keeps ``8·s`` int64 per
  micro-batch (with selective recomputation every stage does: the recomputed cores keep their
  inputs, the positions among them, one storage shared by the stage's blocks); under CP one
  ``8·s`` positions tensor serves every block, stage and micro-batch of the step (ring
  attention keeps it): counted once.

Dropout is 0 (the prediction refuses others: dropout's masks depend on the kernel, see
:func:`~dtlab.memory.activation_families.dropout_mask_bytes`).

The pipeline multiplies the per-micro-batch bytes by the micro-batches stage ``k`` holds at its
peak (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", §2.2): ``min(pp − k, m)`` for 1F1B (one backward per new forward after the warm-up),
``m`` for GPipe (every forward before the first backward). A stage's received activation is the
first LayerNorm's saved input, already in ``layernorm``.
"""

from __future__ import annotations

from dtlab.memory.activation_families import lab_layer_families
from dtlab.mesh import Layout
from dtlab.models import GPTConfig
from dtlab.models.pipeline_stages import balanced_stage_layers

CATEGORIES = ("blocks", "embedding", "head", "loss", "positions")
SCHEDULES = ("1f1b", "gpipe")
RECOMPUTE = ("none", "selective")


def micro_batches_in_flight(schedule: str, pp: int, pp_rank: int, n_micro: int) -> int:
    """Micro-batches whose activations stage ``pp_rank`` holds at its peak."""
    if pp == 1:
        return 1
    if schedule == "1f1b":
        return min(pp - pp_rank, n_micro)
    if schedule == "gpipe":
        return n_micro
    raise ValueError(f"schedule={schedule!r}: the prediction covers {SCHEDULES}")


def block_bytes(
    config: GPTConfig,
    layout: Layout,
    micro_batch: int,
    *,
    sequence_parallel: bool = False,
    bytes_per_element: int = 4,
    recompute: str = "none",
) -> dict[str, int]:
    """One block's saved bytes for one micro-batch on one rank, by family."""
    s, t, e = config.seq_len // layout.cp, layout.tp, bytes_per_element
    if config.dropout:
        raise ValueError(f"dropout={config.dropout}: the prediction covers dropout=0.0")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r}: the prediction covers {RECOMPUTE}")
    families = lab_layer_families(
        config, micro_batch, s, t, sequence_parallel, e, recompute, training=True
    )
    families["positions"] = 0  # one storage for every block: counted per stage, not per block
    if layout.cp > 1:
        if recompute != "none":
            raise ValueError(f"recompute={recompute!r} with cp={layout.cp}: use recompute='none'")
        families["scores"] = families["causal_mask"] = 0
        families["qkv"] += micro_batch * s * config.d_model // t * e  # the core's output
        families["qkv"] += micro_batch * (config.n_heads // t) * s * e  # its log-sum-exp
    return families


def per_micro_batch_bytes(
    config: GPTConfig,
    layout: Layout,
    *,
    global_batch: int,
    pp_rank: int = 0,
    n_micro: int = 1,
    sequence_parallel: bool = False,
    bytes_per_element: int = 4,
    recompute: str = "none",
) -> dict[str, int]:
    """Bytes one micro-batch leaves saved on a rank of stage ``pp_rank``, by category
    (under CP ``positions``, shared by the whole step, is left to the caller)."""
    t, cp, dp, pp, e = layout.tp, layout.cp, layout.dp, layout.pp, bytes_per_element
    m = n_micro if pp > 1 else 1
    if global_batch % (dp * m):
        raise ValueError(f"global_batch={global_batch} must split over dp={dp} × m={m}")
    b, s, d, v = global_batch // (dp * m), config.seq_len // cp, config.d_model, config.vocab_size
    u = t if sequence_parallel else 1
    layers = len(balanced_stage_layers(config.n_layers, pp)[pp_rank])
    one = block_bytes(
        config, layout, b, sequence_parallel=sequence_parallel, bytes_per_element=e,
        recompute=recompute,
    )  # fmt: skip
    out = dict.fromkeys(CATEGORIES, 0)
    out["blocks"] = layers * sum(one.values())
    copied_ids = t > 1 or cp > 1
    if pp_rank == 0:
        out["embedding"] = 8 * b * s * copied_ids + b * s * (t > 1)
    if cp == 1 and (pp_rank == 0 or recompute == "selective"):
        out["positions"] = 8 * s  # one per stage forward: the embedding's, the regions' inputs
    if pp_rank == pp - 1:
        out["head"] = b * s * d * e // u + 2 * (b * s // u) * 4 + b * s * d * e
        out["loss"] = b * s * -(-v // t) * e  # the padded vocabulary: ⌈V/t⌉ logits per token
        out["loss"] += 9 * b * s if t > 1 else 8 * b * s * (cp > 1) + e
    return out


def predicted_activation_bytes(
    config: GPTConfig,
    layout: Layout,
    *,
    global_batch: int,
    pp_rank: int = 0,
    n_micro: int = 1,
    sequence_parallel: bool = False,
    schedule: str = "1f1b",
    bytes_per_element: int = 4,
    recompute: str = "none",
) -> dict[str, int]:
    """The peak bytes saved for backward on one rank of stage ``pp_rank``, by category: one
    micro-batch's bytes (:func:`per_micro_batch_bytes`) times the micro-batches in flight at the
    stage's peak (:func:`micro_batches_in_flight`), plus the step's shared CP positions."""
    if not 0 <= pp_rank < layout.pp:
        raise ValueError(f"pp_rank={pp_rank} is not a stage of pp={layout.pp}")
    held = micro_batches_in_flight(schedule, layout.pp, pp_rank, n_micro)
    one = per_micro_batch_bytes(
        config, layout, global_batch=global_batch, pp_rank=pp_rank, n_micro=n_micro,
        sequence_parallel=sequence_parallel, bytes_per_element=bytes_per_element,
        recompute=recompute,
    )  # fmt: skip
    out = {category: held * nbytes for category, nbytes in one.items()}
    if layout.cp > 1:
        out["positions"] = 8 * config.seq_len // layout.cp
    return out
