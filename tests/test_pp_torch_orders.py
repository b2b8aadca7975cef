"""``torch_schedule`` returns the order torch's schedules execute, measured on real ranks.

Each rank builds torch's schedule over tiny ``nn.Linear`` stages and runs one ``step``; every
call torch makes into a stage to compute a micro-batch — ``forward_one_chunk`` (F),
``backward_one_chunk`` (B, or I when ``full_backward=False``) and ``backward_weight_one_chunk``
(W) — is recorded as an action string. The recorded list of every rank must equal
:func:`dtlab.parallel.pipeline.torch_schedule`'s, action for action: for the single-stage
schedules that is their ``_step_microbatches`` loop, which is not their ``pipeline_order`` IR
(off by one on 1F1B's last rank in torch 2.13; the last test pins that claim down).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dtlab.parallel.pipeline import (
    Schedule,
    ScheduleError,
    one_f_one_b,
    torch_schedule,
    validate,
)

CASES = {  # p -> [(torch schedule, m, n_virtual)]
    2: [
        ("GPipe", 3, 1),
        ("1F1B", 2, 1),
        ("1F1B", 5, 1),
        ("Interleaved1F1B", 4, 2),
        ("InterleavedZeroBubble", 4, 1),
        ("InterleavedZeroBubble", 4, 2),
        ("ZBVZeroBubble", 4, 2),
        ("DualPipeV", 4, 2),
    ],
    4: [
        ("GPipe", 4, 1),
        ("1F1B", 4, 1),
        ("1F1B", 6, 1),
        ("Interleaved1F1B", 8, 2),
        ("InterleavedZeroBubble", 8, 1),
        ("ZBVZeroBubble", 8, 2),
        ("DualPipeV", 8, 2),
    ],
}
STAGE_CALLS = {  # the stage method torch calls -> how the call is written as an action
    "forward_one_chunk": lambda kw: "F",
    "backward_one_chunk": lambda kw: "B" if kw.get("full_backward", True) else "I",
    "backward_weight_one_chunk": lambda kw: "W",
}


def _record(stage, log: list[str]) -> None:
    """Wrap ``stage``'s compute entry points so each call appends ``"{stage}{kind}{mb}"``."""
    for method, kind_of in STAGE_CALLS.items():
        original = getattr(stage, method)

        def recorded(mb, *args, _original=original, _kind_of=kind_of, **kwargs):
            log.append(f"{stage.stage_index}{_kind_of(kwargs)}{mb}")
            return _original(mb, *args, **kwargs)

        setattr(stage, method, recorded)


def _run_torchs_schedules(p: int, cases: list[tuple[str, int, int]]) -> list[list[str]]:
    """On one rank: one step of each torch schedule; the compute calls in the order they ran."""
    import torch.distributed.pipelining as pipelining

    from dtlab.mesh import Mesh

    mesh = Mesh(pp=p)
    ran = []
    for name, m, n_virtual in cases:
        order = torch_schedule(name, p, m, n_virtual=n_virtual)
        torch.manual_seed(0)
        modules = [torch.nn.Linear(4, 4, dtype=torch.float64) for _ in range(order.n_stages)]
        log: list[str] = []
        stages = []
        for s in order.stages_of(mesh.pp_rank):
            stage = pipelining.PipelineStage(
                modules[s], s, order.n_stages, torch.device("cpu"), group=mesh.pp_group
            )
            _record(stage, log)
            stages.append(stage)
        single = name in ("GPipe", "1F1B")
        schedule = getattr(pipelining, f"Schedule{name}")(
            stages[0] if single else stages,
            n_microbatches=m,
            loss_fn=lambda y, target: ((y - target) ** 2).mean(),
        )
        batch = torch.ones(m, 4, dtype=torch.float64)
        args = (batch,) if 0 in order.stages_of(mesh.pp_rank) else ()
        last = order.n_stages - 1 in order.stages_of(mesh.pp_rank)
        schedule.step(*args, **({"target": torch.zeros_like(batch)} if last else {}))
        ran.append(log)
    return ran


@pytest.mark.parametrize("p", [2, 4])
def test_torch_schedule_is_the_order_torchs_ranks_execute(p, request):
    cluster = request.getfixturevalue(f"cluster{p}")
    per_rank = cluster.run(_run_torchs_schedules, p, CASES[p])
    for i, (name, m, n_virtual) in enumerate(CASES[p]):
        ours = torch_schedule(name, p, m, n_virtual=n_virtual).to_torch_strings()
        for rank in range(p):
            assert per_rank[rank][i] == ours[rank], (name, m, rank)


@pytest.mark.parametrize("p, m", [(p, m) for p in (1, 2, 3, 4) for m in (p, p + 1, 2 * p, 3 * p)])
def test_torchs_executed_1f1b_is_megatrons_1f1b(p, m):
    """torch's "warm up ``p-rank``, then 1B1F" loop and Megatron's "warm up ``p-1-rank``, then
    1F1B" are one order."""
    assert torch_schedule("1F1B", p, m).actions == one_f_one_b(p, m).actions


def test_torch_1f1b_refuses_fewer_micro_batches_than_stages_as_torch_does():
    with pytest.raises(ValueError, match="choose n_micro >= 4"):
        torch_schedule("1F1B", 4, 3)


def test_the_docstring_is_right_about_torchs_1f1b_ir_being_off_by_one_on_the_last_rank():
    """``Schedule1F1B.pipeline_order`` (torch's IR, for drawing) is not what its ranks run: in
    torch 2.13 the last rank's forwards are numbered 1..m. If a torch release fixes or drops the
    IR, the claim in :mod:`dtlab.parallel.pipeline.torch_orders` no longer applies to it."""
    from torch.distributed.pipelining import schedules

    build_ir = getattr(schedules.Schedule1F1B, "_get_pipeline_order", None)
    if build_ir is None:
        pytest.skip("this torch's Schedule1F1B builds no pipeline_order IR")
    ir_orders = build_ir(SimpleNamespace(_num_stages=3, _n_microbatches=5))
    ir = Schedule.from_torch_strings(ir_orders, "torch 1F1B IR", n_micro=5)
    executed = torch_schedule("1F1B", 3, 5).to_torch_strings()
    assert executed[2] == ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3", "2F4", "2B4"]
    if torch.__version__.startswith("2.13"):
        assert ir.to_torch_strings()[2] == [
            "2F1", "2B0", "2F2", "2B1", "2F3", "2B2", "2F4", "2B3", "2F5", "2B4",
        ]  # fmt: skip
        with pytest.raises(ScheduleError, match="rank 2 runs 2F5, but micro-batches"):
            validate(ir)  # the validator names the action that cannot run
    for rank in (0, 1):  # the other ranks' IR is the executed order
        assert ir.to_torch_strings()[rank] == executed[rank]
