"""Does this layout fit this model? Every rule, in one place, each saying what to choose instead.

The one home of layout validity: :class:`~dtlab.mesh.layout.Layout` (ep inside dp), the planner
(:mod:`dtlab.plan.problems`, :mod:`dtlab.plan.search`), the composed-layout check
(:mod:`dtlab.parallel.compose.checks`), every parallel family's own up-front check (tensor,
context, expert) and the labs ask the functions here. It is pure arithmetic — no torch, no
process — so the planner can import it without importing an executor, and the model
(:mod:`dtlab.models`) never does: the model knows nothing about parallelism.

Each parallelism cuts some dimension of the model into equal whole pieces:

=====  ======================================  ===============================================
dim    what it cuts                            so it must divide
=====  ======================================  ===============================================
tp     attention heads, KV heads, MLP width    ``n_heads``, ``n_kv_heads``, ``d_ff``; with
       (Shoeybi et al. 2019)                   sequence parallelism also ``seq_len``
pp     the blocks into stages                  at most ``n_layers`` (one block per stage)
cp     the sequence (ring: ``cp`` chunks;      ``seq_len``; ``seq_len / 2`` for zig-zag;
       zig-zag: ``2·cp`` chunks; Ulysses       Ulysses also the heads per tp rank
       re-shards heads; Jacobs et al. 2023)
ep     the experts of each MoE layer, on       ``n_experts``, and ``dp``
       ranks carved out of ``dp``
=====  ======================================  ===============================================

Each ``*_problems`` function takes plain numbers and returns the list of what is wrong ([] when
nothing is); :func:`model_layout_problems` runs the ones a GPT config needs and
:func:`validate_layout` raises them all at once.

Decisions where earlier copies of these rules disagreed:

* **TP and the vocabulary**: no rule. Tensor parallel pads a vocabulary ``tp`` does not divide
  to the next multiple of ``tp``, as Megatron-LM does
  (:func:`dtlab.parallel.tensor.embedding.padded_vocab_size`).
* **TP and d_model**: no separate rule: ``d_model = n_heads · head_dim``, so a ``tp`` that
  divides the heads divides ``d_model``.
* **TP and the KV heads**: dtlab's executor gives every TP rank whole KV heads, so compose and
  the tensor family check them. The planner prices production runs, where Megatron-LM
  replicates KV heads when ``tp`` exceeds them; it asks only about the query heads.
* **PP**: to *run*, a stage needs one block (``pp ≤ n_layers``; stages may be uneven,
  :func:`dtlab.models.balanced_stage_layers`). The planner *prices* equal stages, as Megatron-LM
  requires, so it adds :func:`equal_stage_problems` (``pp·v`` divides the layer slots).
* **CP**: ring and all-gather attention cut ``cp`` contiguous chunks (``cp | seq_len``);
  zig-zag cuts ``2·cp`` (``2·cp | seq_len``, Brandon et al. 2023; Llama 3 Sec. 3.3.2), which is
  what the planner assumes; Ulysses also needs ``cp`` to divide the heads each TP rank holds.
* **EP**: divides the experts *and* ``dp`` (experts are sharded over ranks that also split the
  batch); :class:`~dtlab.mesh.layout.Layout` itself refuses ``ep ∤ dp``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dtlab.mesh.divisors import choices, divisors

CP_STYLES = ("ring", "zigzag", "ulysses", "allgather")
"""``ring`` and ``allgather`` cut ``cp`` contiguous chunks, ``zigzag`` ``2·cp`` head-tail ones,
``ulysses`` contiguous chunks re-sharded by heads."""

LARGEST_CP_SUGGESTED = 64
"""Context-parallel degrees named as choices stop here: no published run goes beyond."""


def degree_problems(**degrees: Any) -> list[str]:
    """Every degree must be a whole number ≥ 1."""
    return [
        f"{name}={value!r}: every degree is a whole number ≥ 1"
        for name, value in degrees.items()
        if isinstance(value, bool) or not isinstance(value, int) or value < 1
    ]


def tensor_parallel_problems(
    tp: int, n_heads: int, n_kv_heads: int | None = None, d_ff: int | None = None
) -> list[str]:
    """TP shards the query heads, the KV heads (when given) and the MLP width (when given)."""
    problems = []
    kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if n_heads % tp:
        # kv_heads divides n_heads, so the degrees that keep both whole divide kv_heads.
        both = "" if kv_heads == n_heads else f", which also divide its {kv_heads} KV heads"
        problems.append(
            f"tp={tp} does not divide {n_heads} attention heads; choose "
            f"{choices(divisors(kv_heads))}{both}"
        )
    elif kv_heads % tp:
        more_kv = [k for k in divisors(n_heads) if k % tp == 0]
        verb = "exceeds" if tp > kv_heads else "does not divide"
        problems.append(
            f"tp={tp} {verb} {kv_heads} KV heads: every tensor-parallel rank needs whole KV heads; "
            f"choose tp = {choices(divisors(kv_heads))}, or n_kv_heads = {choices(more_kv)}"
        )
    if d_ff is not None and d_ff % tp:
        problems.append(
            f"tp={tp} does not divide d_ff={d_ff} (the MLP's hidden width, split by "
            f"columns); choose {choices(divisors(d_ff))} (or change d_ff)"
        )
    return problems


def sequence_parallel_problems(tp: int, seq_len: int) -> list[str]:
    """Sequence parallelism (Korthikanti et al. 2022) cuts the sequence into ``tp`` chunks."""
    if seq_len % tp == 0:
        return []
    return [
        f"sequence parallelism cuts seq_len={seq_len} into tp={tp} chunks; choose "
        f"tp from {choices(divisors(seq_len))} (or change seq_len, or turn SP off)"
    ]


def node_problems(tp: int, per_node: int, unit: str = "ranks") -> list[str]:
    """TP stays inside a node: its collectives sit between every layer's matmuls and need the
    node's links (NVLink), not the network (Shoeybi et al. 2019, Sec. 3). A TP degree that does
    not divide the node straddles it too: TP is innermost, so its groups are blocks of ``tp``
    consecutive ranks, and with 8 per node a TP group of 3 is ranks 6, 7, 8 on two nodes."""
    if tp <= per_node and per_node % tp == 0:
        return []
    if tp <= per_node:
        return [
            f"TP {tp} does not divide a node of {per_node} {unit}: its groups are blocks of {tp} "
            f"consecutive ranks, so some straddle two nodes and run tensor parallel's per-layer "
            f"collectives over the network; choose tp from {divisors(per_node)}"
        ]
    return [
        f"TP {tp} spans nodes: it is larger than a node of {per_node} {unit}, and tensor "
        f"parallel's collectives run between every layer's matmuls on the node's links "
        f"(NVLink); choose tp from {divisors(per_node)} and put the rest into pp or dp"
    ]


def ulysses_problems(cp: int, n_heads: int, n_kv_heads: int, tp: int = 1) -> list[str]:
    """Ulysses' all-to-all hands every cp rank whole heads of those each TP rank holds."""
    heads, kv_heads = n_heads // tp, n_kv_heads // tp
    if heads % cp == 0 and kv_heads % cp == 0:
        return []
    held = (
        f" each tensor-parallel rank holds (n_heads={n_heads}, n_kv_heads={n_kv_heads}, tp={tp})"
        if tp > 1
        else ""
    )
    return [
        f"Ulysses cp={cp} must divide the {heads} query and {kv_heads} KV heads{held}: its "
        f"all-to-all gives every cp rank whole heads; choose cp in "
        f"{divisors(math.gcd(heads, kv_heads))}, or use ring attention"
    ]


