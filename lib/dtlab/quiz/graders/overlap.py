"""Graders for lab 12 (overlap): each stage's exposed data-parallel sync, read off a schedule.

``overlap.exposed_dp_per_stage`` — ``fn(schedule, costs, reduce_time) -> {stage: seconds}``:
with pipeline × data parallelism, each stage all-reduces its weight gradients over its dp group
once per step, starting the moment they are final — after the stage's **last** gradient action,
its last B, or its last W when the backward is split (I/W) — and each stage on a link of its own.
What the all-reduce (``reduce_time``) leaves past the end of the pipeline step is exposed:
``max(0, reduce_time - slack)``, with slack = the step's end minus that last gradient action's
end. Graded on the cluster's ranks against
:func:`~dtlab.parallel.pipeline.dp_sync.exposed_per_stage` for 1F1B, GPipe, interleaved 1F1B,
ZB-H1 and ZB-V, with unequal F/I/W costs, message time and reduce times from "hides fully" to
"hides nothing". :func:`~dtlab.parallel.pipeline.simulate` is allowed (placing actions in time
is lab 05's skill); the library's slack and exposure functions are refused.

The ``*_key`` functions at the end compute the bank's keys (``quizzes/overlap.yaml``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.watch import noticing_calls

TOLERANCE = 1e-9
# (generator, p, m, per-chunk costs (F, I, W, p2p), reduce time)
DP_CASES = (
    ("1f1b", 4, 8, (1.0, 1.0, 1.0, 0.0), 3.0),
    ("1f1b", 3, 5, (1.0, 1.5, 0.5, 0.1), 10.0),
    ("gpipe", 3, 4, (1.0, 1.0, 1.0, 0.0), 2.5),
    ("interleaved_1f1b", 2, 4, (0.5, 0.5, 0.5, 0.0), 1.2),
    ("interleaved_1f1b", 4, 8, (0.5, 0.7, 0.3, 0.05), 2.0),
    ("zb_h1", 4, 8, (1.0, 1.0, 1.0, 0.0), 1.0),
    ("zbv", 3, 6, (0.5, 0.5, 0.5, 0.0), 2.0),
    ("1f1b", 2, 4, (1.0, 1.0, 1.0, 0.0), 0.5),
)


def _answers() -> dict[Callable, str]:
    from dtlab.parallel.pipeline import dp_sync

    return {
        dp_sync.dp_slack: "dtlab.parallel.pipeline.dp_slack",
        dp_sync.exposed_dp_sync: "dtlab.parallel.pipeline.exposed_dp_sync",
        dp_sync.exposed_per_stage: "dtlab.parallel.pipeline.dp_sync.exposed_per_stage",
        dp_sync.gradients_done: "dtlab.parallel.pipeline.gradients_done",
        dp_sync.slack_in_backward_slots: "dtlab.parallel.pipeline.dp_sync.slack_in_backward_slots",
    }


def _case(name: str, p: int, m: int, costs: tuple, reduce_time: float):
    from dtlab.parallel.pipeline import SCHEDULES, Costs

    return SCHEDULES[name](p, m), Costs(*costs), reduce_time


def _dp_on_rank(fn: Callable) -> dict:
    values, used, errors = [], [], []
    for case in DP_CASES:
        schedule, costs, reduce_time = _case(*case)
        with noticing_calls(_answers()) as noticed:
            try:
                values.append(fn(schedule, costs, reduce_time))
            except NotImplementedError:
                raise
            except Exception as error:  # noqa: BLE001 - reported to the learner
                values.append(None)
                errors.append(f"{schedule.name} (p={schedule.n_ranks}): raised {error!r}")
        used += noticed
    return {"values": values, "used": used, "errors": errors}


def _hint(schedule, costs, reduce_time: float, got: dict) -> str:
    from dtlab.parallel.pipeline import dp_slack, simulate

    def close(values: dict) -> bool:
        return all(
            isinstance(got.get(s), int | float) and abs(got[s] - v) < TOLERANCE
            for s, v in values.items()
        )

    sim = simulate(schedule, costs)
    last_input: dict[int, float] = {}
    for rank in sim.timeline:
        for t in rank:
            if t.action.kind in ("B", "I"):
                last_input[t.action.stage] = max(last_input.get(t.action.stage, 0.0), t.end)
    if close({s: max(0.0, reduce_time - (sim.makespan - t)) for s, t in last_input.items()}):
        return (
            "with a split backward the weights' gradients are final after the stage's last W, "
            "not its last I — nobody waits for a W, so schedules push W's late"
        )
    slack = dp_slack(schedule, costs)
    if close(slack):
        return "that is each stage's slack; the exposed time is what the reduction leaves past it"
    if close({s: reduce_time - v for s, v in slack.items()}):
        return "a reduction that finishes before the step ends exposes 0, never a negative time"
    return (
        "per stage: slack = the step's end minus the end of the stage's last gradient action "
        "(B or W); exposed = max(0, reduce_time - slack)"
    )


@exercise("overlap.exposed_dp_per_stage", title="Each stage's exposed DP sync", world_size=2)
def grade_exposed_dp_per_stage(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(schedule, costs, reduce_time) -> {stage: exposed}`` (see the module docstring)."""
    from dtlab.parallel.pipeline.dp_sync import exposed_per_stage

    results = cluster.run(_dp_on_rank, fn)
    for r in results:
        if r["used"]:
            raise NotTheSkill(
                f"your function calls {r['used'][0]} — the library's answer. Read the slack "
                "yourself: simulate the schedule, find each stage's last B or W, subtract"
            )
    for r in results:
        if r["errors"]:
            raise AssertionError(r["errors"][0])
    for case, got in zip(DP_CASES, results[0]["values"], strict=True):
        schedule, costs, reduce_time = _case(*case)
        want = exposed_per_stage(schedule, costs, reduce_time)
        where = f"{schedule.name}, p={schedule.n_ranks}, m={schedule.n_micro}, {costs}"
        if not isinstance(got, dict) or sorted(got) != sorted(want):
            raise AssertionError(
                f"{where}: return a dict {{stage: exposed seconds}} for stages "
                f"{sorted(want)}, got {got!r}"
            )
        wrong = [s for s in want if not isinstance(got[s], int | float)
                 or abs(got[s] - want[s]) > TOLERANCE]  # fmt: skip
        if wrong:
            s = wrong[0]
            raise AssertionError(
                f"{where}, reduce_time={reduce_time}: stage {s} exposes {want[s]:.4g}, you "
                f"returned {got[s]!r} — {_hint(schedule, costs, reduce_time, got)}"
            )
    return GradeResult(
        True,
        f"Right for {len(DP_CASES)} pipelines — 1F1B, GPipe, interleaved 1F1B, ZB-H1 and ZB-V, "
        "unequal F/I/W, messages that cost time — computed on every rank. Stage 0 exposes the "
        "most under 1F1B; under the zero-bubble schedules the W's in the drain take the slack.",
    )


