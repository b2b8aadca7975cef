"""Data-parallel gradient sync on a real PP × DP cluster: exposed time per stage, measured.

:func:`measure_dp_sync` runs on every rank of a ``pp × dp`` cluster (``Mesh(pp=p, dp=d)``).
Each pipeline rank holds its stages of a chain of ``Linear(width, width)`` layers, each wrapped
in :class:`~dtlab.parallel.pipeline.fixed_cost.FixedCost` (F = I = W = ``stage_s`` per whole
stage, ``/v`` per chunk), so the pipeline's timeline is the simulator's and the all-reduce of a
stage's ``width²`` gradient is the real thing on gloo. One step per ``mode``:

* ``"after_step"`` — ``pipe.step()``, then each stage's gradient all-reduced over the dp group,
  blocking (the plain training loop);
* ``"per_stage"`` — the executor's ``on_stage_done`` hook launches a stage's all-reduce
  (``async_op=True``) right after its last backward; the rank waits for all of them after its
  last action.

Times are read on the cluster's aligned clock (:func:`dtlab.trace.now_ns`): when each stage's
reduction was launched, when the rank's pipeline work ended, when its reductions were done. The
**exposed** time of a rank is ``done − (the last pipeline action's end over all ranks)``, at
least 0: how far the sync sticks out past the pipeline. A separate blocking all-reduce of one
stage's gradient, one dp group at a time, timed over ``repeats``
(:func:`one_stage_reduce_s`), is the ``reduce_time`` the model
(:func:`~dtlab.parallel.pipeline.dp_sync.exposed_dp_sync`) is given.
"""

from __future__ import annotations

import statistics

MODES = ("after_step", "per_stage")


def _stages(schedule, pp_rank: int, width: int, stage_s: float, seed: int, device):
    import torch

    from dtlab.parallel.pipeline.fixed_cost import FixedCost

    per_chunk = stage_s * schedule.n_ranks / schedule.n_stages
    stages = {}
    for s in schedule.stages_of(pp_rank):
        layer = torch.nn.Linear(width, width, bias=False)
        with torch.no_grad():
            layer.weight.copy_(
                torch.randn(width, width, generator=torch.Generator().manual_seed(seed + s))
                / width**0.5
            )
        stages[s] = FixedCost(layer, per_chunk, per_chunk, per_chunk).to(device)
    return stages


