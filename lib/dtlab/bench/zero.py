"""ZeRO-3 (dtlab FullyShardedDataParallel) vs FSDP2 ``fully_shard``: step time and memory ratios.

    dtlab bench zero [--world-size 2] [--steps 6] [--model tiny|small]

Both shard the lab GPT with one unit per block plus the root, train with AdamW in fp32 for
``--steps`` steps after 2 warm-up steps, in one run on one cluster. Memory is the peak of one
more step, per rank: on GPUs the allocator's high-water mark; on CPU the exact model state held
when the step starts (parameters + gradients + optimizer state) plus the high-water mark of what
the step allocates, from the profiler's allocation events (:func:`dtlab.memory.peak_bytes_of`).
Times vary run to run; the ratios are the point.
"""

from __future__ import annotations

import argparse
import statistics
import time


def _train(impl: str, model_size: str, steps: int) -> dict:
    import torch

    import dtlab
    from dtlab.memory import measure_model_state, peak_bytes_of
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank
    from dtlab.parallel import FullyShardedDataParallel

    rank, world, device = dtlab.rank(), dtlab.world_size(), dtlab.device()
    config = GPTConfig.tiny() if model_size == "tiny" else GPTConfig.small()
    model = GPT(config, seed=0).to(device)
    if impl == "dtlab_zero3":
        forward = FullyShardedDataParallel(model, units=list(model.blocks))
        opt = forward.build_optimizer(torch.optim.AdamW, lr=1e-3)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        forward = fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = SyntheticTokens(config, n_batches=steps + 3, batch_size=8 * world, seed=0)
    batches = [tuple(t.to(device) for t in shard_for_rank(b, rank, world)) for b in data]

    def step(x, y):
        opt.zero_grad()
        loss_fn(forward(x), y).backward()
        opt.step()

    times = []
    for i, (x, y) in enumerate(batches[:-1]):
        dtlab.barrier()
        start = time.perf_counter()
        step(x, y)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - start)

    opt.zero_grad()
    if impl == "dtlab_zero3":
        held = opt.held_bytes()
        state_bytes = held["params"] + held["grads"] + held["optimizer_state"]
    else:
        report = measure_model_state(model, opt).by_category
        state_bytes = sum(report[k] for k in ("parameters", "gradients", "optimizer_state"))
    if device.type == "cuda":  # everything the allocator holds, not only the model state
        state_bytes = torch.cuda.memory_allocated(device)
    dtlab.barrier()
    peak = peak_bytes_of(lambda: step(*batches[-1]), device)
    return {"step_s": statistics.median(times), "memory": state_bytes + peak.peak_bytes}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dtlab bench zero", description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--model", choices=("tiny", "small"), default="tiny")
    args = parser.parse_args(argv)

    from dtlab import Cluster

    results = {}
    with Cluster(args.world_size, device="auto") as cluster:
        for impl in ("dtlab_zero3", "torch_fsdp2"):
            run = cluster.run(_train, impl, args.model, args.steps)
            results[impl] = (max(r["step_s"] for r in run), max(r["memory"] for r in run))
    base_time, base_mem = results["torch_fsdp2"]
    memory_kind = "peak"
    print(f"ZeRO-3 on GPT-{args.model}, {args.world_size} ranks, median of {args.steps} steps")
    print("peak = model state held at the step's start + the step's allocation high-water mark")
    print(f"{'impl':<12} {'step ms':>9} {'time ratio':>11} {memory_kind + ' MiB':>20} {'ratio':>6}")
    for impl, (step_s, mem) in results.items():
        print(
            f"{impl:<12} {step_s * 1e3:>9.2f} {step_s / base_time:>10.2f}x "
            f"{mem / 2**20:>20.2f} {mem / base_mem:>5.2f}x"
        )
    return 0
