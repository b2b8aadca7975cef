"""FP8 linear (torch._scaled_mm where it runs) vs BF16 linear: time ratios in one run, paths named.

    dtlab bench precision [--m 4096] [--k 4096] [--n 4096] [--steps 10] [--repeats 3]
                          [--json PATH]

One rank (a GPU when there is one) times forward GEMMs of ``x`` (M×K) by ``Wᵀ`` (K×N), round by
round in rotated order (:func:`dtlab.bench.run_interleaved`):

* ``bf16_linear`` — ``F.linear`` in bf16, the baseline;
* ``fp8_gemm_only`` — ``torch._scaled_mm`` on operands already in E4M3 with per-tensor scales
  (the GEMM alone; skipped where this build's ``_scaled_mm`` does not run);
* ``fp8_tensor``, ``fp8_row``, ``fp8_tile`` — :class:`~dtlab.precision.Fp8Linear` end to end:
  our quantiser (amax, scale, clamp, cast) + the GEMM, on ``_scaled_mm`` where the probe accepts
  the scale layout, else **simulated** (dequantise + fp32 matmul);
* ``mxfp8_cast_rowwise``, ``mxfp8_cast_both`` — the cast alone of ``x`` to MXFP8, the forward's
  row-wise copy vs both the row-wise and the column-wise copy backward needs
  (:mod:`dtlab.precision.directional`; unfused torch ops, so the ratio of the two is the
  measurement, not their size against a fused kernel). Run when M and K are multiples of 32.

Reported: each variant's time ÷ bf16's (median over repeats, min–max) and which GEMM path each
variant ran (``GEMM_PATHS``). On a CPU ``_scaled_mm`` is a reference kernel without FP8 units and
a simulated GEMM is an fp32 matmul plus quantisation, so CPU ratios say nothing about FP8
speed-ups on hardware; only a GPU with FP8 tensor cores (H100 and later) can show one.
"""

from __future__ import annotations

import argparse
import json

from dtlab.bench import Spread, ratios_to, run_on_ranks

BASELINE = "bf16_linear"
WARMUP_ROUNDS = 2


def _measure(m: int, k: int, n: int, steps: int, repeats: int) -> dict:
    import torch
    import torch.nn.functional as F

    import dtlab
    from dtlab.bench import run_interleaved
    from dtlab.precision import GEMM_PATHS, Fp8Linear, Fp8Recipe, quantize_fp8
    from dtlab.precision.directional import both_directions, quantize_rowwise
    from dtlab.precision.fp8_linear import _scaled_mm, scaled_mm_runs

    device = dtlab.device()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g).to(device, torch.bfloat16)
    linear = torch.nn.Linear(k, n, bias=False).to(device, torch.bfloat16)
    layers = {
        f"fp8_{gran}": Fp8Linear.from_linear(linear, Fp8Recipe(gran))
        for gran in ("tensor", "row", "tile")
    }
    xq = quantize_fp8(x, "e4m3", "tensor")
    wq = quantize_fp8(linear.weight, "e4m3", "tensor")
    steps_by_name = {BASELINE: lambda i: F.linear(x, linear.weight)}
    gemm_runs = scaled_mm_runs(xq, wq, torch.bfloat16)
    if gemm_runs:
        steps_by_name["fp8_gemm_only"] = lambda i: _scaled_mm(xq, wq, torch.bfloat16)
    paths = {}
    with torch.no_grad():
        for name, layer in layers.items():
            GEMM_PATHS.clear()
            layer(x)
            paths[name] = sorted(GEMM_PATHS)
            steps_by_name[name] = lambda i, layer=layer: layer(x)
        if gemm_runs:
            paths["fp8_gemm_only"] = ["forward:scaled_mm"]
        if m % 32 == 0 and k % 32 == 0:
            steps_by_name["mxfp8_cast_rowwise"] = lambda i: quantize_rowwise(x)
            steps_by_name["mxfp8_cast_both"] = lambda i: both_directions(x)
            paths["mxfp8_cast_rowwise"] = ["cast only: row-wise copy (unfused torch ops)"]
            paths["mxfp8_cast_both"] = ["cast only: row-wise + column-wise (unfused torch ops)"]
        paths[BASELINE] = ["bf16 F.linear"]
        seconds = run_interleaved(steps_by_name, steps * repeats, WARMUP_ROUNDS)
    return {"seconds": seconds, "paths": paths, "device": str(device)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dtlab bench precision", description=__doc__)
    parser.add_argument("--m", type=int, default=4096)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    for name in ("m", "k", "n"):
        if getattr(args, name) % 16:
            parser.error(f"--{name} {getattr(args, name)} must be a multiple of 16 (FP8 GEMMs)")
    result = run_on_ranks(
        None, 1, args.steps, args.repeats, _measure, args.m, args.k, args.n, args.steps,
        args.repeats,
    )[0]  # fmt: skip
    ratios: dict[str, Spread] = ratios_to(result["seconds"], BASELINE, args.repeats)
    print(f"FP8 vs BF16 linear, x {args.m}×{args.k} @ Wᵀ {args.k}×{args.n}, on {result['device']}")
    for name, spread in ratios.items():
        print(
            f"  {name:>14}: {spread.median:6.2f}× bf16 ({spread.low:.2f}–{spread.high:.2f})  "
            f"path: {', '.join(result['paths'][name])}"
        )
    if not result["device"].startswith("cuda"):
        print(
            "  on a CPU there are no FP8 units: _scaled_mm is a reference kernel and a simulated "
            "GEMM is fp32 work plus quantisation — these ratios are not an FP8 speed-up"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(
                {
                    "args": vars(args),
                    "device": result["device"],
                    "paths": result["paths"],
                    "ratios": {k: vars(v) for k, v in ratios.items()},
                    "seconds": result["seconds"],
                },
                out,
                indent=2,
            )
    return 0
