"""The planner's prediction for one training step of the lab GPT on a composed mesh: bytes each
rank sends, per group and per collective — the numbers :func:`dtlab.parallel.compose.compose_gpt`
run with ``collectives="dtlab"`` must then count, message by message.

Notation: ``e`` bytes per element, ``b = B/dp`` sequences per dp rank cut into ``m``
micro-batches of ``b_m = b/m`` (``m = 1`` without a pipeline), ``s = S/cp`` tokens per CP rank,
``d`` the width, ``t`` the TP degree, ``L_k`` the blocks of this rank's pipeline stage, and
``AR(P, N) = 2(N−1)/N·P``, ``AG(P, N) = RS(P, N) = (N−1)/N·P`` the ring's bytes for a ``P``-byte
tensor over ``N`` ranks (exact when ``N`` divides the element count, as in the tests).

=========  ==========================================================================================
group      what each rank sends in one step
=========  ==========================================================================================
tp         without SP, per block and micro-batch: 4 all-reduces of ``b_m·s·d·e`` (Megatron's g in
           forward after attention and MLP, f's backward before them); the vocabulary-parallel
           embedding's forward all-reduce and the LM head's f in backward, one ``b_m·s·d·e`` each
           (first and last stage); the vocab-parallel loss' 3 all-reduces of ``b_m·s`` values
           (max, sum of exponentials, target logit) in the logits' dtype, at least FP32. With SP the block's all-reduces become an
           all-gather and a reduce-scatter each (same bytes, split), the embedding's a
           reduce-scatter (and its all-gather in backward), the head's an all-gather (and a
           reduce-scatter in backward); plus one all-reduce of the replicated parameters'
           partial gradients (norms, row-parallel biases, positions).
cp         ring attention per block and micro-batch: ``(N−1)(kv + p)`` forward and
           ``(N−1)(kv + p) + N·kv`` backward (:mod:`dtlab.parallel.context.ring`), ``kv`` the
           rank's k and v (``2·b_m·s·kv_width/t·e``), ``p`` its positions (``8·s``); then the
           gradient average, one all-reduce of this rank's parameters.
pp         the schedule's sends: ``m`` activations of ``b_m·s·d·e`` forward unless last stage,
           ``m`` gradients of the same size backward unless first stage.
embedding  tied embedding with pp > 1: one all-reduce of the embedding shard ``V·d/t·e`` over
           the first and last stage.
dp         ``"ddp"``: one all-reduce of this rank's parameters; ``"fsdp"``: per unit (each block,
           and the root) two all-gathers and one reduce-scatter of the unit padded to a multiple
           of ``dp`` (:mod:`dtlab.parallel.zero.fsdp`).
=========  ==========================================================================================
"""

from __future__ import annotations

import math

from dtlab.mesh import Layout
from dtlab.models import GPTConfig
from dtlab.models.pipeline_stages import balanced_stage_layers

Traffic = dict[str, dict[str, int]]


def _ar(payload: int, n: int) -> int:
    return 2 * (n - 1) * payload // n


def _half(payload: int, n: int) -> int:
    return (n - 1) * payload // n


def block_params(config: GPTConfig, tp: int) -> tuple[int, int]:
    """``(tp-sharded, replicated)`` parameters of one block on one TP rank."""
    d, kv, ff, bias = config.d_model, config.kv_width, config.d_ff, config.bias
    norm = 2 * d if bias else d
    sharded = 2 * d * d + 2 * d * kv + 2 * d * ff + ((d + 2 * kv + ff) if bias else 0)
    replicated = 2 * norm + (2 * d if bias else 0)
    return sharded // tp, replicated


