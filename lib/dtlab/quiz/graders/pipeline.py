"""Graders for lab 05 (pipeline parallelism): the 1F1B schedule and the bubble formula.

``pipeline.one_f_one_b`` — ``fn(n_ranks, n_micro)``: per pipeline rank, the ordered list of its
actions (``Action`` objects or PyTorch's strings ``"0F1"``, ``"1B0"``), stage ``r`` on rank
``r``. Graded as 1F1B is defined (Narayanan et al. 2021, Sec. 2.2), not against one listing:

1. it is a schedule at all — :func:`~dtlab.parallel.pipeline.validate` (every F and B once, F
   before B, no deadlock; its error names the rank and the action);
2. it has GPipe's bubble, no more — simulated with equal stage costs, idle / total is
   ``(p-1)/(m+p-1)``;
3. it is *1F1B's* memory — rank ``r`` never holds more than ``p-r`` micro-batches' activations
   (GPipe holds ``m``);
4. it trains — executed on 2 real ranks (the lab GPT in fp64, tied embedding and head), its loss
   and every gradient equal one process's on the whole batch.

Calling the library's generators (``one_f_one_b``, or ``interleaved_1f1b`` with ``v=1``, which
is the same order) or importing torch's order is refused: the skill is writing the order.

``pipeline.bubble_fraction`` — ``fn(p, m, v=1)``: the idle share of a 1F1B step (idle / total)
with ``v`` model chunks per rank. The key is the simulator's measurement of the library's own
schedules, not a formula; calling :mod:`dtlab.cost.bubble` or the simulator is refused.

The ``*_key`` functions at the end compute quiz keys from the simulator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.watch import noticing_calls

SCHEDULE_CASES = ((1, 3), (2, 1), (2, 2), (2, 5), (3, 2), (3, 7), (4, 4), (4, 9))
EXECUTED_CASES = ((2, 3), (2, 4))  # p = 2: the grading cluster's ranks
BUBBLE_CASES = ((2, 4, 1), (4, 8, 1), (8, 32, 1), (4, 4, 1), (2, 1, 1), (4, 8, 2), (2, 4, 4))
GRAD_TOLERANCE = 1e-12  # fp64: only the order of the micro-batch sums differs
BUBBLE_TOLERANCE = 1e-9
MICRO_BATCH = 2


def _library_answers(bubbles: bool = False) -> dict[Callable, str]:
    """The library's schedule generators and torch's orders; with ``bubbles`` also the bubble
    formulas and the simulator (the answers to the bubble exercise, not to the schedule one)."""
    from dtlab.cost import bubble
    from dtlab.parallel.pipeline import schedules, torch_orders, zero_bubble
    from dtlab.parallel.pipeline.simulate import simulate

    answers = {
        schedules.one_f_one_b: "dtlab.parallel.pipeline.one_f_one_b",
        schedules.interleaved_1f1b: "dtlab.parallel.pipeline.interleaved_1f1b",
        schedules._interleaved_rank: "dtlab.parallel.pipeline.interleaved_1f1b",
        schedules.gpipe: "dtlab.parallel.pipeline.gpipe",
        zero_bubble.zb_h1: "dtlab.parallel.pipeline.zb_h1",
        zero_bubble.dualpipe_v: "dtlab.parallel.pipeline.dualpipe_v",
        torch_orders.torch_schedule: "dtlab.parallel.pipeline.torch_schedule",
    }
    if not bubbles:
        return answers
    return {
        **answers,
        simulate: "dtlab.parallel.pipeline.simulate",
        bubble.bubble_fraction_of_total: "dtlab.cost.bubble.bubble_fraction_of_total",
        bubble.bubble_ratio_to_ideal: "dtlab.cost.bubble.bubble_ratio_to_ideal",
        bubble.interleaved_bubble_fraction_of_total: (
            "dtlab.cost.bubble.interleaved_bubble_fraction_of_total"
        ),
        bubble.interleaved_bubble_ratio_to_ideal: (
            "dtlab.cost.bubble.interleaved_bubble_ratio_to_ideal"
        ),
    }


def _as_schedule(returned: Any, p: int, m: int):
    """The learner's per-rank lists as a :class:`Schedule` (stage ``r`` on rank ``r``)."""
    from dtlab.parallel.pipeline import Schedule, loop_stage_ranks

    if isinstance(returned, Schedule):
        returned = returned.actions
    if not isinstance(returned, list | tuple) or len(returned) != p:
        raise AssertionError(
            f"for p={p}, m={m} return a list of {p} lists, one per rank (rank r's actions in "
            f"order), not {type(returned).__name__}"
            + (f" of length {len(returned)}" if isinstance(returned, list | tuple) else "")
        )
    try:
        orders = {r: [str(a) for a in actions] for r, actions in enumerate(returned)}
        return Schedule.from_torch_strings(
            orders, name="your 1F1B", n_micro=m, stage_ranks=loop_stage_ranks(p)
        )
    except (TypeError, ValueError) as error:
        raise AssertionError(f"for p={p}, m={m}: {error}") from error