def measure_dp_sync(
    schedule_name: str,
    p: int,
    dp: int,
    n_micro: int,
    *,
    width: int = 512,
    stage_s: float = 0.02,
    steps: int = 1,
    repeats: int = 5,
) -> dict:
    """On every rank of a ``p·dp`` cluster: one warm-up step, then ``steps`` steps per mode.
    Returns ``{"pp_rank", "dp_rank", "stages", "reduce_s" (one per repeat), "grads",
    "steps": [{mode, launched, pipeline_end, done}]}`` (times in ns on the aligned clock; ``launched[stage]`` for ``per_stage``)."""
    import torch

    import dtlab
    from dtlab import trace
    from dtlab.comm import Communicator
    from dtlab.mesh import Mesh
    from dtlab.parallel.pipeline import SCHEDULES, PipelineExecutor

    mesh = Mesh(pp=p, dp=dp)
    schedule = SCHEDULES[schedule_name](p, n_micro)
    device = dtlab.device()
    stages = _stages(schedule, mesh.pp_rank, width, stage_s, seed=0, device=device)

    def synchronized_now() -> int:  # on a GPU the host clock must wait for the streams
        if device.type == "cuda":
            torch.cuda.synchronize()
        return trace.now_ns()

    dp_comm = Communicator.along(mesh, "dp", "torch")
    world = Communicator.among([list(range(p * dp))], "torch")
    token = torch.zeros(1, device=device)

    def barrier() -> None:  # every rank starts the next measurement together
        world.all_reduce_control(token, name="barrier")

    pipe = PipelineExecutor(
        stages,
        schedule,
        Communicator.along(mesh, "pp", "torch"),
        hidden_size=width,
        loss_fn=lambda out, target: ((out - target) ** 2).mean(),
    )
    g = torch.Generator().manual_seed(1 + mesh.dp_rank)  # each replica its own data
    inputs = torch.randn(n_micro, 2, width, generator=g).to(device)
    targets = torch.randn(n_micro, 2, width, generator=g).to(device)

    def flat(stage: int) -> torch.Tensor:
        return torch.cat([q.grad.reshape(-1) for q in stages[stage].parameters()])

    def unflatten(stage: int, buffer: torch.Tensor) -> None:
        offset = 0
        for q in stages[stage].parameters():
            q.grad.copy_(buffer[offset : offset + q.numel()].view_as(q.grad))
            offset += q.numel()

    reduce_s = []  # per repeat: this rank's launch-to-completion of one stage's all-reduce
    buffer = torch.zeros(width * width + 1, device=device)
    for _ in range(repeats):
        for turn in range(p):  # one dp group at a time, as at the end of a pipeline step
            barrier()
            if turn == mesh.pp_rank:
                start = synchronized_now()
                dp_comm.all_reduce(buffer, name="dp_sync alone")
                reduce_s.append((synchronized_now() - start) / 1e9)

    results = []
    for step in range(-1, steps):
        for mode in MODES:
            for stage in stages.values():
                stage.zero_grad(set_to_none=False)
            pending, launched = [], {}

            def start_sync(stage: int, launched=launched, pending=pending) -> None:
                launched[stage] = trace.now_ns()
                buf = flat(stage)
                handle = dp_comm.all_reduce(buf, name=f"dp_sync stage {stage}", async_op=True)
                pending.append((stage, buf, handle))

            pipe.on_stage_done = start_sync if mode == "per_stage" else None
            barrier()
            with trace.labels(mode=mode, step=step):
                pipe.step(inputs.flatten(0, 1).unsqueeze(1), targets.flatten(0, 1).unsqueeze(1))
                pipeline_end = synchronized_now()
                if mode == "per_stage":
                    for stage, buf, handle in pending:
                        handle.wait()
                        unflatten(stage, buf)
                else:
                    for stage in sorted(stages, reverse=True):
                        launched[stage] = trace.now_ns()
                        buf = flat(stage)
                        dp_comm.all_reduce(buf, name=f"dp_sync stage {stage}")
                        unflatten(stage, buf)
                done = synchronized_now()
            if step >= 0:
                results.append(
                    {"mode": mode, "launched": launched, "pipeline_end": pipeline_end, "done": done}
                )
    return {
        "pp_rank": mesh.pp_rank,
        "dp_rank": mesh.dp_rank,
        "stages": sorted(stages),
        "reduce_s": reduce_s,
        "grads": {s: flat(s) for s in stages},
        "steps": results,
    }


def exposed_per_rank(per_rank: list[dict], mode: str, step: int = 0) -> dict[int, float]:
    """``{pp_rank: seconds its sync ran past the pipeline's end}`` (the slowest dp replica),
    from :func:`measure_dp_sync`'s results on every rank."""
    runs = [(r, [s for s in r["steps"] if s["mode"] == mode][step]) for r in per_rank]
    end = max(run["pipeline_end"] for _, run in runs)
    exposed: dict[int, float] = {}
    for r, run in runs:
        seconds = max(0.0, (run["done"] - end) / 1e9)
        exposed[r["pp_rank"]] = max(exposed.get(r["pp_rank"], 0.0), seconds)
    return dict(sorted(exposed.items()))


def one_stage_reduce_s(per_rank: list[dict], pp_rank: int = 0) -> float:
    """One stage's all-reduce over its dp group, alone: per repeat the *fastest* rank of the
    group — the last to arrive, whose time is the transfer without the others' late start after
    the barrier — then the median over repeats."""
    group = [r["reduce_s"] for r in per_rank if r["pp_rank"] == pp_rank]
    return statistics.median(min(times) for times in zip(*group, strict=True))