def vocab_rows_per_rank(vocab_size: int, tp: int) -> int:
    """Rows of the embedding (and head) each TP rank holds: the vocabulary is padded to a
    multiple of ``tp`` when ``tp`` does not divide it (as Megatron-LM does), so ``⌈V/tp⌉``."""
    return -(-vocab_size // tp)


def stage_params(config: GPTConfig, tp: int, pp: int, stage: int) -> list[int]:
    """Parameters of each FSDP unit of a stage on one TP rank: its blocks, then the root (the
    embeddings on the first stage, the final norm and head on the last)."""
    sharded, replicated = block_params(config, tp)
    layers = balanced_stage_layers(config.n_layers, pp)[stage]
    units = [sharded + replicated for _ in layers]
    root = 0
    vocab = vocab_rows_per_rank(config.vocab_size, tp) * config.d_model
    if stage == 0:
        root += vocab + config.seq_len * config.d_model
    if stage == pp - 1:
        root += (2 if config.bias else 1) * config.d_model
        if not config.tie_embeddings or pp > 1:  # a stage of its own holds the tied copy too
            root += vocab
    return [*units, root]


def parameters_per_rank(config: GPTConfig, layout: Layout, pp_rank: int = 0) -> int:
    """Parameters one rank of stage ``pp_rank`` holds (before any FSDP sharding)."""
    return sum(stage_params(config, layout.tp, layout.pp, pp_rank))


def predicted_state_bytes(
    config: GPTConfig,
    layout: Layout,
    *,
    pp_rank: int = 0,
    data_parallel: str = "ddp",
    bytes_per_element: int = 4,
) -> dict[str, int]:
    """Model state one rank holds after an AdamW step, by category: its parameters, their
    gradients and Adam's two moments (all in the parameters' dtype, as ``torch.optim.AdamW``
    keeps them); FSDP divides each unit by ``dp`` (rounded up: the flat shard is padded)."""
    units = stage_params(config, layout.tp, layout.pp, pp_rank)
    if data_parallel == "fsdp":
        units = [math.ceil(u / layout.dp) for u in units]
    params = sum(units) * bytes_per_element
    return {"parameters": params, "gradients": params, "optimizer": 2 * params}


def _fsdp_bytes(units: list[int], dp: int, e: int) -> int:
    return sum(3 * (dp - 1) * math.ceil(u / dp) * e for u in units)


def predicted_traffic(
    config: GPTConfig,
    layout: Layout,
    *,
    global_batch: int,
    pp_rank: int = 0,
    n_micro: int = 1,
    sequence_parallel: bool = False,
    data_parallel: str = "ddp",
    bytes_per_element: int = 4,
) -> Traffic:
    """Bytes one rank of pipeline stage ``pp_rank`` sends in one training step, by group and
    collective (groups of size 1 omitted). Ring attention for CP (``"ring"``/``"zigzag"``)."""
    e, t, cp, dp, pp = bytes_per_element, layout.tp, layout.cp, layout.dp, layout.pp
    m = n_micro if pp > 1 else 1
    b_m, s, d = global_batch // dp // m, config.seq_len // cp, config.d_model
    act = b_m * s * d * e
    first, last = pp_rank == 0, pp_rank == pp - 1
    layers = len(balanced_stage_layers(config.n_layers, pp)[pp_rank])
    units = stage_params(config, t, pp, pp_rank)
    params = sum(units)
    traffic: Traffic = {}

    if t > 1:
        ends = int(first) + int(last)  # embedding forward, LM head backward
        # the logits' dtype, but 16-bit logits are upcast to FP32 before the loss' all-reduces
        loss = 3 * _ar(b_m * s * max(e, 4), t) if last else 0
        if sequence_parallel:
            one = _half(act, t)
            tp_ops = {"all_gather": (4 * layers + ends) * m * one}
            tp_ops["reduce_scatter"] = (4 * layers + ends) * m * one
            sharded, replicated = block_params(config, t)
            partial = layers * replicated
            partial += config.seq_len * d if first else 0
            partial += (2 if config.bias else 1) * d if last else 0
            tp_ops["all_reduce"] = loss * m + _ar(partial * e, t)
        else:
            tp_ops = {"all_reduce": (4 * layers + ends) * m * _ar(act, t) + loss * m}
        traffic["tp"] = tp_ops
    if cp > 1:
        kv = 2 * b_m * s * (config.kv_width // t) * e
        positions = 8 * s
        ring = (cp - 1) * (kv + positions) * 2 + cp * kv
        traffic["cp"] = {"ring_send": layers * m * ring, "ring_recv": 0}
        traffic["cp"]["all_reduce"] = _ar(params * e, cp)
    if pp > 1:
        sends = (0 if last else m) + (0 if first else m)
        traffic["pp"] = {"send": sends * act, "recv": 0}  # a message is counted once, at its sender
        if config.tie_embeddings and (first or last):
            traffic["embedding"] = {
                "all_reduce": _ar(vocab_rows_per_rank(config.vocab_size, t) * d * e, 2)
            }
    if dp > 1:
        if data_parallel == "ddp":
            traffic["dp"] = {"all_reduce": _ar(params * e, dp)}
        elif data_parallel == "fsdp":
            per = _fsdp_bytes(units, dp, e)
            traffic["dp"] = {"all_gather": 2 * per // 3, "reduce_scatter": per // 3}
        else:
            raise ValueError(f"data_parallel={data_parallel!r}: the prediction covers ddp, fsdp")
    return traffic
