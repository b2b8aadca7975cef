"""Will this GPT split this way? The model's limits on a parallel layout, checked before any
process starts (torchtitan validates its config up front the same way).

Each parallelism cuts some dimension of the model into equal whole pieces:

=====  ======================================  ===============================================
dim    what it cuts                            so it must divide
=====  ======================================  ===============================================
tp     attention heads, KV heads, MLP width    ``n_heads``, ``n_kv_heads``, ``d_ff``
       (Shoeybi et al. 2019)
pp     the blocks into stages                  at most ``n_layers`` (one block per stage)
cp     the sequence (ring: ``cp`` chunks;      ``seq_len``; ``seq_len / 2`` for zig-zag;
       zig-zag: ``2·cp`` chunks; Ulysses       Ulysses also the heads per tp rank
       re-shards heads; Jacobs et al. 2023)
ep     the experts of each MoE layer           ``n_experts``
=====  ======================================  ===============================================

:func:`validate_layout` lists every broken rule at once, each with the values that would work.
It takes a :class:`dtlab.mesh.Layout` (any object with ``tp``/``cp``/``pp``/``ep`` attributes)
or keyword degrees; ``Layout.check(world, model_check=config.check_parallel)`` runs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dtlab.models.config import GPTConfig

CP_STYLES = ("ring", "zigzag", "ulysses")


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _choices(options: list[int]) -> str:
    """[1, 2, 4, 8] → '1, 2, 4 or 8'."""
    words = [str(o) for o in options]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _tp_problems(config: GPTConfig, tp: int) -> list[str]:
    problems = []
    heads, kv_heads = config.n_heads, config.n_kv_heads
    if heads % tp:
        # kv_heads divides heads, so the degrees that keep both whole divide kv_heads.
        both = "" if kv_heads == heads else f", which also divide its {kv_heads} KV heads"
        problems.append(
            f"tp={tp} does not divide {heads} attention heads; choose "
            f"{_choices(_divisors(kv_heads))}{both}"
        )
    elif kv_heads % tp:
        more_kv = [k for k in _divisors(heads) if k % tp == 0]
        verb = "exceeds" if tp > kv_heads else "does not divide"
        problems.append(
            f"tp={tp} {verb} {kv_heads} KV heads: every tensor-parallel rank needs whole KV heads; "
            f"choose tp = {_choices(_divisors(kv_heads))}, or n_kv_heads = {_choices(more_kv)}"
        )
    if config.d_ff % tp:
        problems.append(
            f"tp={tp} does not divide d_ff={config.d_ff} (the MLP's hidden width, split by "
            f"columns); choose {_choices(_divisors(config.d_ff))} (or change d_ff)"
        )
    return problems


def _cp_problems(config: GPTConfig, cp: int, tp: int, cp_style: str) -> list[str]:
    seq = config.seq_len
    if cp_style == "zigzag":
        if seq % (2 * cp):
            fits = [c for c in _divisors(seq) if seq % (2 * c) == 0] or [1]
            return [
                f"zig-zag context parallelism cuts seq_len={seq} into 2·cp={2 * cp} chunks, "
                f"which does not divide it; choose cp = {_choices(fits)} (or change seq_len)"
            ]
        return []
    problems = []
    if seq % cp:
        problems.append(
            f"cp={cp} does not divide seq_len={seq}: each context-parallel rank holds "
            f"seq_len/cp tokens; choose {_choices(_divisors(seq))} (or change seq_len)"
        )
    if cp_style == "ulysses" and config.n_heads % tp == 0 and config.n_kv_heads % tp == 0:
        heads, kv_heads = config.n_heads // tp, config.n_kv_heads // tp
        if heads % cp or kv_heads % cp:
            fits = _divisors(kv_heads)
            problems.append(
                f"Ulysses cp={cp} must divide the {heads} query and {kv_heads} KV heads each "
                f"tensor-parallel rank holds (n_heads={config.n_heads}, "
                f"n_kv_heads={config.n_kv_heads}, tp={tp}): its all-to-all hands every cp rank "
                f"whole heads; choose {_choices(fits)} or use ring attention"
            )
    return problems


def validate_layout(
    config: GPTConfig,
    layout: object | None = None,
    *,
    tp: int | None = None,
    cp: int | None = None,
    pp: int | None = None,
    ep: int | None = None,
    cp_style: str = "ring",
    n_experts: int | None = None,
) -> None:
    """Raise ``ValueError`` naming every way ``config`` cannot be split by this layout.

    Degrees come from ``layout``'s attributes (missing ones are 1), overridden by the keywords.
    ``cp_style`` is ``"ring"`` (``cp`` chunks), ``"zigzag"`` (``2·cp`` chunks, Brandon et al.
    2023's load-balanced causal ring) or ``"ulysses"``; ``n_experts`` is the number of experts
    per MoE layer (required when ``ep > 1``).
    """
    given = {"tp": tp, "cp": cp, "pp": pp, "ep": ep}
    degrees = {
        name: value if value is not None else getattr(layout, name, 1)
        for name, value in given.items()
    }
    for name, value in degrees.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: every degree is a whole number ≥ 1")
    if cp_style not in CP_STYLES:
        raise ValueError(f"cp_style={cp_style!r}; choose one of {CP_STYLES}")
    tp, cp, pp, ep = (degrees[n] for n in ("tp", "cp", "pp", "ep"))
    problems = _tp_problems(config, tp) + _cp_problems(config, cp, tp, cp_style)
    if pp > config.n_layers:
        problems.append(
            f"pp={pp} exceeds n_layers={config.n_layers}: every pipeline stage needs at least "
            f"one block; choose 1 to {config.n_layers} or add layers"
        )
    if ep > 1 and n_experts is None:
        problems.append(
            f"ep={ep} but the model has no experts: pass n_experts (experts per MoE layer) "
            "or set ep=1"
        )
    elif ep > 1 and n_experts % ep:
        problems.append(
            f"ep={ep} does not divide n_experts={n_experts}: each expert-parallel rank holds "
            f"whole experts; choose {_choices(_divisors(n_experts))}"
        )
    if len(problems) == 1:
        raise ValueError(problems[0])
    if problems:
        raise ValueError(
            "this layout does not fit the model:\n" + "\n".join(f"  - {p}" for p in problems)
        )
