"""FSDP × TP composed by dtlab vs PyTorch's composition, interleaved step by step: time ratio.

    dtlab bench compose [--dp 2] [--tp 2] [--steps 6] [--repeats 3] [--model tiny|small]
                        [--sequence-parallel] [--json PATH]

Every rank builds the lab GPT twice on one ``Mesh(dp, tp)``: dtlab's
:func:`~dtlab.parallel.compose.compose_gpt` (``data_parallel="fsdp"``: Megatron TP inside, dtlab's
FSDP over dp) and PyTorch's 2-D recipe (DTensor ``parallelize_module`` with
:func:`~dtlab.parallel.tensor.dtensor_parallelize_gpt` over tp, then ``fully_shard`` on every
block and the root over dp, loss under ``loss_parallel``), each with its own AdamW in fp32, both
on torch's collectives, on the same ``DeviceMesh`` groups. Every rank feeds its dp rows of the
same global batch. Rounds alternate which one runs first (:func:`dtlab.bench.run_interleaved`);
after 2 warm-up rounds, ``--repeats`` × ``--steps`` are measured; a step's time is the slowest
rank's, the ratio the median per repeat of dtlab ÷ torch, shown as median over repeats (min–max).
Times vary run to run; the ratio is the point.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass

from dtlab.bench import Spread, best_ratios_to, ratios_to, run_on_ranks, slowest_rank

IMPLEMENTATIONS = ("dtlab_fsdp_tp", "torch_fsdp2_tp")
BASELINE = "torch_fsdp2_tp"
WARMUP_ROUNDS = 2
GLOBAL_BATCH = 8


def _measure_on_rank(dp: int, tp: int, model_size: str, steps: int, repeats: int, sp: bool):
    import torch
    from torch.distributed.fsdp import fully_shard

    import dtlab
    from dtlab.bench import run_interleaved
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.tensor import dtensor_loss_backward, dtensor_parallelize_gpt

    device = dtlab.device()
    mesh = Mesh(dp=dp, tp=tp)
    config = GPTConfig.tiny() if model_size == "tiny" else GPTConfig.small()
    data = SyntheticTokens(config, WARMUP_ROUNDS + steps * repeats, batch_size=GLOBAL_BATCH)
    batches = [tuple(t.to(device) for t in batch) for batch in data]
    rows = GLOBAL_BATCH // dp
    mine = slice(mesh.dp_rank * rows, (mesh.dp_rank + 1) * rows)

    ours = compose_gpt(
        GPT(config, seed=0).to(device), mesh, data_parallel="fsdp", sequence_parallel=sp
    )
    ours_opt = torch.optim.AdamW(ours.parameters(), lr=1e-3)
    theirs = dtensor_parallelize_gpt(GPT(config, seed=0).to(device), mesh.device_mesh["tp"], sp)
    for block in theirs.blocks:
        fully_shard(block, mesh=mesh.device_mesh["dp"])
    fully_shard(theirs, mesh=mesh.device_mesh["dp"])
    theirs_opt = torch.optim.AdamW(theirs.parameters(), lr=1e-3)

    def ours_step(i: int) -> None:
        ours_opt.zero_grad()
        ours.train_step(*batches[i])
        ours_opt.step()

    def theirs_step(i: int) -> None:
        tokens, targets = batches[i]
        theirs_opt.zero_grad()
        dtensor_loss_backward(theirs(tokens[mine]), targets[mine])
        theirs_opt.step()

    steps_by_name = {"dtlab_fsdp_tp": ours_step, "torch_fsdp2_tp": theirs_step}
    return run_interleaved(steps_by_name, steps * repeats, WARMUP_ROUNDS)


@dataclass
class ImplementationResult:
    """One implementation: median step time (slowest rank) and its ratio to torch's."""

    implementation: str
    step_s: float
    vs_torch: Spread
    best_vs_torch: float


def run(
    cluster=None,
    dp: int = 2,
    tp: int = 2,
    model_size: str = "tiny",
    steps: int = 6,
    repeats: int = 3,
    sequence_parallel: bool = False,
) -> list[ImplementationResult]:
    """Measure both on ``cluster`` (or a fresh one of ``dp·tp`` ranks)."""
    out = run_on_ranks(
        cluster, dp * tp, steps, repeats, _measure_on_rank, dp, tp, model_size, steps, repeats,
        sequence_parallel,
    )  # fmt: skip
    seconds = slowest_rank(list(out))
    ratios, best = ratios_to(seconds, BASELINE, repeats), best_ratios_to(seconds, BASELINE)
    return [
        ImplementationResult(impl, statistics.median(seconds[impl]), ratios[impl], best[impl])
        for impl in IMPLEMENTATIONS
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="dtlab bench compose", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6, help="measured rounds per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="ratios: median and min–max")
    parser.add_argument("--model", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--sequence-parallel", action="store_true", help="TP + SP on both sides")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    results = run(
        None, args.dp, args.tp, args.model, args.steps, args.repeats, args.sequence_parallel
    )
    mode = "FSDP × TP + SP" if args.sequence_parallel else "FSDP × TP"
    print(
        f"{mode} on GPT-{args.model}, dp={args.dp} × tp={args.tp}: {args.repeats} repeats × "
        f"{args.steps} steps each, interleaved step by step"
    )
    print("time ratio: median over repeats (min–max); best: fastest step ÷ fastest")
    print(f"{'impl':<18}{'step ms':>8}  {'vs torch':<18}{'best':>6}")
    for r in results:
        ratio = f"{r.vs_torch.median:.2f} ({r.vs_torch.low:.2f}–{r.vs_torch.high:.2f})"
        print(f"{r.implementation:<18}{r.step_s * 1e3:>8.1f}  {ratio:<18}{r.best_vs_torch:>6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)
    return 0
