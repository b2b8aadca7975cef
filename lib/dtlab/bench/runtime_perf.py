"""One device's runtime figures: roofline, fusion, per-op floor, sync cost, allocator — measured.

Run: ``dtlab bench runtime_perf [--fast] [--json PATH]`` (the benchmark's name is its module's,
``runtime_perf``). On a CPU it prints the CPU figures; on a GPU (``torch.cuda.is_available()``)
the same rows measured on GPU 0, with the H100/H200 datasheet beside the roofline, a CUDA-graph
replay against eager, and the caching allocator's real numbers beside the simulated ones.

Every row is measured on the clock, counted by a dispatcher hook, or read from the allocator;
the formula it is compared with is printed beside it and never used in its place.
"""

from __future__ import annotations

import argparse
import json

import torch

from dtlab.models import GPTConfig
from dtlab.perf.fusion import (
    compile_and_measure,
    rmsnorm_eager,
    rmsnorm_eager_reusing,
    rmsnorm_fewer_passes,
    rmsnorm_fewer_passes_bytes,
    rmsnorm_fused_bytes,
    rmsnorm_unfused_bytes,
)
from dtlab.perf.launch import TinyMLP, dispatch_floor, graph_report, step_time_by_width, time_per_op
from dtlab.perf.memory import allocator_view
from dtlab.perf.op_census import count_ops, place_on_roofline
from dtlab.perf.roofline import best_seconds, datasheet_for, measure_roofline
from dtlab.perf.syncs import seconds_per_step
from dtlab.perf.workloads import SYNCS, gpt_training_step, gpt_training_step_fixed


def measure(device: torch.device, fast: bool) -> dict:
    """Every figure of the benchmark on ``device``, as a flat dict of numbers and labels."""
    out: dict = {"device": str(device)}
    roof = measure_roofline(device, fast=fast)
    out |= {"device_name": roof.device, "peak_flops": roof.peak_flops,
            "bandwidth": roof.bandwidth, "ridge": roof.ridge}  # fmt: skip
    sheet = datasheet_for(roof.device)
    if sheet is not None:
        out |= {"datasheet_flops": sheet.bf16_dense_flops,
                "datasheet_bandwidth": sheet.hbm_bandwidth_bytes_per_s}  # fmt: skip

    config = GPTConfig(vocab_size=256, seq_len=64 if fast else 256, d_model=64 if fast else 256,
                       n_layers=2, n_heads=4, d_ff=256 if fast else 1024, dropout=0.0)  # fmt: skip
    placed = place_on_roofline(gpt_training_step(config, 8, device), roof, 3, device)
    total = sum(p.seconds for p in placed) or 1.0
    out["memory_bound_share"] = sum(p.seconds for p in placed if p.bound == "memory") / total

    rows, cols = (4096, 2048) if fast else (8192, 4096)
    x, w = torch.randn(rows, cols, device=device), torch.randn(cols, device=device)
    out["rmsnorm_counted_bytes"] = sum(
        o.nbytes for o in count_ops(lambda: rmsnorm_eager(x, w)).values()
    )
    out["rmsnorm_formula_bytes"] = rmsnorm_unfused_bytes(rows, cols, 4)
    out["rmsnorm_fused_formula_bytes"] = rmsnorm_fused_bytes(rows, cols, 4)
    out["rmsnorm_eager_s"] = best_seconds(lambda: rmsnorm_eager(x, w), device)
    work: dict = {}
    out["rmsnorm_kept_buffers_s"] = best_seconds(
        lambda: rmsnorm_eager_reusing(x, w, work=work), device
    )
    out["rmsnorm_fewer_passes_counted_bytes"] = sum(
        o.nbytes for o in count_ops(lambda: rmsnorm_fewer_passes(x, w)).values()
    )
    out["rmsnorm_fewer_passes_formula_bytes"] = rmsnorm_fewer_passes_bytes(rows, cols, 4)
    out["rmsnorm_fewer_passes_s"] = best_seconds(lambda: rmsnorm_fewer_passes(x, w), device)
    compiled = compile_and_measure(rmsnorm_eager, x, w)
    out |= {"compile_ok": compiled.ok, "compile_cold_start_s": compiled.cold_start_s,
            "compiled_s": compiled.warm_call_s, "compiled_kernels": compiled.kernels,
            "compile_error": compiled.error}  # fmt: skip

    out["op_floor_s"] = dispatch_floor(time_per_op((1, 16, 256), device))
    by_width = step_time_by_width((4, 16, 64), device=device)
    out["per_op_in_step_s"] = min(r["per_op_s"] for r in by_width)
    graph = graph_report(
        TinyMLP(16, 24).to(device), torch.randn(8, 16, device=device), roof.peak_flops
    )
    out |= {f"graph_{k}": v for k, v in graph.items()}

    slow = gpt_training_step(config, 8, device, syncs=SYNCS)
    fixed = gpt_training_step_fixed(config, 8, device, read_every=10)
    for step in (slow, fixed):
        step()
    out["step_with_syncs_s"] = seconds_per_step(slow, 10, device)
    out["step_fixed_s"] = seconds_per_step(fixed, 10, device)

    view = allocator_view([1024, 768, 1280, 512, 1536, 896], 2048, 3, device)
    out |= {f"simulated_{k}": v for k, v in view["simulated"].items() if k != "segments"}
    out["expandable_peak_reserved"] = view["expandable"]["peak_reserved"]
    if view["real"] is not None:
        out |= {
            "real_reserved": view["real"]["reserved"],
            "real_allocated": view["real"]["allocated"],
        }
    return out


