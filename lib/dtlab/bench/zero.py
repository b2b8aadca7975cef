"""ZeRO-3 (dtlab) vs FSDP2 ``fully_shard``, interleaved step by step: step time and memory ratios.

    dtlab bench zero [--world-size 2] [--steps 6] [--repeats 3] [--model tiny|small] [--json PATH]

Every rank shards two replicas of the lab GPT up front — dtlab's ZeRO-3
(``shard_by_zero_stage(model, 3, ...)``) and torch's FSDP2 — each with one unit per block plus
the root and its own AdamW in fp32, then trains both in one run: round r runs each one's step r
(same batch), the order swapped every round (:func:`dtlab.bench.run_interleaved`), so load
drift on a shared machine slows both alike. After 2 warm-up rounds, ``--repeats`` × ``--steps``
rounds are measured. A step's time is the slowest rank's; the time ratio is the median, per
repeat, of each round's dtlab ÷ FSDP2, shown as the median over repeats (min–max); *best* is
fastest step ÷ fastest step.

Memory is the peak of one more step, per rank (the largest rank's): the model state this
implementation holds when the step starts (parameters + gradients + optimizer state, measured
from its tensors, so the other replica on the rank does not count) plus the high-water mark of
what the step allocates — on GPUs from the allocator, on CPU from the profiler's allocation
events (:func:`dtlab.memory.peak_bytes_of`). Times vary run to run; the ratios are the point.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass

from dtlab.bench import Spread, best_ratios_to, ratios_to, run_on_ranks, slowest_rank

IMPLEMENTATIONS = ("dtlab_zero3", "torch_fsdp2")
BASELINE = "torch_fsdp2"
WARMUP_ROUNDS = 2
STATE_CATEGORIES = ("parameters", "gradients", "optimizer_state")


def _measure_on_rank(model_size: str, steps: int, repeats: int) -> dict:
    import torch

    import dtlab
    from dtlab.bench import run_interleaved
    from dtlab.memory import measure_model_state, peak_bytes_of
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank
    from dtlab.parallel import shard_by_zero_stage

    rank, world, device = dtlab.rank(), dtlab.world_size(), dtlab.device()
    config = GPTConfig.tiny() if model_size == "tiny" else GPTConfig.small()
    rounds = steps * repeats
    data = SyntheticTokens(
        config, n_batches=WARMUP_ROUNDS + rounds + 1, batch_size=8 * world, seed=0
    )
    batches = [tuple(t.to(device) for t in shard_for_rank(b, rank, world)) for b in data]

    def build(impl: str):
        """``step(i)`` and ``held()`` (model-state bytes by category) for one implementation."""
        model = GPT(config, seed=0).to(device)
        if impl == "dtlab_zero3":
            setup = shard_by_zero_stage(
                model, 3, torch.optim.AdamW, lr=1e-3, units=list(model.blocks)
            )
            forward, opt, held = setup.forward, setup.optimizer, setup.held_by_category
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh(device.type, (world,))
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            forward = fully_shard(model, mesh=mesh)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

            def held() -> dict[str, int]:
                return dict(measure_model_state(model, opt).by_category)

        def step(i: int) -> None:
            x, y = batches[i]
            opt.zero_grad()
            loss_fn(forward(x), y).backward()
            opt.step()

        def peak_of_one_more_step() -> tuple[int, int]:
            opt.zero_grad()
            state = sum(held().get(k, 0) for k in STATE_CATEGORIES)
            dtlab.barrier()
            return state, peak_bytes_of(lambda: step(len(batches) - 1), device).peak_bytes

        return step, peak_of_one_more_step

    built = {impl: build(impl) for impl in IMPLEMENTATIONS}
    seconds = run_interleaved({i: b[0] for i, b in built.items()}, rounds, WARMUP_ROUNDS)
    # Memory does not drift with load: one measured step each, after the timed rounds.
    peak = {impl: b[1]() for impl, b in built.items()}
    return {"seconds": seconds, "peak_bytes": peak}


@dataclass
class ImplementationResult:
    """One implementation: median step (slowest rank) and peak memory, each vs FSDP2."""

    implementation: str
    step_s: float
    vs_fsdp2: Spread
    best_vs_fsdp2: float
    peak_bytes: int
    peak_vs_fsdp2: float
    state_bytes: int  # the part of peak_bytes held when the step starts
    step_high_water_bytes: int  # the part the step allocated, at its high-water mark
    step_s_per_round: list[float]


def run(
    cluster=None,
    world_size: int = 2,
    model_size: str = "tiny",
    steps: int = 6,
    repeats: int = 3,
) -> list[ImplementationResult]:
    """Measure both implementations on ``cluster`` (or a fresh one of ``world_size`` ranks)."""
    out = run_on_ranks(
        cluster, world_size, steps, repeats, _measure_on_rank, model_size, steps, repeats
    )
    seconds = slowest_rank([r["seconds"] for r in out])
    # (state, step high-water) of the rank whose sum is largest
    held = {impl: max((r["peak_bytes"][impl] for r in out), key=sum) for impl in IMPLEMENTATIONS}
    peak = {impl: sum(held[impl]) for impl in IMPLEMENTATIONS}
    ratios, best = ratios_to(seconds, BASELINE, repeats), best_ratios_to(seconds, BASELINE)
    return [
        ImplementationResult(
            impl,
            statistics.median(seconds[impl]),
            ratios[impl],
            best[impl],
            peak[impl],
            peak[impl] / peak[BASELINE],
            *held[impl],
            seconds[impl],
        )
        for impl in IMPLEMENTATIONS
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dtlab bench zero", description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6, help="measured rounds per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="ratios: median and min–max")
    parser.add_argument("--model", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    results = run(None, args.world_size, args.model, args.steps, args.repeats)
    print(
        f"ZeRO-3 on GPT-{args.model}, {args.world_size} ranks: {args.repeats} repeats × "
        f"{args.steps} steps each, interleaved step by step"
    )
    print("time ratio: median over repeats (min–max); best: fastest step ÷ fastest")
    print("peak = model state held at the step's start + the step's allocation high-water mark")
    print(
        f"{'impl':<12}{'step ms':>8}  {'vs FSDP2':<18}{'best':>6}{'peak MiB':>10}{'vs FSDP2':>10}"
    )
    for r in results:
        ratio = f"{r.vs_fsdp2.median:.2f} ({r.vs_fsdp2.low:.2f}–{r.vs_fsdp2.high:.2f})"
        print(
            f"{r.implementation:<12}{r.step_s * 1e3:>8.1f}  {ratio:<18}{r.best_vs_fsdp2:>6.2f}"
            f"{r.peak_bytes / 2**20:>10.2f}{r.peak_vs_fsdp2:>9.2f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)
    return 0