def _execute_on_rank(orders: dict[int, list[str]], p: int, m: int) -> dict:
    import torch

    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens
    from dtlab.parallel.pipeline import Schedule, loop_stage_ranks, pipeline_gpt

    config = GPTConfig.tiny(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=2 * p)
    schedule = Schedule.from_torch_strings(orders, "yours", m, loop_stage_ranks(p))
    pipe = pipeline_gpt(GPT(config, seed=0, dtype=torch.float64), Mesh(pp=p), schedule)
    loss = pipe.step(*SyntheticTokens(config, 1, MICRO_BATCH * m, seed=3)[0])
    grads = {
        name: param.grad.clone()
        for stage in pipe.stages.values()
        for name, param in stage.named_parameters()
        if param.grad is not None
    }
    return {"loss": None if loss is None else loss.item(), "grads": grads}


def _one_process(p: int, m: int) -> tuple[float, dict]:
    import torch

    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, split_into_stages

    config = GPTConfig.tiny(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=2 * p)
    model = GPT(config, seed=0, dtype=torch.float64)
    tokens, targets = SyntheticTokens(config, 1, MICRO_BATCH * m, seed=3)[0]
    loss = loss_fn(model(tokens), targets)
    loss.backward()
    grads_by_param = {id(param): param.grad for param in model.parameters()}
    names = {
        f"{s}:{name}": grads_by_param[id(param)]
        for s, stage in enumerate(split_into_stages(model, p))
        for name, param in stage.named_parameters()
    }
    return loss.item(), names


