"""What lab 04's tensor-parallel graders check besides the numbers: the skill.

The column- and row-parallel Linear (:mod:`.tensor_parallel`), the vocabulary-parallel loss
(:mod:`.tensor_parallel_loss`) and lab 12's overlapped column-parallel backward
(:mod:`.overlap_tp`) all refuse the same library answers (``ColumnParallelLinear``,
``copy_to_group``, ``vocab_parallel_cross_entropy``, …, and torch's functional collectives, which
the watcher cannot count) and price what a pass sent by the same ring convention
(``2(t-1)/t · M`` per all-reduce of ``M`` bytes, plus any point-to-point bytes). It stands alone
so that the three graders share one copy of those checks, below all of them; the exercise
contracts stay in :mod:`.tensor_parallel`, which re-exports these names.
"""

from __future__ import annotations

from collections.abc import Callable

from dtlab.quiz.exercises import NotTheSkill


def _library_answers() -> dict[Callable, str]:
    """The library's own TP layers and operators, and torch's uncounted collectives, by name."""
    import torch.distributed._functional_collectives as functional

    from dtlab.comm import autograd as comm_autograd
    from dtlab.parallel.tensor import cross_entropy, layers, parallelize

    answers = {
        comm_autograd.copy_to_group: "dtlab.comm.copy_to_group",
        comm_autograd.reduce_from_group: "dtlab.comm.reduce_from_group",
        comm_autograd.gather_along: "dtlab.comm.gather_along",
        comm_autograd.reduce_scatter_along: "dtlab.comm.reduce_scatter_along",
        comm_autograd._CopyToGroup.forward: "dtlab.comm.copy_to_group",
        comm_autograd._ReduceFromGroup.forward: "dtlab.comm.reduce_from_group",
        layers.ColumnParallelLinear.forward: "dtlab.parallel.tensor.ColumnParallelLinear",
        layers.RowParallelLinear.forward: "dtlab.parallel.tensor.RowParallelLinear",
        layers.enter_region: "dtlab.parallel.tensor.enter_region",
        layers.leave_region: "dtlab.parallel.tensor.leave_region",
        cross_entropy.vocab_parallel_cross_entropy: "dtlab.parallel.tensor.vocab_parallel_cross_entropy",
        cross_entropy._VocabParallelCrossEntropy.forward: "dtlab.parallel.tensor.vocab_parallel_cross_entropy",
        parallelize.TensorParallel.loss: "dtlab.parallel.tensor.TensorParallel.loss",
    }
    for name in ("all_reduce", "all_gather_tensor", "reduce_scatter_tensor"):
        if hasattr(functional, name):
            answers[getattr(functional, name)] = f"torch.distributed._functional_collectives.{name}"
    return answers


def _sent(summary: dict, world: int) -> float:
    """Bytes this rank sent: ring convention for collectives, plus any point-to-point bytes."""
    ring = sum(2 * (world - 1) / world * nbytes for _, _, nbytes, _ in summary["collectives"])
    return ring + summary["p2p_bytes_sent"]


def _calls(summary: dict) -> str:
    found = [f"{name} of {nbytes:,} B" for name, _, nbytes, _ in summary["collectives"]]
    return ", ".join(found) or "no collective"


def _gap(got, want) -> float:
    """Largest |got − want|, or infinity when ``got`` is missing or the wrong shape."""
    import torch

    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return float("inf")
    return (got.detach().double() - want.double()).abs().max().item()


def _refuse_library(used: list[str], what: str) -> None:
    if used:
        raise NotTheSkill(
            f"your code calls {used[0]} — the library's own answer. Write {what} yourself from "
            "torch operations and dist.all_reduce(tensor, group=group)"
        )


def _check_pass(r: dict, rank: int, world: int, which: str, want_payload: int, why: str) -> float:
    """The pass moved exactly one all-reduce of ``want_payload`` bytes (or none when 0)."""
    summary = r[which]
    sent, want = _sent(summary, world), 2 * (world - 1) / world * want_payload
    payloads = [nbytes for _, _, nbytes, _ in summary["collectives"]]
    if sent != want or payloads != ([want_payload] if want_payload else []):
        raise NotTheSkill(
            f"rank {rank}'s {which} pass ran {_calls(summary)}, sending {sent:,.0f} B; {why} "
            f"— exactly {want:,.0f} B per rank"
        )
    return sent
