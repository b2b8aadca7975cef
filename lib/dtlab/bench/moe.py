"""Expert parallelism: our dispatch/combine vs torch's all_to_all_single; grouped GEMM vs a loop.

    dtlab bench moe [--world-size 2] [--tokens 2048] [--dim 256] [--experts 8] [--top-k 2]
                    [--ranks-per-node 1] [--steps 4] [--repeats 3] [--json PATH]

Every rank routes ``--tokens`` random tokens (width ``--dim``, fp32) to ``--top-k`` of
``--experts`` experts with a random router (uneven splits, as in training). Round r runs, in
rotated order (:func:`dtlab.bench.run_interleaved`):

* ``a2a_torch`` — the expert-parallel exchange of the MoE layer
  (:class:`dtlab.parallel.expert.TokenExchange`) over ``Communicator(collectives="torch")``:
  **one** ``all_to_all_single`` of the counts behind a 4-word header every rank checks (the
  count exchange *is* the call's agreement), then **one** ``all_to_all_single`` each for the
  dispatch and the combine, into receive buffers kept across steps;
* ``a2a_torch_plain`` — what one writes with torch alone, unchecked: ``all_to_all_single`` of
  the bare counts, then of the rows into fresh tensors
  (:func:`dtlab.parallel.expert.dispatch_splits`, :func:`dtlab.comm.all_to_all_rows` over the
  torch communicator). The goal: ``a2a_torch ÷ a2a_torch_plain ≤ 1.10`` — the agreement and the
  exchange's bookkeeping cost at most a tenth of the bare exchange;
* ``a2a_dtlab`` — the same exchange as ``a2a_torch`` over
  ``Communicator(collectives="dtlab")``: every message posted per peer (``isend``/``irecv``)
  and every byte counted from them — what the accounting and the labs run;
* ``a2a_generic`` — those same calls over dtlab's generic all-to-all
  (:func:`dtlab.collectives.all_to_all`: a control all-gather that checks each call, then
  ``ep−1`` pairwise steps), the dispatcher before the exchange above;
* ``dispatch_plain`` / ``dispatch_torch`` / ``dispatch_dedup`` — the dispatch alone (counts and
  rows, no combine): the exchange above over dtlab's messages, the same over
  ``all_to_all_single``, and the deduplicated dispatch
  (:func:`dtlab.parallel.expert.dedup.dedup_dispatch`: each token once per destination node of
  ``--ranks-per-node`` ranks, then fanned out inside it), with its bytes per link class counted
  beside the plain dispatch's from the formula;
* ``experts_grouped`` / ``experts_loop`` — forward + backward of this rank's experts on the rows
  it received (fp32 on CPU, bf16 on CUDA), with ``torch._grouped_mm`` and with one matmul per
  expert (where ``torch._grouped_mm`` cannot run these rows — no kernel for the dtype/device,
  or rows not 16 bytes apart, as at ``--dim 30`` in fp32 — only the loop runs, and the report
  says why).

Reported from this one run: ``a2a_torch ÷ a2a_torch_plain`` and ``a2a_dtlab ÷ a2a_torch``, each
from a run of its own two variants after the run of all (:data:`PAIRS`), with each repeat's
median of paired per-round ratios (for a loaded host); from the run of all, ``a2a_dtlab ÷
a2a_torch_plain``,
``a2a_generic ÷ a2a_torch_plain``, ``dispatch_dedup ÷ dispatch_plain`` and ``÷ dispatch_torch``,
and ``experts_grouped ÷ experts_loop`` (median over repeats of
per-round ratios, min–max, and best ÷ best), and the exchange bytes per rank counted on the
dtlab path beside the formula from the routed counts. Times vary run to run; the ratios are the point.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass

from dtlab.bench import (
    Spread,
    best_ratios_to,
    per_repeat,
    ratios_to,
    run_on_ranks,
    slowest_rank,
)
from dtlab.bench._moe_variants import PAIRS, WARMUP_ROUNDS
from dtlab.bench._moe_variants import measure_on_rank as _measure_on_rank
from dtlab.cost.moe import dedup_dispatch_bytes, dispatch_bytes_from_counts

__all__ = ["PAIRS", "WARMUP_ROUNDS", "MoEBenchResult", "main", "run"]


@dataclass
class MoEBenchResult:
    """One run's ratios: the checked exchange ÷ bare all_to_all_single, counted ÷ torch's,
    grouped GEMM ÷ the loop."""

    world_size: int
    tokens: int
    step_s: dict[str, float]
    checked_vs_plain: Spread  # the goal: a2a_torch ÷ a2a_torch_plain (≤ 1.10)
    checked_per_repeat: list[float]  # each repeat's median of the paired per-round ratios
    checked_best_ratio: float  # fastest a2a_torch ÷ fastest a2a_torch_plain
    a2a_dtlab_vs_torch: Spread  # the same exchange: dtlab's messages ÷ all_to_all_single
    a2a_best_ratio: float
    counted_per_repeat: list[float]  # a2a_dtlab ÷ a2a_torch, each repeat's paired median
    a2a_dtlab_vs_torch_plain: Spread  # ÷ bare all_to_all_single calls into fresh tensors
    a2a_generic_vs_torch_plain: Spread  # the generic checked all-to-all (before the exchange)
    grouped_vs_loop: Spread | None
    grouped_best_ratio: float | None
    dtlab_bytes_per_exchange: list[int]  # counted, per rank: counts + dispatch + combine
    formula_bytes_per_exchange: list[int]  # dispatch_bytes_from_counts(...).forward, per rank
    dedup_vs_plain: Spread | None = None  # dispatch only: deduplicated ÷ the plain exchange
    dedup_vs_torch: Spread | None = None  # ÷ the plain exchange over all_to_all_single
    dedup_bytes: list[dict] | None = None  # counted per rank: inter/intra rows and meta, counts
    link_bytes: list | None = None  # dedup_dispatch_bytes(...) per rank: plain and dedup per link
    grouped_refusal: str | None = None  # why the grouped GEMM did not run (rank 0), if it did not


def run(
    cluster=None,
    world_size: int = 2,
    tokens: int = 2048,
    dim: int = 256,
    experts: int = 8,
    top_k: int = 2,
    steps: int = 4,
    repeats: int = 3,
    ranks_per_node: int = 1,
) -> MoEBenchResult:
    """Measure on ``cluster`` (or a fresh one of ``world_size`` ranks)."""
    if experts % world_size:
        raise ValueError(f"--experts {experts} must be a multiple of --world-size {world_size}")
    out = list(
        run_on_ranks(
            cluster,
            world_size,
            steps,
            repeats,
            _measure_on_rank,
            tokens,
            dim,
            experts,
            top_k,
            steps,
            repeats,
            ranks_per_node,
        )  # fmt: skip
    )
    seconds = slowest_rank([r["seconds"] for r in out])
    a2a = slowest_rank([r["paired"]["counted"] for r in out])
    plain = {k: seconds[k] for k in ("a2a_dtlab", "a2a_generic", "a2a_torch_plain")}
    checked = slowest_rank([r["paired"]["checked"] for r in out])
    vs_plain = ratios_to(plain, "a2a_torch_plain", repeats)
    dispatch = {k: seconds[k] for k in ("dispatch_plain", "dispatch_torch", "dispatch_dedup")}
    routed = [[[e for e in token if e >= 0] for token in r["routed"]] for r in out]
    grouped = "experts_grouped" in seconds
    compute = {k: v for k, v in seconds.items() if k.startswith("experts_")}
    return MoEBenchResult(
        world_size=len(out),
        tokens=tokens,
        step_s={v: statistics.median(s) for v, s in seconds.items()},
        checked_vs_plain=ratios_to(checked, "a2a_torch_plain", repeats)["a2a_torch"],
        checked_per_repeat=_paired(checked["a2a_torch"], checked["a2a_torch_plain"], repeats),
        checked_best_ratio=best_ratios_to(checked, "a2a_torch_plain")["a2a_torch"],
        a2a_dtlab_vs_torch=ratios_to(a2a, "a2a_torch", repeats)["a2a_dtlab"],
        a2a_best_ratio=best_ratios_to(a2a, "a2a_torch")["a2a_dtlab"],
        counted_per_repeat=_paired(a2a["a2a_dtlab"], a2a["a2a_torch"], repeats),
        a2a_dtlab_vs_torch_plain=vs_plain["a2a_dtlab"],
        a2a_generic_vs_torch_plain=vs_plain["a2a_generic"],
        grouped_vs_loop=ratios_to(compute, "experts_loop", repeats)["experts_grouped"]
        if grouped
        else None,
        grouped_best_ratio=best_ratios_to(compute, "experts_loop")["experts_grouped"]
        if grouped
        else None,
        dtlab_bytes_per_exchange=[int(r["dtlab_bytes_per_exchange"]) for r in out],
        formula_bytes_per_exchange=[
            dispatch_bytes_from_counts([r["tokens_per_expert"] for r in out], rank, dim).forward
            for rank in range(len(out))
        ],
        dedup_vs_plain=ratios_to(dispatch, "dispatch_plain", repeats)["dispatch_dedup"],
        dedup_vs_torch=ratios_to(dispatch, "dispatch_torch", repeats)["dispatch_dedup"],
        dedup_bytes=[r["dedup_bytes"] for r in out],
        link_bytes=dedup_dispatch_bytes(routed, experts, ranks_per_node, dim),
        grouped_refusal=out[0]["grouped_refusal"],
    )


def _paired(ours: list[float], base: list[float], repeats: int) -> list[float]:
    """Each repeat's median of ``ours[i] ÷ base[i]``, rounds ``i`` run seconds apart."""
    paired = [t / b for t, b in zip(ours, base, strict=True)]
    return [statistics.median(run) for run in per_repeat(paired, repeats)]


