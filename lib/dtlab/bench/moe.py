"""Expert parallelism: our dispatch/combine vs torch's all_to_all_single; grouped GEMM vs a loop.

    dtlab bench moe [--world-size 2] [--tokens 2048] [--dim 256] [--experts 8] [--top-k 2]
                    [--steps 4] [--repeats 3] [--json PATH]

Every rank routes ``--tokens`` random tokens (width ``--dim``, fp32) to ``--top-k`` of
``--experts`` experts with a random router (uneven splits, as in training). Round r runs, in
rotated order (:func:`dtlab.bench.run_interleaved`):

* ``a2a_dtlab`` — the count exchange, the dispatch all-to-all and the combine all-to-all
  (:func:`dtlab.parallel.expert.dispatch_splits`, :func:`dtlab.comm.all_to_all_rows`) over a
  ``Communicator(collectives="dtlab")``: dtlab's pairwise exchange, every byte counted;
* ``a2a_torch`` — the very same calls over ``Communicator(collectives="torch")``, which runs
  ``torch.distributed.all_to_all_single`` (gloo's or NCCL's);
* ``experts_grouped`` / ``experts_loop`` — forward + backward of this rank's experts on the rows
  it received (fp32 on CPU, bf16 on CUDA), with ``torch._grouped_mm`` and with one matmul per
  expert (where ``torch._grouped_mm`` cannot run these rows — no kernel for the dtype/device,
  or rows not 16 bytes apart, as at ``--dim 30`` in fp32 — only the loop runs, and the report
  says why).

Reported from this one run: ``a2a_dtlab ÷ a2a_torch`` and ``experts_grouped ÷ experts_loop``
(median over repeats of per-round ratios, min–max, and best ÷ best), and the exchange bytes per
rank counted on the dtlab path beside the formula from the routed counts. Times vary run to run; the ratios are the point.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass

from dtlab.bench import Spread, best_ratios_to, ratios_to, run_on_ranks, slowest_rank
from dtlab.cost.moe import dispatch_bytes_from_counts

WARMUP_ROUNDS = 1


def _measure_on_rank(
    tokens: int, dim: int, experts: int, top_k: int, steps: int, repeats: int
) -> dict:
    import torch
    import torch.distributed as dist

    import dtlab
    from dtlab import trace
    from dtlab.bench import run_interleaved
    from dtlab.comm import Communicator, all_to_all_rows
    from dtlab.models.moe_experts import Experts, grouped_mm_refusal
    from dtlab.models.moe_router import route
    from dtlab.parallel.expert import dispatch_splits

    device = dtlab.device()
    ep, rank = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(tokens, dim, generator=g).to(device)
    router = torch.randn(experts, dim, generator=torch.Generator().manual_seed(0)).to(device)
    routing = route(x, router, top_k)
    expert = routing.expert_index.reshape(-1)
    order = torch.argsort(expert, stable=True)
    rows = x.repeat_interleave(top_k, 0)[order].contiguous()
    counts = torch.bincount(expert, minlength=experts)
    communicators = {v: Communicator(None, collectives=v, dim="ep") for v in ("dtlab", "torch")}

    def exchange(comm: Communicator) -> None:
        send, recv, _ = dispatch_splits(counts, comm)
        arrived = all_to_all_rows(rows, comm, recv, send)
        all_to_all_rows(arrived, comm, send, recv)

    send, recv, received = dispatch_splits(counts, communicators["torch"])
    local_rows = all_to_all_rows(rows, communicators["torch"], recv, send)
    local = torch.arange(experts // ep, device=device).repeat(ep)
    local_order = torch.argsort(local.repeat_interleave(received.reshape(-1)), stable=True)
    local_rows = local_rows[local_order].contiguous()
    local_counts = received.sum(0).tolist()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # CUDA's grouped GEMM: bf16
    local_rows = local_rows.to(dtype)
    torch.manual_seed(0)
    layer = Experts(experts // ep, dim, 4 * dim, device=device).to(dtype)

    def compute(backend: str) -> None:
        layer.backend = backend
        inputs = local_rows.detach().requires_grad_()
        layer(inputs, local_counts).square().mean().backward()

    def labelled(name, fn):
        def step(i: int) -> None:
            with trace.labels(variant=name, round=i):
                fn()

        return step

    variants = {
        "a2a_dtlab": labelled("a2a_dtlab", lambda: exchange(communicators["dtlab"])),
        "a2a_torch": labelled("a2a_torch", lambda: exchange(communicators["torch"])),
        "experts_loop": labelled("experts_loop", lambda: compute("loop")),
    }
    refusal = grouped_mm_refusal(local_rows, layer.fc_in.weight, layer.fc_out.weight)
    if refusal is None:
        variants["experts_grouped"] = labelled("experts_grouped", lambda: compute("grouped"))
    communicators["dtlab"].comm_stats.reset()
    seconds = run_interleaved(variants, steps * repeats, WARMUP_ROUNDS)
    calls = WARMUP_ROUNDS + steps * repeats
    return {
        "seconds": seconds,
        "dtlab_bytes_per_exchange": communicators["dtlab"].comm_stats.bytes_sent // calls,
        "tokens_per_expert": counts.tolist(),
        "grouped_refusal": refusal,
    }


@dataclass
class MoEBenchResult:
    """One run's ratios: dtlab's all-to-all ÷ torch's, grouped GEMM ÷ the loop."""

    world_size: int
    tokens: int
    step_s: dict[str, float]
    a2a_dtlab_vs_torch: Spread
    a2a_best_ratio: float
    grouped_vs_loop: Spread | None
    grouped_best_ratio: float | None
    dtlab_bytes_per_exchange: list[int]  # counted, per rank: counts + dispatch + combine
    formula_bytes_per_exchange: list[int]  # dispatch_bytes_from_counts(...).forward, per rank
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
        )  # fmt: skip
    )
    seconds = slowest_rank([r["seconds"] for r in out])
    a2a = {k: seconds[k] for k in ("a2a_dtlab", "a2a_torch")}
    grouped = "experts_grouped" in seconds
    compute = {k: v for k, v in seconds.items() if k.startswith("experts_")}
    return MoEBenchResult(
        world_size=len(out),
        tokens=tokens,
        step_s={v: statistics.median(s) for v, s in seconds.items()},
        a2a_dtlab_vs_torch=ratios_to(a2a, "a2a_torch", repeats)["a2a_dtlab"],
        a2a_best_ratio=best_ratios_to(a2a, "a2a_torch")["a2a_dtlab"],
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
        grouped_refusal=out[0]["grouped_refusal"],
    )


def _ratio(spread: Spread | None, best: float | None, why: str | None = None) -> str:
    if spread is None:
        return f"n/a (the loop only: {why})"
    return (
        f"{spread.median:.2f}× (range {spread.low:.2f}–{spread.high:.2f}; best ÷ best {best:.2f}×)"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dtlab bench moe", description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2, help="the EP degree")
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per rank")
    parser.add_argument("--dim", type=int, default=256, help="hidden width")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args(argv)
    result = run(
        None, args.world_size, args.tokens, args.dim, args.experts, args.top_k, args.steps,
        args.repeats,
    )  # fmt: skip
    print(
        f"EP={result.world_size}, {args.tokens} tokens/rank, d={args.dim}, "
        f"top-{args.top_k} of {args.experts} experts"
    )
    for name, s in result.step_s.items():
        print(f"  {name:>16}: median step {s * 1e3:.2f} ms")
    print(
        f"  dispatch+combine, dtlab ÷ torch all_to_all_single: {_ratio(result.a2a_dtlab_vs_torch, result.a2a_best_ratio)}"
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
