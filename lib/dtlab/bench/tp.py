"""Tensor parallel (dtlab) vs DTensor ``parallelize_module``, interleaved step by step: time ratio.

    dtlab bench tp [--world-size 2] [--steps 6] [--repeats 3] [--model tiny|small]
                   [--sequence-parallel] [--json PATH]

Every rank builds the lab GPT twice and shards it over one ``tp`` group of all ranks: dtlab's
:func:`~dtlab.parallel.tensor.parallelize_gpt` (vocabulary-parallel cross-entropy, SP gradient
sum) and PyTorch's DTensor plan (:func:`~dtlab.parallel.tensor.dtensor_parallelize_gpt`, loss
under ``loss_parallel``), each with its own AdamW in fp32, both on torch's collectives. Every
rank feeds the same batch (a TP group shares its input). Round r runs each one's step r, the
order swapped every round (:func:`dtlab.bench.run_interleaved`), so load drift on a shared
machine slows both alike. After 2 warm-up rounds, ``--repeats`` × ``--steps`` rounds are
measured. A step's time is the slowest rank's; the ratio is the median, per repeat, of each
round's dtlab ÷ DTensor, shown as the median over repeats (min–max); *best* is fastest step ÷
fastest step. Times vary run to run; the ratio is the point.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass

from dtlab.bench import Spread, best_ratios_to, ratios_to, run_on_ranks, slowest_rank

IMPLEMENTATIONS = ("dtlab_tp", "torch_dtensor_tp")
BASELINE = "torch_dtensor_tp"
WARMUP_ROUNDS = 2


def _measure_on_rank(model_size: str, steps: int, repeats: int, sequence_parallel: bool):
    import torch

    import dtlab
    from dtlab.bench import run_interleaved
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens
    from dtlab.parallel.tensor import (
        dtensor_loss_backward,
        dtensor_parallelize_gpt,
        dtensor_param_groups,
        parallelize_gpt,
    )

    device = dtlab.device()
    mesh = Mesh(tp=dtlab.world_size())
    config = GPTConfig.tiny() if model_size == "tiny" else GPTConfig.small()
    data = SyntheticTokens(config, n_batches=WARMUP_ROUNDS + steps * repeats, batch_size=8)
    batches = [tuple(t.to(device) for t in batch) for batch in data]

    tp = parallelize_gpt(GPT(config, seed=0).to(device), mesh, sequence_parallel)
    ours_opt = torch.optim.AdamW(tp.model.parameters(), lr=1e-3)
    theirs = dtensor_parallelize_gpt(
        GPT(config, seed=0).to(device), mesh.device_mesh["tp"], sequence_parallel
    )
    theirs_opt = torch.optim.AdamW(dtensor_param_groups(theirs), lr=1e-3)  # foreach on CUDA

    def ours_step(i: int) -> None:
        tokens, targets = batches[i]
        ours_opt.zero_grad()
        tp.loss(tp.model(tokens), targets).backward()
        tp.finish_gradients()
        ours_opt.step()

    def theirs_step(i: int) -> None:
        tokens, targets = batches[i]
        theirs_opt.zero_grad()
        dtensor_loss_backward(theirs(tokens), targets)
        theirs_opt.step()

    steps_by_name = {"dtlab_tp": ours_step, "torch_dtensor_tp": theirs_step}
    return run_interleaved(steps_by_name, steps * repeats, WARMUP_ROUNDS)


@dataclass
class ImplementationResult:
    """One implementation: median step time (slowest rank) and its ratio to DTensor's."""

    implementation: str
    step_s: float
    vs_dtensor: Spread
    best_vs_dtensor: float
    step_s_per_round: list[float]


def run(
    cluster=None,
    world_size: int = 2,
    model_size: str = "tiny",
    steps: int = 6,
    repeats: int = 3,
    sequence_parallel: bool = False,
) -> list[ImplementationResult]:
    """Measure both implementations on ``cluster`` (or a fresh one of ``world_size`` ranks)."""
    out = run_on_ranks(
        cluster,
        world_size,
        steps,
        repeats,
        _measure_on_rank,
        model_size,
        steps,
        repeats,
        sequence_parallel,
    )
    seconds = slowest_rank(list(out))
    ratios, best = ratios_to(seconds, BASELINE, repeats), best_ratios_to(seconds, BASELINE)
    return [
        ImplementationResult(
            impl, statistics.median(seconds[impl]), ratios[impl], best[impl], seconds[impl]
        )
        for impl in IMPLEMENTATIONS
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dtlab bench tp", description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2, help="the TP degree")
    parser.add_argument("--steps", type=int, default=6, help="measured rounds per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="ratios: median and min–max")
    parser.add_argument("--model", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--sequence-parallel", action="store_true", help="TP + SP on both sides")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    results = run(
        None, args.world_size, args.model, args.steps, args.repeats, args.sequence_parallel
    )
    mode = "TP + SP" if args.sequence_parallel else "TP"
    print(
        f"{mode} on GPT-{args.model}, tp={args.world_size}: {args.repeats} repeats × "
        f"{args.steps} steps each, interleaved step by step"
    )
    print("time ratio: median over repeats (min–max); best: fastest step ÷ fastest")
    print(f"{'impl':<18}{'step ms':>8}  {'vs DTensor':<18}{'best':>6}")
    for r in results:
        ratio = f"{r.vs_dtensor.median:.2f} ({r.vs_dtensor.low:.2f}–{r.vs_dtensor.high:.2f})"
        print(f"{r.implementation:<18}{r.step_s * 1e3:>8.1f}  {ratio:<18}{r.best_vs_dtensor:>6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)
    return 0