def context_parallel_problems(
    cp: int,
    seq_len: int,
    style: str = "ring",
    *,
    n_heads: int | None = None,
    n_kv_heads: int | None = None,
    tp: int = 1,
) -> list[str]:
    """CP cuts the sequence: ``cp`` chunks, ``2·cp`` for zig-zag; Ulysses (given the heads) also
    splits the heads each TP rank holds."""
    if style not in CP_STYLES:
        return [f"cp_style={style!r}; choose one of {CP_STYLES}"]
    if style == "zigzag":
        if seq_len % (2 * cp) == 0:
            return []
        fits = [c for c in divisors(seq_len) if seq_len % (2 * c) == 0] or [1]
        return [
            f"cp={cp} cannot split the {seq_len}-token sequence into 2·cp = {2 * cp} equal "
            "chunks (zig-zag: the split that balances causal attention over the ring); choose "
            f"cp from {[c for c in fits if c <= LARGEST_CP_SUGGESTED]} (or change seq_len)"
        ]
    problems = []
    if seq_len % cp:
        problems.append(
            f"cp={cp} does not divide seq_len={seq_len}: each context-parallel rank holds "
            f"seq_len/cp tokens; choose {choices(divisors(seq_len))} (or change seq_len)"
        )
    heads_known = n_heads is not None and n_kv_heads is not None
    if style == "ulysses" and heads_known and n_heads % tp == 0 and n_kv_heads % tp == 0:
        problems += ulysses_problems(cp, n_heads, n_kv_heads, tp)
    return problems


def pipeline_problems(pp: int, n_layers: int) -> list[str]:
    """To run, every pipeline stage needs at least one block (stages may be uneven)."""
    if pp <= n_layers:
        return []
    return [
        f"pp={pp} exceeds n_layers={n_layers}: every pipeline stage needs at least "
        f"one block; choose 1 to {n_layers} or add layers"
    ]


