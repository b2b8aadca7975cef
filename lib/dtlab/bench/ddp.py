"""DDP variants vs torch DDP: step time ratios and how much gradient communication hides behind backward.

    dtlab bench ddp [--world-size 2] [--steps 8] [--model tiny|small]

For each of naive, overlapped and bucketed DDP and ``torch.nn.parallel.DistributedDataParallel``
it trains the lab GPT for ``--steps`` steps (after 2 warm-up steps) in one run on one cluster and
prints the median step time relative to torch DDP. *Hidden fraction* = 1 − exposed/total, where
*total* is the time gradient collectives were in flight (``comm`` spans) and *exposed* is the time
the rank sat blocked waiting for them after backward (``wait:`` spans; for naive DDP every
collective is exposed). Times vary run to run; the ratios are the point.
"""

from __future__ import annotations

import argparse
import statistics
import time

VARIANTS = ("naive", "overlapped", "bucketed", "torch_ddp")


def _train(variant: str, model_size: str, steps: int) -> dict:
    import torch

    import dtlab
    from dtlab import trace
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank
    from dtlab.parallel import BucketedDDP, NaiveDDP, OverlappedDDP

    rank, world = dtlab.rank(), dtlab.world_size()
    config = GPTConfig.tiny() if model_size == "tiny" else GPTConfig.small()
    model = GPT(config, seed=0).to(dtlab.device())
    wrap = {
        "naive": NaiveDDP,
        "overlapped": OverlappedDDP,
        "bucketed": BucketedDDP,
        "torch_ddp": torch.nn.parallel.DistributedDataParallel,
    }[variant]
    ddp = wrap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = SyntheticTokens(config, n_batches=steps + 2, batch_size=8 * world, seed=0)
    times, first_measured_ns = [], None
    for step, batch in enumerate(data):
        x, y = (t.to(dtlab.device()) for t in shard_for_rank(batch, rank, world))
        dtlab.barrier()
        if step == 2:
            first_measured_ns = trace.now_ns()
        start = time.perf_counter()
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        opt.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if step >= 2:
            times.append(time.perf_counter() - start)
    return {"step_s": statistics.median(times), "since_ns": first_measured_ns}


def _hidden_fraction(run, rank: int = 0) -> float | None:
    spans = [s for s in run.trace.spans if s.rank == rank and s.start_ns >= run[rank]["since_ns"]]
    total = sum(s.duration_s for s in spans if s.kind == "comm" and s.name != "broadcast_state")
    exposed = sum(s.duration_s for s in spans if s.kind == "idle" and s.name.startswith("wait:"))
    if total == 0:
        return None
    if not any(s.name.startswith("wait:") for s in spans):
        return 0.0  # blocking collectives after backward: nothing hidden
    return max(0.0, 1.0 - exposed / total)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dtlab bench ddp", description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--model", choices=("tiny", "small"), default="tiny")
    args = parser.parse_args(argv)

    from dtlab import Cluster

    results = {}
    with Cluster(args.world_size, device="auto") as cluster:
        for variant in VARIANTS:
            run = cluster.run(_train, variant, args.model, args.steps)
            hidden = None if variant == "torch_ddp" else _hidden_fraction(run)
            results[variant] = (max(r["step_s"] for r in run), hidden)
    base = results["torch_ddp"][0]
    print(f"DDP on GPT-{args.model}, {args.world_size} ranks, median of {args.steps} steps")
    print(f"{'variant':<12} {'step ms':>9} {'vs torch DDP':>13} {'comm hidden':>12}")
    for variant, (step_s, hidden) in results.items():
        hidden_text = "n/a" if hidden is None else f"{hidden:.0%}"
        print(f"{variant:<12} {step_s * 1e3:>9.2f} {step_s / base:>12.2f}x {hidden_text:>12}")
    return 0