def report(r: dict) -> list[str]:
    """The benchmark's printed table: measured, then the formula or datasheet beside it."""
    MiB = 1 << 20
    lines = [
        f"device: {r['device_name']} ({r['device']})",
        f"roofline: peak {r['peak_flops'] / 1e9:.1f} GFLOP/s (GEMM sweep), bandwidth "
        f"{r['bandwidth'] / 1e9:.1f} GB/s (streaming copy), ridge {r['ridge']:.1f} FLOP/B",
    ]
    if "datasheet_flops" in r:
        lines.append(f"  datasheet: {r['datasheet_flops'] / 1e12:.0f} TFLOP/s BF16 dense, "
                     f"{r['datasheet_bandwidth'] / 1e12:.2f} TB/s")  # fmt: skip
    lines += [
        f"lab-GPT step: memory-bound ops take {r['memory_bound_share']:.0%} of the profiled op time",
        f"RMSNorm eager bytes: counted {r['rmsnorm_counted_bytes'] / 1e6:.1f} MB, formula "
        f"{r['rmsnorm_formula_bytes'] / 1e6:.1f} MB; fewer passes: counted {r['rmsnorm_fewer_passes_counted_bytes'] / 1e6:.1f} MB, formula "
        f"{r['rmsnorm_fewer_passes_formula_bytes'] / 1e6:.1f} MB; fully fused {r['rmsnorm_fused_formula_bytes'] / 1e6:.1f} MB (formula, not measured)",
        f"RMSNorm time: eager {r['rmsnorm_eager_s'] * 1e3:.2f} ms, eager with kept buffers "
        f"{r['rmsnorm_kept_buffers_s'] * 1e3:.2f} ms, fewer passes "
        f"{r['rmsnorm_fewer_passes_s'] * 1e3:.2f} ms"
        + (f", compiled {r['compiled_s'] * 1e3:.2f} ms ({r['compiled_kernels']} kernel, cold start "
           f"{r['compile_cold_start_s']:.1f} s)" if r["compile_ok"] else f"; compile failed: {r['compile_error']}"),
        f"per-op floor (one tiny add): {r['op_floor_s'] * 1e6:.1f} µs; per op inside a training "
        f"step: {r['per_op_in_step_s'] * 1e6:.1f} µs",
    ]  # fmt: skip
    if r["graph_measured"]:
        lines.append(f"graph replay: eager {r['graph_eager_s'] * 1e6:.0f} µs → replay "
                     f"{r['graph_graph_s'] * 1e6:.0f} µs (estimate {r['graph_estimate_s'] * 1e6:.0f} µs saved)")  # fmt: skip
    else:
        lines.append(f"graph replay: no device graphs on this device; tiny forward {r['graph_eager_s'] * 1e6:.0f} µs "
                     f"(measured), a graph would remove ≈ {r['graph_estimate_s'] * 1e6:.0f} µs (estimate)")  # fmt: skip
    lines += [
        f"step with 4 planted syncs {r['step_with_syncs_s'] * 1e3:.2f} ms, fixed "
        f"{r['step_fixed_s'] * 1e3:.2f} ms",
        f"simulated allocator on the recorded trace: peak allocated "
        f"{r['simulated_peak_allocated'] / MiB:.0f} MiB, reserved {r['simulated_peak_reserved'] / MiB:.0f} MiB; "
        f"expandable segments {r['expandable_peak_reserved'] / MiB:.0f} MiB",
    ]  # fmt: skip
    if "real_reserved" in r:
        lines.append(f"real allocator after the trace: reserved {r['real_reserved'] / MiB:.0f} MiB, "
                     f"allocated {r['real_allocated'] / MiB:.0f} MiB")  # fmt: skip
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="dtlab bench runtime_perf", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--fast", action="store_true", help="small sizes (seconds, not minutes)")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    figures = measure(device, args.fast)
    print("\n".join(report(figures)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2, default=str)
    return 0
