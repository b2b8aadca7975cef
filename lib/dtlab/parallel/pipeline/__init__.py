"""Pipeline parallelism with schedules as data: generate → validate → simulate → execute.

* :mod:`~dtlab.parallel.pipeline.actions` — :class:`Action` (``"1F0"``, ``"0I3"``, ...) and
  :class:`Schedule` (per rank, its ordered actions), in PyTorch's action-string form.
* :mod:`~dtlab.parallel.pipeline.schedules` — :func:`gpipe`, :func:`one_f_one_b`,
  :func:`interleaved_1f1b`; :mod:`~dtlab.parallel.pipeline.zero_bubble` — :func:`zb_h1`,
  :func:`dualpipe_v` (split backward: I and W); :mod:`~dtlab.parallel.pipeline.zero_bubble_v`
  — :func:`zbv`, :func:`interleaved_zero_bubble`.
* :mod:`~dtlab.parallel.pipeline.validate` — :func:`validate`: completeness, order, deadlock;
  errors name the rank and the action (:class:`ScheduleError`).
* :mod:`~dtlab.parallel.pipeline.simulate` — :func:`simulate` with :class:`Costs`: timeline
  (as trace spans), bubble in both conventions, activations in flight per stage.
* :mod:`~dtlab.parallel.pipeline.communication` — :func:`with_communication`: the sends and
  receives written out in an order blocking p2p cannot deadlock.
* :mod:`~dtlab.parallel.pipeline.execute` — :func:`pipeline_gpt` / :class:`PipelineExecutor`:
  the same schedule on real ranks over the mesh's pp group.
* :mod:`~dtlab.parallel.pipeline.executed_bubble` — :func:`executed_bubble`: the order the ranks
  ran, read back from a trace of any of these schedules and replayed on a logical clock.
* :mod:`~dtlab.parallel.pipeline.torch_orders` — :func:`torch_schedule`: the orders PyTorch's
  schedules execute; :func:`torch_validate`: torch's own schedule checker.
* :mod:`~dtlab.parallel.pipeline.dp_sync` — :func:`dp_slack`, :func:`exposed_dp_sync`: how much
  of each stage's data-parallel gradient sync hides behind the pipeline, from a schedule;
  :mod:`~dtlab.parallel.pipeline.dp_sync_run` measures it on a PP × DP cluster.
* :mod:`~dtlab.parallel.pipeline.micro_batch` — GEMM throughput against micro-batch size and
  the pipeline step it implies; :class:`FixedCost` — a stage made to cost fixed times.
"""

from dtlab.parallel.pipeline.actions import (
    Action,
    Schedule,
    ScheduleError,
    loop_stage_ranks,
    v_stage_ranks,
)
from dtlab.parallel.pipeline.communication import bytes_sent_per_rank, with_communication
from dtlab.parallel.pipeline.dp_sync import dp_slack, exposed_dp_sync, gradients_done
from dtlab.parallel.pipeline.execute import (
    PipelineExecutor,
    embedding_group,
    pipeline_gpt,
    sum_tied_gradients,
)
from dtlab.parallel.pipeline.executed_bubble import executed_bubble
from dtlab.parallel.pipeline.fixed_cost import FixedCost
from dtlab.parallel.pipeline.replay import Costs
from dtlab.parallel.pipeline.schedules import gpipe, interleaved_1f1b, one_f_one_b
from dtlab.parallel.pipeline.simulate import Simulation, measured_bubble, simulate
from dtlab.parallel.pipeline.torch_orders import TORCH_SCHEDULES, torch_schedule, torch_validate
from dtlab.parallel.pipeline.validate import validate
from dtlab.parallel.pipeline.zero_bubble import dualpipe_v, zb_h1
from dtlab.parallel.pipeline.zero_bubble_v import interleaved_zero_bubble, zbv, zero_bubble_idle

SCHEDULES = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved_1f1b": interleaved_1f1b,
    "zb_h1": zb_h1,
    "dualpipe_v": dualpipe_v,
    "zbv": zbv,
    "interleaved_zb": interleaved_zero_bubble,
}
"""Every generator by name: ``SCHEDULES[name](p, m)`` (the interleaved ones also take
``n_virtual``)."""

__all__ = [
    "Action",
    "Costs",
    "FixedCost",
    "PipelineExecutor",
    "SCHEDULES",
    "Schedule",
    "ScheduleError",
    "Simulation",
    "TORCH_SCHEDULES",
    "bytes_sent_per_rank",
    "dp_slack",
    "dualpipe_v",
    "embedding_group",
    "executed_bubble",
    "exposed_dp_sync",
    "gpipe",
    "gradients_done",
    "interleaved_1f1b",
    "interleaved_zero_bubble",
    "loop_stage_ranks",
    "measured_bubble",
    "one_f_one_b",
    "pipeline_gpt",
    "simulate",
    "sum_tied_gradients",
    "torch_schedule",
    "torch_validate",
    "v_stage_ranks",
    "validate",
    "with_communication",
    "zb_h1",
    "zbv",
    "zero_bubble_idle",
]