def equal_stage_problems(
    pp: int, virtual_stages: int, n_layers: int, end_trim: int = 0
) -> list[str]:
    """Equal stages, as Megatron-LM requires and the planner prices: ``pp·v`` model chunks
    divide the layer slots (``n_layers + 2·end_trim``, counting the first and last stage's
    trimmed slots); interleaving (``v > 1``) needs a pipeline."""
    problems = []
    chunks = pp * virtual_stages
    if (n_layers + 2 * end_trim) % chunks:
        trimmed = f" (+2·{end_trim} trimmed end slots)" if end_trim else ""
        problems.append(f"pp·v = {chunks} does not divide {n_layers} layers{trimmed}")
    if virtual_stages > 1 and pp == 1:
        problems.append("interleaving (virtual_stages > 1) needs a pipeline: pp >= 2")
    return problems


def expert_inside_dp_problems(ep: int, dp: int) -> list[str]:
    """EP ranks are carved out of the data-parallel ones, so ``ep`` divides ``dp``."""
    if dp % ep == 0:
        return []
    return [
        f"ep={ep} does not divide dp={dp}: experts are sharded across ranks "
        f"that also split the batch; choose ep from {divisors(dp)} or raise dp"
    ]


def expert_parallel_problems(
    ep: int, n_experts: int | None, dp: int | None = None, model: str = "the model"
) -> list[str]:
    """Every EP rank holds whole experts (``ep | n_experts``); with ``dp`` given, also
    ``ep | dp``, and the choices named are those that divide both."""
    problems = []
    if ep > 1 and not n_experts:
        problems.append(
            f"ep={ep} needs a mixture of experts, but {model} has no experts: use ep=1 "
            "(or pass n_experts, the experts per MoE layer)"
        )
    elif ep > 1 and n_experts % ep:
        fits = [e for e in divisors(n_experts) if dp is None or dp % e == 0]
        problems.append(
            f"ep={ep} does not divide n_experts={n_experts}: each expert-parallel rank holds "
            f"whole experts; choose ep from {fits}"
        )
    if dp is not None:
        problems += expert_inside_dp_problems(ep, dp)
    return problems


def model_layout_problems(
    config: Any,
    layout: object | None = None,
    *,
    tp: int | None = None,
    cp: int | None = None,
    pp: int | None = None,
    ep: int | None = None,
    cp_style: str = "ring",
    n_experts: int | None = None,
    sequence_parallel: bool = False,
) -> list[str]:
    """Every way the GPT ``config`` (a :class:`dtlab.models.GPTConfig`) cannot be split by this
    layout ([] when it can).

    Degrees come from ``layout``'s attributes (missing ones are 1), overridden by the keywords.
    ``cp_style`` is one of :data:`CP_STYLES`; ``n_experts`` is the number of experts per MoE
    layer (required when ``ep > 1``); ``sequence_parallel`` adds its rule on ``seq_len``.
    """
    given = {"tp": tp, "cp": cp, "pp": pp, "ep": ep}
    degrees = {
        name: value if value is not None else getattr(layout, name, 1)
        for name, value in given.items()
    }
    problems = degree_problems(**degrees)
    if problems:
        return problems
    if cp_style not in CP_STYLES:
        return [f"cp_style={cp_style!r}; choose one of {CP_STYLES}"]
    tp, cp, pp, ep = (degrees[n] for n in ("tp", "cp", "pp", "ep"))
    problems = tensor_parallel_problems(tp, config.n_heads, config.n_kv_heads, config.d_ff)
    if sequence_parallel:
        problems += sequence_parallel_problems(tp, config.seq_len)
    problems += context_parallel_problems(
        cp, config.seq_len, cp_style, n_heads=config.n_heads, n_kv_heads=config.n_kv_heads, tp=tp
    )
    problems += pipeline_problems(pp, config.n_layers)
    problems += expert_parallel_problems(ep, n_experts)
    return problems


def raise_problems(
    problems: list[str], heading: str = "this layout does not fit the model"
) -> None:
    """Raise ``ValueError``: the one problem as it is, several as a list under ``heading``."""
    if len(problems) == 1:
        raise ValueError(problems[0])
    if problems:
        raise ValueError(f"{heading}:\n" + "\n".join(f"  - {p}" for p in problems))


def validate_layout(config: Any, layout: object | None = None, **options: Any) -> None:
    """Raise ``ValueError`` naming every way ``config`` cannot be split by this layout
    (:func:`model_layout_problems`; same arguments)."""
    raise_problems(model_layout_problems(config, layout, **options))


def fit_check(config: Any, **options: Any) -> Callable[[object], None]:
    """A ``model_check`` for :meth:`dtlab.mesh.Layout.check`: :func:`validate_layout` of
    ``config`` with ``options`` — ``Layout(tp=2).check(2, model_check=fit_check(config))``."""
    return lambda layout: validate_layout(config, layout, **options)
