"""dtlab's 1F1B pipeline vs torch's ``Schedule1F1B``, interleaved step by step: step time ratio.

    dtlab bench pp [--world-size 2] [--micro-batches 4] [--steps 6] [--repeats 3]
                   [--model tiny|small] [--json PATH]

Every rank is one pipeline stage (``Mesh(pp=world_size)``) and builds two replicas of the lab GPT
cut into the same stages: dtlab's executor running :func:`~dtlab.parallel.pipeline.one_f_one_b`
(blocking send/recv in the order :func:`~dtlab.parallel.pipeline.with_communication` derives)
and ``torch.distributed.pipelining``'s ``PipelineStage`` + ``Schedule1F1B`` (batched
``isend``/``irecv``). Both sum the tied embedding's gradient over the first and last stage and
take an AdamW step. Round r runs each one's step r on the same batch, the order swapped every
round (:func:`dtlab.bench.run_interleaved`), so load drift on a shared machine slows both alike;
after 2 warm-up rounds (torch infers its stage shapes in the first), ``--repeats`` × ``--steps``
rounds are measured. A step's time is the slowest rank's; the ratio is the median, per repeat,
of each round's dtlab ÷ torch, shown as the median over repeats (min–max); *best* is fastest
step ÷ fastest step. Times vary run to run; the ratio is the point.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass

from dtlab.bench import Spread, best_ratios_to, ratios_to, run_on_ranks, slowest_rank

IMPLEMENTATIONS = ("dtlab_1f1b", "torch_1f1b")
BASELINE = "torch_1f1b"
WARMUP_ROUNDS = 2
MICRO_BATCH_SIZE = 4


def _measure_on_rank(model_size: str, n_micro: int, steps: int, repeats: int) -> dict:
    import torch
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    import dtlab
    from dtlab.bench import run_interleaved
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, split_into_stages
    from dtlab.parallel.pipeline import (
        embedding_group,
        one_f_one_b,
        pipeline_gpt,
        sum_tied_gradients,
    )

    world, device = dtlab.world_size(), dtlab.device()
    mesh = Mesh(pp=world)
    base = GPTConfig.tiny() if model_size == "tiny" else GPTConfig.small()
    config = GPTConfig(**{**base.__dict__, "n_layers": max(base.n_layers, world)})
    schedule = one_f_one_b(world, n_micro)
    data = SyntheticTokens(config, n_batches=1, batch_size=MICRO_BATCH_SIZE * n_micro, seed=0)
    inputs, targets = (t.to(device) for t in data[0])

    ours = pipeline_gpt(GPT(config, seed=0).to(device), mesh, schedule)
    our_params = [p for stage in ours.stages.values() for p in stage.parameters()]
    our_opt = torch.optim.AdamW(our_params, lr=1e-3)

    stage = split_into_stages(GPT(config, seed=0).to(device), world)[mesh.pp_rank]
    theirs = Schedule1F1B(
        PipelineStage(stage, mesh.pp_rank, world, device, group=mesh.pp_group),
        n_microbatches=n_micro,
        loss_fn=loss_fn,
    )
    their_opt = torch.optim.AdamW(stage.parameters(), lr=1e-3)
    tied = embedding_group(mesh, schedule)

    def our_step(_: int) -> None:
        our_opt.zero_grad()
        ours.step(inputs, targets)
        our_opt.step()

    def their_step(_: int) -> None:
        their_opt.zero_grad()
        args = (inputs,) if mesh.is_first_pp_stage else ()
        kwargs = {"target": targets, "losses": []} if mesh.is_last_pp_stage else {}
        theirs.step(*args, **kwargs)
        sum_tied_gradients({mesh.pp_rank: stage}, tied)
        their_opt.step()

    seconds = run_interleaved(
        {"dtlab_1f1b": our_step, "torch_1f1b": their_step}, steps * repeats, WARMUP_ROUNDS
    )
    return {"seconds": seconds}


@dataclass
class ImplementationResult:
    """One implementation: median step (slowest rank) and its ratio to torch's."""

    implementation: str
    step_s: float
    vs_torch: Spread
    best_vs_torch: float
    step_s_per_round: list[float]


def run(
    cluster=None,
    world_size: int = 2,
    model_size: str = "tiny",
    n_micro: int = 4,
    steps: int = 6,
    repeats: int = 3,
) -> list[ImplementationResult]:
    """Measure both on ``cluster`` (or a fresh one of ``world_size`` ranks, one stage each)."""
    out = run_on_ranks(
        cluster, world_size, steps, repeats, _measure_on_rank, model_size, n_micro, steps, repeats
    )
    seconds = slowest_rank([r["seconds"] for r in out])
    ratios, best = ratios_to(seconds, BASELINE, repeats), best_ratios_to(seconds, BASELINE)
    return [
        ImplementationResult(
            impl, statistics.median(seconds[impl]), ratios[impl], best[impl], seconds[impl]
        )
        for impl in IMPLEMENTATIONS
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dtlab bench pp", description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2, help="pipeline stages (ranks)")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6, help="measured rounds per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="ratios: median and min–max")
    parser.add_argument("--model", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    results = run(None, args.world_size, args.model, args.micro_batches, args.steps, args.repeats)
    print(
        f"1F1B on GPT-{args.model}, p={args.world_size}, m={args.micro_batches} micro-batches of "
        f"{MICRO_BATCH_SIZE}: {args.repeats} repeats × {args.steps} steps, interleaved"
    )
    print("time ratio: median over repeats (min–max); best: fastest step ÷ fastest")
    print(f"{'impl':<12}{'step ms':>8}  {'vs torch':<18}{'best':>6}")
    for r in results:
        ratio = f"{r.vs_torch.median:.2f} ({r.vs_torch.low:.2f}–{r.vs_torch.high:.2f})"
        print(f"{r.implementation:<12}{r.step_s * 1e3:>8.1f}  {ratio:<18}{r.best_vs_torch:>6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)
    return 0
