"""The orders ``torch.distributed.pipelining`` generates, read without starting any process.

PyTorch builds a schedule's per-rank action lists (its "schedule IR") inside the schedule's
constructor, which needs real pipeline stages on real ranks. The list-making methods themselves
only read a few numbers (ranks, micro-batches, stages per rank), so here they are called on a
stand-in object holding just those. This reaches into PyTorch's private methods: it is for
comparing orders side by side (lab 05, tests) and fails with a clear message if a torch release
renames them. On real ranks, ``schedule.pipeline_order`` of a constructed torch schedule gives
the same lists.
"""

from __future__ import annotations

from types import SimpleNamespace

from dtlab.parallel.pipeline.actions import Schedule, loop_stage_ranks, v_stage_ranks

TORCH_SCHEDULES = (
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)


def torch_schedule(name: str, n_ranks: int, n_micro: int, n_virtual: int = 2) -> Schedule:
    """PyTorch's compute order for schedule ``name`` (one of :data:`TORCH_SCHEDULES`) on
    ``n_ranks`` ranks and ``n_micro`` micro-batches (``n_virtual`` stages per rank for the
    interleaved ones; the V schedules always have 2), as a dtlab :class:`Schedule`."""
    from torch.distributed.pipelining import schedules as torch_schedules

    if name not in TORCH_SCHEDULES:
        raise ValueError(f"unknown torch schedule {name!r}; choose one of {TORCH_SCHEDULES}")
    cls = getattr(torch_schedules, f"Schedule{name}")
    p, m = n_ranks, n_micro
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
        if name in ("GPipe", "1F1B"):
            order = cls._get_pipeline_order(me)
            stage_ranks = loop_stage_ranks(p)
        else:
            order = {r: cls._calculate_single_rank_operations(me, r) for r in range(p)}
            v = name in ("ZBVZeroBubble", "DualPipeV")
            stage_ranks = v_stage_ranks(p) if v else loop_stage_ranks(p, n_virtual)
    except AttributeError as error:
        raise RuntimeError(
            f"this torch's Schedule{name} no longer builds its order the way dtlab reads it "
            f"({error}); read schedule.pipeline_order from a constructed schedule instead"
        ) from error
    return Schedule.from_torch_strings(order, f"torch {name}", m, stage_ranks)