@exercise("pipeline.one_f_one_b", title="The 1F1B schedule", world_size=2)
def grade_one_f_one_b(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(n_ranks, n_micro)`` → per rank, its actions in 1F1B order (see the module doc)."""
    from dtlab.parallel.pipeline import ScheduleError, simulate, validate

    checked = []
    for p, m in SCHEDULE_CASES:
        with noticing_calls(_library_answers()) as used:
            returned = fn(p, m)
        if used:
            raise NotTheSkill(
                f"your generator calls {used[0]} — the library's own answer. Build the lists "
                "yourself: warm-up forwards, then one forward and one backward, then the drain"
            )
        schedule = _as_schedule(returned, p, m)
        try:
            validate(schedule)
        except ScheduleError as error:
            raise AssertionError(f"for p={p}, m={m} the schedule cannot run: {error}") from error
        sim = simulate(schedule)
        want = (p - 1) / (m + p - 1)
        if sim.bubble_fraction_of_total > want + BUBBLE_TOLERANCE:
            raise AssertionError(
                f"for p={p}, m={m} your order idles {sim.bubble_fraction_of_total:.1%} of the "
                f"step, more than 1F1B's (p-1)/(m+p-1) = {want:.1%}: a rank waits for a forward "
                "or backward it could have had. Rank r warms up with exactly p-1-r forwards"
            )
        for r in range(p):
            held = sim.peak_in_flight(r)
            if held > p - r:
                raise AssertionError(
                    f"for p={p}, m={m} rank {r} holds {held} micro-batches' activations at once; "
                    f"1F1B holds at most p-r = {p - r}. That is GPipe's memory: after its p-1-r "
                    "warm-up forwards a rank must alternate one forward with one backward"
                )
        checked.append(f"p={p} m={m}")
    for p, m in EXECUTED_CASES:
        orders = _as_schedule(fn(p, m), p, m).to_torch_strings()
        results = cluster.run(_execute_on_rank, orders, p, m)
        want_loss, want_grads = _one_process(p, m)
        loss = next(r["loss"] for r in results if r["loss"] is not None)
        if abs(loss - want_loss) > GRAD_TOLERANCE:
            raise AssertionError(
                f"executed on {p} ranks with m={m}, the loss is {loss!r}, one process's "
                f"{want_loss!r}: every micro-batch needs its F and its B exactly once"
            )
        for rank, r in enumerate(results):  # rank r holds stage r
            for name, grad in r["grads"].items():
                gap = (grad - want_grads[f"{rank}:{name}"]).abs().max().item()
                if gap > GRAD_TOLERANCE:
                    raise AssertionError(
                        f"executed on {p} ranks with m={m}, rank {rank}'s gradient of {name} "
                        f"differs from one process's by {gap:.3g}"
                    )
    return GradeResult(
        True,
        f"Valid, GPipe's bubble (p-1)/(m+p-1) and at most p-r micro-batches in flight on rank r "
        f"for {len(checked)} (p, m) pairs; executed on 2 ranks (m = 3 and 4), loss and every "
        f"gradient equal one process's within {GRAD_TOLERANCE:g}.",
        {"cases": ", ".join(checked)},
    )


def _bubble_on_rank(fn: Callable, cases: tuple) -> dict:
    with noticing_calls(_library_answers(bubbles=True)) as used:
        values = [fn(p, m, v) for p, m, v in cases]
    return {"used": used, "values": values}


def _simulated_bubble(p: int, m: int, v: int) -> float:
    from dtlab.parallel.pipeline import interleaved_1f1b, one_f_one_b, simulate

    schedule = one_f_one_b(p, m) if v == 1 else interleaved_1f1b(p, m, v)
    return simulate(schedule).bubble_fraction_of_total


@exercise("pipeline.bubble_fraction", title="The bubble of (interleaved) 1F1B", world_size=2)
def grade_bubble_fraction(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(p, m, v=1)`` → idle / total of 1F1B with ``v`` chunks per rank, as the simulator
    measures it with equal stage costs."""
    results = cluster.run(_bubble_on_rank, fn, BUBBLE_CASES)
    for r in results:
        if r["used"]:
            raise NotTheSkill(
                f"your function calls {r['used'][0]} — the library's answer. Count the idle "
                "slots yourself: fill and drain, against the useful work"
            )
    for (p, m, v), got in zip(BUBBLE_CASES, results[0]["values"], strict=True):
        want = _simulated_bubble(p, m, v)
        if not isinstance(got, int | float) or abs(got - want) > BUBBLE_TOLERANCE:
            if isinstance(got, int | float) and abs(got - (p - 1) / (v * m)) < BUBBLE_TOLERANCE:
                hint = "that is idle / ideal (Megatron's convention); this asks idle / total"
            elif isinstance(got, int | float) and abs(got - (p - 1) / (m + p - 1)) < 1e-9:
                hint = "with v chunks per rank each fill/drain slot is v times shorter"
            else:
                hint = "idle / total = fill-and-drain slots over (useful + fill-and-drain)"
            raise AssertionError(
                f"bubble_fraction(p={p}, m={m}, v={v}) = {got!r}; the simulator measures "
                f"{want:.6f}: {hint}"
            )
    return GradeResult(
        True,
        f"Your formula equals the simulator's idle/total for {len(BUBBLE_CASES)} pipelines "
        "(p from 2 to 8, m from 1 to 32, v = 1, 2, 4), computed on every rank.",
    )


# -- quiz keys, from the simulator ---------------------------------------------------------------
def peak_in_flight_key(schedule: str, p: int, m: int, stage: int = 0) -> int:
    """Micro-batches whose activations ``stage`` holds at once under ``schedule`` (simulated)."""
    from dtlab.parallel.pipeline import SCHEDULES, simulate

    return simulate(SCHEDULES[schedule](p, m)).peak_in_flight(stage)


def simulated_bubble_key(schedule: str, p: int, m: int, **costs: float) -> float:
    """idle / total of ``schedule`` in percent, simulated with ``Costs(**costs)``."""
    from dtlab.parallel.pipeline import SCHEDULES, Costs, simulate

    return 100 * simulate(SCHEDULES[schedule](p, m), Costs(**costs)).bubble_fraction_of_total


def p2p_bytes_ratio_key(p: int, m: int, v: int) -> float:
    """Bytes sent per step by interleaved 1F1B with ``v`` chunks, over plain 1F1B's."""
    from dtlab.parallel.pipeline import bytes_sent_per_rank, interleaved_1f1b, one_f_one_b

    return sum(bytes_sent_per_rank(interleaved_1f1b(p, m, v), 1)) / sum(
        bytes_sent_per_rank(one_f_one_b(p, m), 1)
    )
