"""The planner against the cluster: predicted vs measured activations and pipeline bubbles.

    dtlab bench planner_vs_cluster [--pp 2] [--dp 2] [--tp 1] [--cp 1] [--schedule 1f1b]
                                   [--micro-batches 4] [--batch 8] [--sequence-parallel]
                                   [--model tiny|small] [--json PATH]

:func:`planner_vs_cluster` runs one composed training step of a lab GPT on real ranks and puts,
side by side, per rank: the predicted peak of bytes saved for backward
(:func:`dtlab.plan.predict_activations.predicted_activation_bytes`) and the measured one
(saved-tensor hooks, :func:`dtlab.memory.peak_saved.measure_step_activations`); per pipeline: the
predicted bubble (:func:`dtlab.plan.predict_bubble.predicted_bubble`), the bubble of the
executed order replayed on a logical clock
(:func:`dtlab.parallel.pipeline.executed_bubble.executed_bubble`: forward 1, backward 2), and the
wall-clock idle share of the same traced step — a timing, which a busy machine inflates.

It lives here, not in :mod:`dtlab.plan`: the planner is closed form and never runs ranks; holding
its numbers against a real run is a benchmark's (and lab 11's) job.
"""

from __future__ import annotations

import argparse
import json
import math

from dtlab.models import GPTConfig
from dtlab.plan.predict_bubble import predicted_bubble


def _measured_on_rank(
    config: GPTConfig, degrees: dict, schedule: str, n_micro: int, batch: int, sp: bool
) -> dict:
    from dtlab import trace
    from dtlab.memory.peak_saved import measure_step_activations
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, SyntheticTokens
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.pipeline import SCHEDULES

    mesh = Mesh(**degrees)
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=batch, seed=3)[0]
    pipe = SCHEDULES[schedule](mesh.pp_size, n_micro) if mesh.pp_size > 1 else None
    composed = compose_gpt(GPT(config, seed=0), mesh, sequence_parallel=sp, schedule=pipe)
    composed.train_step(tokens, targets)  # warm-up: first calls are slow everywhere
    measured = measure_step_activations(composed, tokens, targets)
    with trace.labels(planner_vs_cluster=True):  # timed without the meter's hooks
        composed.train_step(tokens, targets)
    return {"coordinates": composed.coordinates, "peak": measured["peak"]}


def planner_vs_cluster(
    cluster,
    config: GPTConfig,
    degrees: dict[str, int],
    *,
    schedule: str = "1f1b",
    n_micro: int = 4,
    global_batch: int = 8,
    sequence_parallel: bool = False,
    show: bool = True,
) -> dict[str, list[dict]]:
    """Predicted against measured activations per rank, and bubbles per pipeline, for one step
    of ``config`` composed over ``degrees`` (e.g. ``{"pp": 2, "tp": 2}``) on ``cluster`` (its
    world size the degrees' product). Prints the two tables when ``show``; returns them as
    ``{"ranks": [...], "pipelines": [...]}``."""
    from dtlab.mesh import Layout
    from dtlab.parallel.pipeline.executed_bubble import executed_bubble, wall_clock_bubble
    from dtlab.plan.predict_activations import predicted_activation_bytes

    layout = Layout(**degrees)
    if math.prod(degrees.values()) != cluster.world_size:
        raise ValueError(
            f"degrees {degrees} make {math.prod(degrees.values())} ranks; the cluster has "
            f"{cluster.world_size}: use dtlab.Cluster({math.prod(degrees.values())})"
        )
    args = (config, degrees, schedule, n_micro, global_batch, sequence_parallel)
    run = cluster.run(_measured_on_rank, *args)
    ranks = []
    for rank, measured in enumerate(run):
        pp_rank = measured["coordinates"]["pp"]
        predicted = sum(
            predicted_activation_bytes(
                config, layout, global_batch=global_batch, pp_rank=pp_rank, n_micro=n_micro,
                sequence_parallel=sequence_parallel, schedule=schedule,
            ).values()
        )  # fmt: skip
        ranks.append(
            {
                "rank": rank,
                "pp_rank": pp_rank,
                "predicted_bytes": predicted,
                "measured_bytes": measured["peak"],
                "measured_over_predicted": measured["peak"] / predicted,
            }
        )
    pipelines = []
    if layout.pp > 1:
        step = run.trace.filter(planner_vs_cluster=True)
        for group in layout.groups("pp"):
            pipelines.append({
                "ranks": group,
                "predicted": predicted_bubble(layout.pp, n_micro, schedule),
                "executed_logical": executed_bubble(step, group, n_micro).bubble_fraction_of_total,
                "wall_clock": wall_clock_bubble(step, group),
            })  # fmt: skip
    if show:
        _print(degrees, schedule, n_micro, ranks, pipelines)
    return {"ranks": ranks, "pipelines": pipelines}


def _print(degrees: dict, schedule: str, m: int, ranks: list, pipelines: list) -> None:
    layout = " × ".join(f"{d}{n}" for d, n in degrees.items())
    print(f"{layout}, {schedule}, m={m}: bytes saved for backward at the peak, per rank")
    print("rank  stage    predicted     measured  measured/predicted")
    for r in ranks:
        print(
            f"{r['rank']:>4}  {r['pp_rank']:>5}  {r['predicted_bytes']:>11,}  "
            f"{r['measured_bytes']:>11,}  {r['measured_over_predicted']:>18.3f}"
        )
    if pipelines:
        print("pipeline ranks   predicted  executed (logical clock)  wall clock (timed)")
        for p in pipelines:
            print(
                f"{str(p['ranks']):<15}  {p['predicted']:>9.1%}  {p['executed_logical']:>24.1%}"
                f"  {p['wall_clock']:>18.1%}"
            )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="dtlab bench planner_vs_cluster", description=__doc__.splitlines()[0]
    )
    for dim, default in (("pp", 2), ("dp", 2), ("tp", 1), ("cp", 1)):
        parser.add_argument(f"--{dim}", type=int, default=default, help=f"{dim} degree")
    parser.add_argument("--schedule", default="1f1b", help="1f1b, gpipe or interleaved_1f1b")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--model", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--json", help="also write the two tables to this JSON file")
    args = parser.parse_args(argv)

    from dtlab import Cluster

    degrees = {d: getattr(args, d) for d in ("pp", "dp", "tp", "cp") if getattr(args, d) > 1}
    config = getattr(GPTConfig, args.model)()
    with Cluster(math.prod(degrees.values()), device="auto", timeout=1200.0) as cluster:
        report = planner_vs_cluster(
            cluster, config, degrees, schedule=args.schedule, n_micro=args.micro_batches,
            global_batch=args.batch, sequence_parallel=args.sequence_parallel,
        )  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0
