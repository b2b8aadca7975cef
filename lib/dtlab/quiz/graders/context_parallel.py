"""Graders for lab 06 (context parallelism): the log-sum-exp merge and the zig-zag layout.

``context_parallel.merge`` — ``fn(o_a, lse_a, o_b, lse_b) -> (o, lse)``: combine two key blocks'
softmax-normalised outputs ``o`` (B, H, S, Dh) and log-sum-exps ``lse`` (B, H, S) into those of
their union (Milakov & Gimelshein 2018). Graded on every rank of the cluster: the keys of a
causal fp64 attention are cut into blocks at several split points (and into three blocks, merged
in both orders), each block's ``(o, lse)`` computed by
:func:`~dtlab.parallel.context.block_attention`, folded with ``fn``, and compared with full
attention (:func:`~dtlab.models.attention.math_attention`) and its log-sum-exp. A split where
some queries see no key of a block (``lse = -inf``, ``o = 0``) is included: the merge must not
produce ``nan`` there. Calling the library's ``merge`` (or ``torch.softmax`` over the scores
again) is refused: the skill is the two-line rescaling.

``context_parallel.zigzag_positions`` — ``fn(seq_len, cp, rank) -> LongTensor``: the global
positions rank ``rank`` of ``cp`` holds under zig-zag (head-tail) sharding, ascending. Graded on
the cluster's ranks: equal to the layout (chunks ``rank`` and ``2·cp−1−rank`` of ``2·cp``) for
several ``(seq_len, cp)``, a partition of the sequence, and every rank's unmasked causal score
count equal (:func:`~dtlab.parallel.context.unmasked_scores`). Calling
``shard_positions``/``shard_sequence`` is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.watch import noticing_calls

MERGE_TOLERANCE = 1e-10  # fp64: only the order of the sums differs
MERGE_SEQ, MERGE_HEADS, MERGE_DH = 12, 2, 4
SPLITS = ((6,), (1,), (11,), (4,), (3, 8))  # cut points of the 12 keys; (3, 8): three blocks
ZIGZAG_CASES = ((8, 2), (16, 2), (16, 4), (24, 3), (64, 8), (12, 1))


def _merge_answers() -> dict[Callable, str]:
    from dtlab.parallel.context import blockwise

    return {blockwise.merge: "dtlab.parallel.context.merge"}


def _layout_answers() -> dict[Callable, str]:
    from dtlab.parallel.context import sharding

    return {
        sharding.shard_positions: "dtlab.parallel.context.shard_positions",
        sharding.shard_sequence: "dtlab.parallel.context.shard_sequence",
        sharding.unshard_sequence: "dtlab.parallel.context.unshard_sequence",
    }


def _merge_on_rank(fn: Callable, seed_offset: int = 0) -> dict:
    import torch
    import torch.distributed as dist

    from dtlab.models.attention import math_attention
    from dtlab.parallel.context import block_attention

    rank = dist.get_rank() if dist.is_initialized() else 0
    g = torch.Generator().manual_seed(100 + rank + seed_offset)
    q, k, v = (
        torch.randn(2, MERGE_HEADS, MERGE_SEQ, MERGE_DH, generator=g, dtype=torch.float64)
        for _ in range(3)
    )
    positions = torch.arange(MERGE_SEQ)
    want = math_attention(q, k, v, positions, positions, causal=True)
    scale = MERGE_DH**-0.5
    scores = (q @ k.transpose(-2, -1)) * scale
    scores = scores.masked_fill(positions[None, :] > positions[:, None], float("-inf"))
    want_lse = torch.logsumexp(scores, dim=-1)
    problems, used = [], []
    for cuts in SPLITS:
        edges = [0, *cuts, MERGE_SEQ]
        blocks = [
            block_attention(q, k[:, :, a:b], v[:, :, a:b], positions, positions[a:b])
            for a, b in zip(edges, edges[1:], strict=False)
        ]
        for order in (blocks, blocks[::-1]):
            with noticing_calls(_merge_answers()) as noticed:
                try:
                    o, lse = order[0]
                    for o_b, lse_b in order[1:]:
                        o, lse = fn(o, lse, o_b, lse_b)
                except NotImplementedError:
                    raise
                except Exception as error:  # noqa: BLE001 - reported to the learner
                    problems.append(f"keys cut at {cuts}: your merge raised {error!r}")
                    continue
            used += noticed
            if not isinstance(o, torch.Tensor) or not isinstance(lse, torch.Tensor):
                problems.append("return a pair of tensors (o, lse)")
                continue
            if o.shape != want.shape or lse.shape != want_lse.shape:
                problems.append(
                    f"keys cut at {cuts}: o has shape {tuple(o.shape)}, lse {tuple(lse.shape)}; "
                    f"want {tuple(want.shape)} and {tuple(want_lse.shape)}"
                )
                continue
            if torch.isnan(o).any() or torch.isnan(lse).any():
                problems.append(
                    f"keys cut at {cuts}: nan in your result — query 0 sees no key of a later "
                    "block (lse = -inf); weigh such a block exp(-inf) = 0 without computing "
                    "-inf - (-inf)"
                )
                continue
            gap_o = (o - want).abs().max().item()
            gap_lse = (lse - want_lse).abs().max().item()
            if gap_o > MERGE_TOLERANCE or gap_lse > MERGE_TOLERANCE:
                problems.append(
                    f"keys cut at {cuts}: o differs from full attention by {gap_o:.3g}, lse from "
                    f"the full log-sum-exp by {gap_lse:.3g}"
                )
    return {"problems": problems, "used": used}


@exercise("context_parallel.merge", title="The log-sum-exp merge", world_size=2)
def grade_merge(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(o_a, lse_a, o_b, lse_b) -> (o, lse)``: exact union of two blocks (see module doc)."""
    results = cluster.run(_merge_on_rank, fn)
    for r in results:
        if r["used"]:
            raise NotTheSkill(
                f"your merge calls {r['used'][0]} — the library's answer. Write it: the new "
                "lse is log(exp(lse_a) + exp(lse_b)); weigh each o by exp(its lse - the new lse)"
            )
    for rank, r in enumerate(results):
        if r["problems"]:
            more = f" (and {len(r['problems']) - 1} more)" if len(r["problems"]) > 1 else ""
            raise AssertionError(f"on rank {rank}: {r['problems'][0]}{more}")
    return GradeResult(
        True,
        f"Exact on {cluster.world_size} ranks: causal fp64 attention cut into blocks at "
        f"{len(SPLITS)} splits (one into three blocks), merged in both orders, equals full "
        f"attention and its log-sum-exp within {MERGE_TOLERANCE:g}; fully masked blocks "
        "(lse = -inf) merge without nan.",
    )


