"""Exposed communication per overlap mechanism, with the technique off and on, measured on ranks.

    dtlab bench overlap [--only tp,fsdp,moe,dp_pp] [--full] [--steps 3] [--json PATH]

One table, one row per (mechanism, implementation, technique off/on); every exposed time, share
and ratio is read from the run's clock or trace, and the only formula is the ``model ms``
column, printed beside the measurement it predicts (dp_pp):

* **tp** — tensor parallelism's backward input-gradient collective launched before the weight
  gradient GEMM and waited after it (plain TP and with sequence parallelism), and async TP
  (collective matmul); :func:`dtlab.parallel.tensor.tp_overlap_figures`, 2 ranks. torch has no
  CPU counterpart (its async TP runs on symmetric memory, GPU only).
* **fsdp** — prefetch depth 0/1/2 × ``reshard_after_forward``, exposed all-gather per unit,
  dtlab's FSDP beside FSDP2 (``fully_shard``; torch's waits are inside torch, so its exposed
  column is empty and its peak memory is shown); :func:`dtlab.parallel.zero.fsdp_prefetch_figures`.
* **moe** — one MoE block's forward on two micro-batches, sequential vs each one's dispatch and
  combine under the other's compute (DualPipe's idea);
  :func:`dtlab.parallel.expert.overlap.measure_two_microbatch_overlap`, 2 ranks. torch has no
  counterpart to run on CPU.
* **dp_pp** — data-parallel gradient sync on a ``pp=2 × dp=2`` cluster (4 ranks), 1F1B and
  interleaved 1F1B, all-reduce after the step vs started per stage as its last backward ends
  (:func:`dtlab.parallel.pipeline.dp_sync_run.measure_dp_sync`; the two modes alternate step by
  step in one run, so the ratio per step pairs steps under the same load). Exposed = how far the
  slowest replica's sync ends past the pipeline's last action, for the pipeline rank that
  exposes the most (stage 0). The model column is
  :func:`~dtlab.parallel.pipeline.exposed_dp_sync` given the measured one-stage all-reduce.
  torch's pipelining reduces a DDP- or FSDP-wrapped stage at its ``REDUCE_GRAD`` action, after
  the stage's last backward (the ``per_stage`` rule); no torch row is shown. Tried on torch 2.13
  with CPU ranks, a ``DistributedDataParallel``-wrapped ``PipelineStage`` under ``Schedule1F1B``
  or ``ScheduleInterleaved1F1B`` hit an internal assert in DDP's reducer during the first step,
  and with ``static_graph=True`` it ran but left some stages' gradients different across the
  replicas. A baseline that does not synchronise is not one to compare against.

Times vary run to run on shared cores; the ratios (on ÷ off, median over the steps) are the point.
"""

from __future__ import annotations

import argparse
import json
import statistics

MECHANISMS = ("tp", "fsdp", "moe", "dp_pp")
DP_PP_SCHEDULES = ("1f1b", "interleaved_1f1b")


def dp_pp_rows(cluster, *, steps: int = 3, width: int = 512, stage_s: float = 0.02) -> list[dict]:
    """Rows for the data-parallel sync under pipelining (``cluster`` of 4 ranks: pp=2, dp=2)."""
    from dtlab.parallel.pipeline import SCHEDULES, Costs, exposed_dp_sync
    from dtlab.parallel.pipeline.dp_sync_run import (
        exposed_per_rank,
        measure_dp_sync,
        one_stage_reduce_s,
    )

    rows = []
    for name in DP_PP_SCHEDULES:
        run = cluster.run(measure_dp_sync, name, 2, 2, 4, width=width, stage_s=stage_s,
                          steps=steps)  # fmt: skip
        schedule = SCHEDULES[name](2, 4)
        chunk = stage_s * schedule.n_ranks / schedule.n_stages
        reduce_s = one_stage_reduce_s(run)
        exposed = {
            mode: [max(exposed_per_rank(run, mode, step).values()) for step in range(steps)]
            for mode in ("after_step", "per_stage")
        }
        ratios = [
            on / off for on, off in zip(exposed["per_stage"], exposed["after_step"], strict=True)
            if off > 0
        ]  # fmt: skip
        for mode, per_step in exposed.items():
            model = exposed_dp_sync(schedule, Costs(chunk, chunk, chunk), reduce_s,
                                    per_stage=mode == "per_stage")  # fmt: skip
            rows.append(
                {
                    "mechanism": f"dp_sync_pp {name}",
                    "implementation": "dtlab",
                    "technique_on": mode == "per_stage",
                    "exposed_ms": 1e3 * statistics.median(per_step),
                    "model_exposed_ms": 1e3 * max(model.values()),
                    "reduce_ms": 1e3 * reduce_s,
                    "on_over_off": statistics.median(ratios) if ratios else None,
                }
            )
    return rows


