"""The orders ``torch.distributed.pipelining`` runs, read without starting any process.

Two families of torch schedule, and where each keeps the order it executes:

* **single-stage** (``ScheduleGPipe``, ``Schedule1F1B``: one ``PipelineStage`` per rank) run
  their own hand-written loop in ``_step_microbatches``. Their ``pipeline_order`` attribute is a
  separate "schedule IR" built for drawing and checking, never read while running — and in torch
  2.13 it is wrong for 1F1B: ``Schedule1F1B._get_pipeline_order`` numbers the **last rank's**
  forwards ``1..m`` instead of ``0..m-1`` (``2F1 2B0 2F2 2B1 ... 2F5 2B4`` for p=3, m=5; it runs
  ``2F0 2B0 2F1 2B1 ... 2F4 2B4``). So :func:`torch_schedule` writes those two loops out below
  (:func:`_gpipe_loop`, :func:`_one_f_one_b_loop`) and returns what the ranks execute.
* **multi-stage** (``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``,
  ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``) *execute* their IR: the constructor builds
  ``pipeline_order`` with ``_calculate_single_rank_operations`` per rank, lowers it to
  ``pipeline_order_with_comms`` (the same compute actions with sends, receives and bookkeeping
  added) and ``_step_microbatches`` walks that list. Building one needs real stages on real
  ranks, but the list-making method only reads a few numbers (ranks, micro-batches, stages per
  rank), so it is called here on a stand-in holding just those. This reaches into a private
  method: it fails with a clear message if a torch release renames it.

``tests/test_pp_torch_orders.py`` runs torch's schedules on real gloo ranks and checks, for each,
that the forwards and backwards happen in exactly the order returned here.
"""

from __future__ import annotations

from types import SimpleNamespace

from dtlab.parallel.pipeline.actions import (
    Action,
    B,
    F,
    Schedule,
    build,
    loop_stage_ranks,
    v_stage_ranks,
)

TORCH_SCHEDULES = (
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)


def _gpipe_loop(rank: int, n_micro: int) -> list[Action]:
    """``ScheduleGPipe._step_microbatches``: every forward, then every backward, in order."""
    return [F(rank, mb) for mb in range(n_micro)] + [B(rank, mb) for mb in range(n_micro)]


def _one_f_one_b_loop(rank: int, n_ranks: int, n_micro: int) -> list[Action]:
    """``Schedule1F1B._step_microbatches`` on pipeline rank ``rank`` (= its stage):
    ``min(m, p - rank)`` warm-up forwards, then "1B1F" pairs — backward of the oldest
    micro-batch, forward of the next — until every forward ran, then the remaining backwards.
    (Megatron counts ``p-1-rank`` warm-up forwards and pairs "1F1B"; the order is the same.)"""
    warmup = min(n_micro, n_ranks - rank)
    actions = [F(rank, mb) for mb in range(warmup)]
    for mb in range(n_micro):
        actions.append(B(rank, mb))
        if warmup + mb < n_micro:
            actions.append(F(rank, warmup + mb))
    return actions


def torch_schedule(name: str, n_ranks: int, n_micro: int, n_virtual: int = 2) -> Schedule:
    """The compute order torch's ``Schedule{name}`` (``name`` one of :data:`TORCH_SCHEDULES`)
    **executes** on ``n_ranks`` ranks and ``n_micro`` micro-batches (``n_virtual`` stages per rank
    for the interleaved ones; the V schedules always have 2), as a dtlab :class:`Schedule`.

    For GPipe and 1F1B this is their ``_step_microbatches`` loop, not their ``pipeline_order``
    IR, which for 1F1B is off by one on the last rank (see the module docstring); for the
    multi-stage schedules it is their ``pipeline_order`` without torch's empty slots and
    bookkeeping actions (overlapped F&B pairs split, forward first, as torch runs them)."""
    from torch.distributed.pipelining import schedules as torch_schedules

    if name not in TORCH_SCHEDULES:
        raise ValueError(f"unknown torch schedule {name!r}; choose one of {TORCH_SCHEDULES}")
    p, m = n_ranks, n_micro
    if name == "GPipe":
        return build("torch GPipe", m, loop_stage_ranks(p), [_gpipe_loop(r, m) for r in range(p)])
    if name == "1F1B":
        if m < p:
            raise ValueError(
                f"torch's Schedule1F1B refuses m={m} micro-batches on p={p} stages (it needs "
                f"m >= p); choose n_micro >= {p}"
            )
        per_rank = [_one_f_one_b_loop(r, p, m) for r in range(p)]
        return build("torch 1F1B", m, loop_stage_ranks(p), per_rank)
    cls = getattr(torch_schedules, f"Schedule{name}", None)
    if cls is None:
        raise RuntimeError(f"this torch has no Schedule{name}; compare with another schedule")
    rounds = max(1, m // p)
    me = SimpleNamespace(
        _num_stages=p,
        _n_microbatches=m,
        pp_group_size=p,
        n_local_stages=n_virtual,
        number_of_rounds=rounds,
        microbatches_per_round=m // rounds,
        num_stages=2 * p,
    )
    try:
        order = {r: cls._calculate_single_rank_operations(me, r) for r in range(p)}
    except AttributeError as error:
        raise RuntimeError(
            f"this torch's Schedule{name} no longer builds its order the way dtlab reads it "
            f"({error}); read schedule.pipeline_order from a constructed schedule instead"
        ) from error
    v = name in ("ZBVZeroBubble", "DualPipeV")
    stage_ranks = v_stage_ranks(p) if v else loop_stage_ranks(p, n_virtual)
    return Schedule.from_torch_strings(order, f"torch {name}", m, stage_ranks)


def torch_validate(schedule: Schedule) -> dict[int, int] | None:
    """Run torch's own schedule checker (``schedules._validate_schedule``: every stage has ``m``
    forwards, F before I/B, I before W, each stage on one rank) on ``schedule``'s compute actions.

    Returns torch's ``{stage: rank}`` map, raises torch's ``AssertionError`` (its message prints
    the whole schedule) if it refuses the schedule, and returns ``None`` when this torch has no
    such checker — it is private, so a release may drop it; :func:`~dtlab.parallel.pipeline.
    validate.validate` checks all of it and the cross-rank order besides."""
    from torch.distributed.pipelining import schedules as torch_schedules

    check = getattr(torch_schedules, "_validate_schedule", None)
    action = getattr(torch_schedules, "_Action", None)
    if check is None or action is None or not hasattr(action, "from_str"):
        return None
    compute = schedule.compute_only()
    orders = {
        rank: [action.from_str(str(a)) for a in actions]
        for rank, actions in enumerate(compute.actions)
    }
    return check(orders, schedule.n_ranks, schedule.n_stages, schedule.n_micro)