def _zigzag_on_rank(fn: Callable) -> dict:
    import torch
    import torch.distributed as dist

    from dtlab.parallel.context import shard_positions, unmasked_scores

    rank = dist.get_rank() if dist.is_initialized() else 0
    problems, used = [], []
    for seq_len, cp in ZIGZAG_CASES:
        got_all, work = [], []
        for r in range(cp):
            with noticing_calls(_layout_answers()) as noticed:
                got = fn(seq_len, cp, r)
            used += noticed
            if not isinstance(got, torch.Tensor) or got.dtype != torch.int64:
                problems.append(
                    f"zigzag_positions({seq_len}, {cp}, {r}) returned "
                    f"{type(got).__name__}"
                    + (f" of {got.dtype}" if isinstance(got, torch.Tensor) else "")
                    + "; return a LongTensor (int64) of positions"
                )
                break
            want = shard_positions(seq_len, cp, r, "zigzag")
            if got.shape != want.shape or not torch.equal(got, want):
                problems.append(
                    f"zigzag_positions({seq_len}, {cp}, {r}) = {got.tolist()[:12]}; the layout "
                    f"is {want.tolist()[:12]}: chunks {r} and {2 * cp - 1 - r} of {2 * cp}, "
                    "ascending"
                )
                break
            got_all.append(got)
            work.append(unmasked_scores(got, torch.arange(seq_len), causal=True))
        else:
            if not torch.equal(torch.cat(got_all).sort().values, torch.arange(seq_len)):
                problems.append(f"seq_len={seq_len}, cp={cp}: the ranks do not cover every token")
            elif len(set(work)) != 1:
                problems.append(f"seq_len={seq_len}, cp={cp}: unequal causal work {work}")
    return {"problems": problems, "used": used, "rank": rank}


@exercise("context_parallel.zigzag_positions", title="The zig-zag layout", world_size=2)
def grade_zigzag_positions(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(seq_len, cp, rank) -> LongTensor``: the zig-zag positions of ``rank`` (module doc)."""
    results = cluster.run(_zigzag_on_rank, fn)
    for r in results:
        if r["used"]:
            raise NotTheSkill(
                f"your layout calls {r['used'][0]} — the library's answer. Build it: cut the "
                "sequence into 2·cp chunks; rank r takes chunk r and chunk 2·cp-1-r"
            )
    for r in results:
        if r["problems"]:
            raise AssertionError(f"on rank {r['rank']}: {r['problems'][0]}")
    cases = ", ".join(f"S={s} cp={c}" for s, c in ZIGZAG_CASES)
    return GradeResult(
        True,
        f"Your layout equals zig-zag sharding for {cases}, covers every token once, and gives "
        f"every rank the same unmasked causal scores — checked on {cluster.world_size} ranks.",
    )


# -- quiz keys, from the library -----------------------------------------------------------------
def causal_work_ratio_key(cp: int, seq_len: int, style: str = "contiguous") -> float:
    """Unmasked causal scores of the busiest rank over the least busy one, under ``style``."""
    import torch

    from dtlab.parallel.context import shard_positions, unmasked_scores

    work = [
        unmasked_scores(shard_positions(seq_len, cp, r, style), torch.arange(seq_len), True)
        for r in range(cp)
    ]
    return max(work) / min(work)


def score_memory_ratio_key(seq_len: int, d_model: int, n_heads: int, longer: int) -> float:
    """How many times one layer's activation bytes grow when the sequence is ``longer`` times
    longer (Korthikanti et al.'s formula: ``34·sbh + 5·a·s²·b``)."""
    from dtlab.memory.formulas import activation_bytes_per_layer

    return activation_bytes_per_layer(
        longer * seq_len, 1, d_model, n_heads
    ) / activation_bytes_per_layer(seq_len, 1, d_model, n_heads)