def moe_rows(cluster, *, tokens: int = 512, rounds: int = 5) -> list[dict]:
    """Rows for MoE dispatch/combine behind a second micro-batch's compute (``cluster``: the EP
    group), sequential vs overlapped from one interleaved run."""
    from dtlab.parallel.expert.overlap import measure_two_microbatch_overlap

    r = measure_two_microbatch_overlap(cluster, tokens=tokens, rounds=rounds)
    return [
        {
            "mechanism": "moe_two_microbatch",
            "implementation": "dtlab",
            "technique_on": name == "overlapped",
            "exposed_ms": 1e3 * r.exposed_s[name],
            "hidden_share": r.hidden_share if name == "overlapped" else None,
            "on_over_off": r.exposed_s["overlapped"] / r.exposed_s["sequential"],
            "equal": r.equal,
        }
        for name in ("sequential", "overlapped")
    ]


def run(
    mechanisms=MECHANISMS, *, fast: bool = True, steps: int = 3, cluster2=None, cluster4=None
) -> list[dict]:
    """Every row of the table (see the module docstring); clusters made and closed if not given."""
    from dtlab import Cluster

    unknown = set(mechanisms) - set(MECHANISMS)
    if unknown:
        raise ValueError(f"unknown mechanisms {sorted(unknown)}; choose from {MECHANISMS}")
    rows: list[dict] = []
    if {"tp", "fsdp", "moe"} & set(mechanisms):
        owned = cluster2 is None
        cluster2 = cluster2 or Cluster(2, device="auto", timeout=1200.0)
        try:
            if "tp" in mechanisms:
                from dtlab.parallel.tensor import tp_overlap_figures

                rows += tp_overlap_figures(cluster2, fast=fast)
            if "fsdp" in mechanisms:
                from dtlab.parallel.zero import fsdp_prefetch_figures

                rows += fsdp_prefetch_figures(cluster2, fast=fast)
            if "moe" in mechanisms:
                rows += moe_rows(cluster2, tokens=512 if fast else 4096)
        finally:
            if owned:
                cluster2.close()
    if "dp_pp" in mechanisms:
        owned = cluster4 is None
        cluster4 = cluster4 or Cluster(4, device="auto", timeout=1200.0)
        try:
            rows += dp_pp_rows(cluster4, steps=steps, width=512 if fast else 2048)
        finally:
            if owned:
                cluster4.close()
    return rows


def _cell(value, fmt: str = ".2f") -> str:
    return "—" if value is None else format(value, fmt)


def format_rows(rows: list[dict]) -> str:
    """The table ``main`` prints: exposed ms per mechanism, technique off and on."""
    lines = [
        f"{'mechanism':<28}{'impl':<13}{'setting':<24}{'exposed ms':>11}{'model ms':>10}"
        f"{'hidden':>8}{'on/off':>8}{'peak MB':>9}"
    ]
    for r in rows:
        if r["mechanism"] == "fsdp_prefetch":
            setting = f"depth {r['depth']}, reshard={r['reshard_after_forward']}"
            exposed, model, hidden, ratio = r.get("exposed_ms_per_unit"), None, None, None
            peak = r.get("peak_step_bytes")
        else:
            setting = "technique on" if r["technique_on"] else "technique off"
            exposed, model = r.get("exposed_ms"), r.get("model_exposed_ms")
            hidden, ratio, peak = r.get("hidden_share"), r.get("on_over_off"), None
        peak_mb = None if peak is None else peak / 2**20
        lines.append(
            f"{r['mechanism']:<28}{r['implementation']:<13}{setting:<24}{_cell(exposed):>11}"
            f"{_cell(model):>10}{_cell(hidden, '.0%'):>8}{_cell(ratio):>8}{_cell(peak_mb):>9}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="dtlab bench overlap", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--only", default=",".join(MECHANISMS), help="comma-separated mechanisms")
    parser.add_argument("--full", action="store_true", help="larger sizes (slower)")
    parser.add_argument("--steps", type=int, default=3, help="measured steps (dp_pp)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    mechanisms = tuple(m for m in args.only.split(",") if m)
    rows = run(mechanisms, fast=not args.full, steps=args.steps)
    print("exposed communication per mechanism (ms; per layer for tp, per unit for fsdp, per")
    print("step for dp_pp); hidden = 1 - exposed/comm (moe: 1 - on/off); on/off = on ÷ off")
    print("(dp_pp: median over steps of the per-step ratio; moe: of the medians over rounds);")
    print("peak MB: one step's allocation high-water (fsdp)")
    print(format_rows(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0
