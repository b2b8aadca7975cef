"""Checkpoint saves and loads: async blocking time vs a sync save; ours vs torch's DCP.

    dtlab bench checkpoint [--world-size 2] [--model tiny|small] [--steps 4] [--repeats 3]
                           [--json PATH]

Every rank trains one step of the lab GPT under our FSDP and, beside it, the same model under
torch's ``fully_shard`` (so both hold the same sharded state: fp32 weights and AdamW moments).
Each round then runs, in rotated order, each operation once, every rank starting together
(barrier) and the round's time being the slowest rank's:

* ``sync_save`` — :func:`dtlab.checkpoint.save`: write, fsync, commit, return;
* ``async_block`` — :meth:`AsyncCheckpointer.save` until it returns (the snapshot: what training
  waits for); the background write is then awaited *outside* the timed region;
* ``dcp_save`` — ``torch.distributed.checkpoint.save`` of the ``fully_shard`` model + optimizer;
* ``ours_load`` / ``dcp_load`` — load each back into its own model.

Reported from this one run: async blocking ÷ sync save, our save ÷ DCP's, our load ÷ DCP's
(median of per-round ratios per repeat, then min–max over repeats) and the bytes each rank wrote.
Times vary run to run and with the file system; the ratios are the point.
"""

from __future__ import annotations

import argparse
import json
import statistics

from dtlab.bench import Spread, per_repeat, rotated, run_on_ranks, slowest_rank

OPS = ("sync_save", "async_block", "dcp_save", "ours_load", "dcp_load")
RATIOS = (("async_block", "sync_save"), ("sync_save", "dcp_save"), ("ours_load", "dcp_load"))


def _measure_on_rank(model_size: str, rounds: int) -> dict:
    import shutil
    import tempfile
    import time

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from dtlab.checkpoint import AsyncCheckpointer, fsdp_state, load, save
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank
    from dtlab.parallel import FullyShardedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    config = GPTConfig.tiny() if model_size == "tiny" else GPTConfig.small()
    import dtlab

    device = dtlab.device()
    ours = FullyShardedDataParallel(GPT(config, seed=0, device=device))
    ours_opt = torch.optim.AdamW(ours.parameters(), lr=1e-3)
    theirs = GPT(config, seed=0, device=device)
    mesh = init_device_mesh(device.type, (world,))
    for block in theirs.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(theirs, mesh=mesh)
    theirs_opt = torch.optim.AdamW(theirs.parameters(), lr=1e-3)
    x, y = shard_for_rank(SyntheticTokens(config, 1, 2 * world)[0], rank, world)
    for model, opt in ((ours, ours_opt), (theirs, theirs_opt)):
        loss_fn(model(x.to(device)), y.to(device)).backward()
        opt.step()
        opt.zero_grad()

    root = [tempfile.mkdtemp(prefix="dtlab-bench-ckpt-") if rank == 0 else None]
    dist.broadcast_object_list(root, src=0)
    base = root[0]
    saver = AsyncCheckpointer(f"{base}/async")
    seconds: dict[str, list[float]] = {op: [] for op in OPS}

    def timed(op: str, fn) -> None:
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds[op].append(time.perf_counter() - start)

    last_dcp = 0
    for i in range(rounds + 1):  # round 0 warms up
        step = i + 1
        for op in rotated(OPS, i):
            if op == "sync_save":
                timed(op, lambda s=step: save(f"{base}/sync", s, fsdp_state(ours, ours_opt)))
            elif op == "async_block":
                timed(op, lambda s=step: saver.save(s, fsdp_state(ours, ours_opt)))
                saver.wait()
                dist.barrier()
            elif op == "dcp_save":
                msd, osd = get_state_dict(theirs, theirs_opt)
                timed(
                    op,
                    lambda s=step, st={"m": msd, "o": osd}: dcp.save(
                        st, checkpoint_id=f"{base}/dcp/{s}"
                    ),
                )
                last_dcp = step  # a later round may load before it saves (rotated order)
            elif op == "ours_load":
                timed(op, lambda: load(f"{base}/sync", fsdp_state(ours, ours_opt)))
            else:
                msd, osd = get_state_dict(theirs, theirs_opt)
                state = {"m": msd, "o": osd}
                timed(
                    op, lambda s=last_dcp, st=state: dcp.load(st, checkpoint_id=f"{base}/dcp/{s}")
                )
                set_state_dict(theirs, theirs_opt, model_state_dict=msd, optim_state_dict=osd)
        if i == 0:
            seconds = {op: [] for op in OPS}
    written = saver.snapshot_bytes
    dist.barrier()
    if rank == 0:
        shutil.rmtree(base, ignore_errors=True)
    return {"seconds": seconds, "written": written}


def run(cluster, world_size: int, model: str, steps: int, repeats: int) -> dict:
    """Per-op median seconds, the three ratios (:class:`Spread`) and bytes written per rank."""
    per_rank = run_on_ranks(
        cluster, world_size, steps, repeats, _measure_on_rank, model, steps * repeats
    )
    seconds = slowest_rank([r["seconds"] for r in per_rank])
    ratios = {}
    for num, den in RATIOS:
        per_round = [a / b for a, b in zip(seconds[num], seconds[den], strict=True)]
        ratios[f"{num} / {den}"] = Spread.of(
            [statistics.median(r) for r in per_repeat(per_round, repeats)]
        )
    return {
        "median_s": {op: statistics.median(s) for op, s in seconds.items()},
        "ratios": ratios,
        "bytes_written_per_rank": [r["written"] for r in per_rank],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="dtlab bench checkpoint", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--model", choices=("tiny", "small"), default="small")
    parser.add_argument("--steps", type=int, default=4, help="measured rounds per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="ratios: median and min–max")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    out = run(None, args.world_size, args.model, args.steps, args.repeats)
    print(
        f"checkpoint of GPT-{args.model} (FSDP state + AdamW) on {args.world_size} ranks: "
        f"{args.repeats} repeats × {args.steps} rounds, ops interleaved per round"
    )
    for op, s in out["median_s"].items():
        print(f"  {op:<12} {s * 1e3:9.2f} ms")
    for name, spread in out["ratios"].items():
        print(f"  {name:<24} {spread.median:6.3f} ({spread.low:.3f}–{spread.high:.3f})")
    print(f"  bytes written per rank (ours): {out['bytes_written_per_rank']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {**out, "ratios": {k: vars(v) for k, v in out["ratios"].items()}}, f, indent=1
            )
    return 0