def _ratio(spread: Spread | None, best: float | None, why: str | None = None) -> str:
    if spread is None:
        return f"n/a (the loop only: {why})"
    text = f"{spread.median:.2f}× (range {spread.low:.2f}–{spread.high:.2f}"
    return text + (f"; best ÷ best {best:.2f}×)" if best is not None else ")")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dtlab bench moe", description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2, help="the EP degree")
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per rank")
    parser.add_argument("--dim", type=int, default=256, help="hidden width")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument(
        "--ranks-per-node", type=int, default=1, help="ranks per (pretended) node, for the dedup"
    )
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args(argv)
    result = run(
        None, args.world_size, args.tokens, args.dim, args.experts, args.top_k, args.steps,
        args.repeats, args.ranks_per_node,
    )  # fmt: skip
    print(
        f"EP={result.world_size}, {args.tokens} tokens/rank, d={args.dim}, "
        f"top-{args.top_k} of {args.experts} experts"
    )
    for name, s in result.step_s.items():
        print(f"  {name:>16}: median step {s * 1e3:.2f} ms")
    print(
        "  counts+dispatch+combine, the checked exchange (header-carrying counts, kept buffers) "
        f"÷ bare all_to_all_single calls: "
        f"{_ratio(result.checked_vs_plain, result.checked_best_ratio)}; per repeat "
        + ", ".join(f"{r:.2f}" for r in result.checked_per_repeat)
    )
    print(
        "  the same exchange over dtlab's counted per-peer messages ÷ over all_to_all_single: "
        f"{_ratio(result.a2a_dtlab_vs_torch, result.a2a_best_ratio)}; per repeat "
        + ", ".join(f"{r:.2f}" for r in result.counted_per_repeat)
    )
    for name, spread in (
        ("dtlab's exchange", result.a2a_dtlab_vs_torch_plain),
        ("the generic checked all-to-all", result.a2a_generic_vs_torch_plain),
    ):
        print(
            f"  {name} ÷ bare all_to_all_single calls: {spread.median:.2f}× "
            f"(range {spread.low:.2f}–{spread.high:.2f})"
        )
    print(
        f"  dispatch only, deduplicated per node of {args.ranks_per_node} rank(s) ÷ plain: "
        f"{_ratio(result.dedup_vs_plain, None)}; ÷ plain over all_to_all_single: "
        f"{_ratio(result.dedup_vs_torch, None)}"
    )
    for rank, (counted, want) in enumerate(zip(result.dedup_bytes, result.link_bytes, strict=True)):
        print(
            f"  rank {rank} dispatch rows across nodes: plain {want.plain_inter:,} B, dedup counted "
            f"{counted['inter_rows']:,} B (formula {want.dedup_inter_rows:,}); inside the node: "
            f"plain {want.plain_intra:,} B, dedup counted {counted['intra_rows']:,} B "
            f"(formula {want.dedup_intra_rows:,})"
        )
    print(
        f"  experts, grouped GEMM ÷ per-expert loop: {_ratio(result.grouped_vs_loop, result.grouped_best_ratio, result.grouped_refusal)}"
    )
    print(
        f"  bytes per exchange per rank: counted {result.dtlab_bytes_per_exchange}, formula from "
        f"the routed counts {result.formula_bytes_per_exchange}"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(asdict(result), out, indent=2)
    return 0