# -- quiz keys, from the library -----------------------------------------------------------------
def dp_slack_key(schedule: str, p: int, m: int, stage: int, **costs: float) -> float:
    """Stage ``stage``'s slack under ``schedule`` (simulated with ``Costs(**costs)``)."""
    from dtlab.parallel.pipeline import SCHEDULES, Costs, dp_slack

    return dp_slack(SCHEDULES[schedule](p, m), Costs(**costs))[stage]


def exposed_dp_key(
    schedule: str, p: int, m: int, rank: int, reduce_time: float, per_stage: bool = True, **costs
) -> float:
    """Rank ``rank``'s exposed dp sync (:func:`~dtlab.parallel.pipeline.exposed_dp_sync`)."""
    from dtlab.parallel.pipeline import SCHEDULES, Costs, exposed_dp_sync

    sim_costs = Costs(**costs)
    return exposed_dp_sync(SCHEDULES[schedule](p, m), sim_costs, reduce_time, per_stage=per_stage)[
        rank
    ]


def zero_bubble_idle_key(schedule: str, p: int, m: int, rank: int = 0, **costs: float) -> float:
    """Rank ``rank``'s idle time in one step of ``schedule``, simulated."""
    from dtlab.parallel.pipeline import SCHEDULES, Costs, simulate

    return simulate(SCHEDULES[schedule](p, m), Costs(**costs)).idle(rank)


def peak_rank_in_flight_key(schedule: str, p: int, m: int, rank: int = 0) -> int:
    """(stage, micro-batch) activation sets ``rank`` holds at once under ``schedule``."""
    from dtlab.parallel.pipeline import SCHEDULES, simulate

    return simulate(SCHEDULES[schedule](p, m)).peak_rank_in_flight(rank)


def pipeline_step_key(
    seconds: dict, global_batch: int, p: int, micro_batch: int, v: int = 1
) -> float:
    """The step at ``micro_batch`` for a given ``t(b)`` table (``{b: seconds}``): 1F1B when
    ``v = 1``, interleaved otherwise (:func:`~dtlab.parallel.pipeline.micro_batch.pipeline_steps`)."""
    from dtlab.parallel.pipeline.micro_batch import GemmTime, pipeline_steps

    times = [GemmTime(int(b), float(t), 1.0) for b, t in seconds.items()]
    (row,) = [r for r in pipeline_steps(times, global_batch, p, v) if r.micro_batch == micro_batch]
    return row.one_f_one_b if v == 1 else row.interleaved


def best_micro_batch_key(seconds: dict, global_batch: int, p: int, v: int = 1) -> int:
    """The ``b`` with the shortest step for a ``t(b)`` table (1F1B when ``v = 1``)."""
    from dtlab.parallel.pipeline.micro_batch import GemmTime, best_micro_batch, pipeline_steps

    times = [GemmTime(int(b), float(t), 1.0) for b, t in seconds.items()]
    rows = pipeline_steps(times, global_batch, p, v)
    return best_micro_batch(rows, "one_f_one_b" if v == 1 else "interleaved")
