"""A pipeline schedule as plain data: per rank, the ordered actions it runs.

An :class:`Action` is one thing a rank does for one (stage, micro-batch):

======  =========================================================================================
kind    what the rank does
======  =========================================================================================
F       forward of ``stage`` on ``micro_batch`` (the last stage also computes the loss)
B       full backward: the gradient of the stage's input *and* of its weights
I       backward for the input only ("B" in Qi et al. 2023): what the previous stage waits for
W       backward for the weights only: nobody waits for it, so it can fill a bubble
SEND_F  send the activation ``stage`` produced to ``stage + 1``'s rank
RECV_F  receive ``stage``'s input activation from ``stage - 1``'s rank
SEND_B  send the gradient of ``stage``'s input to ``stage - 1``'s rank
RECV_B  receive the gradient of ``stage``'s output from ``stage + 1``'s rank
======  =========================================================================================

It prints in PyTorch's action-string form (``torch.distributed.pipelining``): stage, kind,
micro-batch — ``"1F0"``, ``"0I3"``, ``"2SEND_F1"`` — so :meth:`Schedule.to_torch_strings` and
:meth:`Schedule.from_torch_strings` move a schedule between dtlab and torch unchanged.

A :class:`Schedule` is ``actions[rank]`` for every pipeline rank, the number of micro-batches, and
which rank holds each stage (``stage_ranks``): with ``v`` virtual stages per rank there are
``p·v`` stages, placed in a loop (stage ``s`` on rank ``s % p``: interleaved 1F1B) or in a V
(rank ``r`` holds stages ``r`` and ``2p-1-r``: ZB-V, DualPipeV). A schedule with only F/B/I/W
actions leaves the messages implicit; :func:`~dtlab.parallel.pipeline.communication.with_communication`
adds them in an order that cannot deadlock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

COMPUTE = ("F", "B", "I", "W")
COMMUNICATION = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
# torch's schedules also carry bookkeeping actions a CPU pipeline does not need: FSDP's
# unshard/reshard and the data-parallel gradient reduction after the last backward.
TORCH_BOOKKEEPING = ("UNSHARD", "RESHARD", "REDUCE_GRAD")

_ACTION = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)$")
_OVERLAP = re.compile(r"^\((.*)\)OVERLAP_F_B$")
_BOOKKEEPING = re.compile(rf"^\d*({'|'.join(TORCH_BOOKKEEPING)})\d*$")


class ScheduleError(ValueError):
    """A schedule that cannot run, naming the ``rank`` and the ``action`` where it goes wrong."""

    def __init__(self, message: str, rank: int | None = None, action: Action | None = None):
        super().__init__(message)
        self.rank, self.action = rank, action


@dataclass(frozen=True)
class Action:
    """One action of one rank: ``kind`` (see the module table) of ``stage`` on ``micro_batch``."""

    stage: int
    kind: str
    micro_batch: int

    def __post_init__(self) -> None:
        if self.kind not in COMPUTE + COMMUNICATION:
            raise ValueError(
                f"action kind {self.kind!r} is not one of {', '.join(COMPUTE + COMMUNICATION)}"
            )

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.micro_batch}"

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE

    @classmethod
    def parse(cls, text: str) -> Action:
        """``"1F0"`` → ``Action(1, "F", 0)`` (PyTorch's form: stage, kind, micro-batch)."""
        match = _ACTION.match(text.strip())
        if match is None:
            raise ValueError(
                f"{text!r} is not an action string: write stage, kind, micro-batch, e.g. '1F0', "
                f"'0I3' or '2SEND_F1' (kinds: {', '.join(COMPUTE + COMMUNICATION)})"
            )
        stage, kind, micro_batch = match.groups()
        return cls(int(stage), kind, int(micro_batch))


def F(stage: int, micro_batch: int) -> Action:
    """``F(1, 0)`` reads like the papers' figures: forward of stage 1, micro-batch 0."""
    return Action(stage, "F", micro_batch)


def B(stage: int, micro_batch: int) -> Action:
    return Action(stage, "B", micro_batch)


def I(stage: int, micro_batch: int) -> Action:  # noqa: E743 — the papers' name for it
    return Action(stage, "I", micro_batch)


def W(stage: int, micro_batch: int) -> Action:
    return Action(stage, "W", micro_batch)


def loop_stage_ranks(n_ranks: int, n_virtual: int = 1) -> tuple[int, ...]:
    """Stage ``s`` on rank ``s % p``: ``p·v`` stages looping ``v`` times over the ranks."""
    return tuple(s % n_ranks for s in range(n_ranks * n_virtual))


def v_stage_ranks(n_ranks: int) -> tuple[int, ...]:
    """Two stages per rank in a V: rank ``r`` holds stages ``r`` and ``2p-1-r``, so the first
    and the last stage (embedding and head) share rank 0 and the turn of the V stays on rank
    ``p-1`` (no message there)."""
    down = list(range(n_ranks))
    return tuple(down + down[::-1])


@dataclass(frozen=True)
class Schedule:
    """``actions[rank]``: what each pipeline rank runs, in order, for ``n_micro`` micro-batches
    over ``len(stage_ranks)`` stages (``stage_ranks[s]`` is the rank holding stage ``s``)."""

    name: str
    n_micro: int
    stage_ranks: tuple[int, ...]
    actions: tuple[tuple[Action, ...], ...]

    @property
    def n_ranks(self) -> int:
        return len(self.actions)

    @property
    def n_stages(self) -> int:
        return len(self.stage_ranks)

    def stages_of(self, rank: int) -> list[int]:
        """The stages ``rank`` holds, in stage order."""
        return [s for s, r in enumerate(self.stage_ranks) if r == rank]

    @cached_property
    def has_communication(self) -> bool:
        """Whether the sends and receives are written out (else they are implicit)."""
        return any(not a.is_compute for rank in self.actions for a in rank)

    def compute_only(self) -> Schedule:
        """The same schedule without its SEND/RECV actions."""
        kept = tuple(tuple(a for a in rank if a.is_compute) for rank in self.actions)
        return Schedule(self.name, self.n_micro, self.stage_ranks, kept)

    def to_torch_strings(self) -> dict[int, list[str]]:
        """``{rank: ["0F0", "0F1", ...]}``: PyTorch's action strings, one list per rank."""
        return {rank: [str(a) for a in actions] for rank, actions in enumerate(self.actions)}

    @classmethod
    def from_torch_strings(
        cls,
        orders: Mapping[int, Iterable[object]],
        name: str = "imported",
        n_micro: int | None = None,
        stage_ranks: Sequence[int] | None = None,
    ) -> Schedule:
        """A schedule from per-rank action strings, or torch's own ``pipeline_order`` (its
        ``_Action`` objects print as these strings). Empty slots (``None``: torch's bubbles) and
        bookkeeping actions (UNSHARD, RESHARD, REDUCE_GRAD) are dropped; torch's overlapped
        ``(1F3;0B2)OVERLAP_F_B`` becomes its two actions in order. ``n_micro`` and
        ``stage_ranks`` are read from the actions when not given."""
        per_rank: list[tuple[Action, ...]] = []
        for rank in range(len(orders)):
            if rank not in orders:
                raise ValueError(f"the orders name ranks {sorted(orders)}: rank {rank} is missing")
            parsed: list[Action] = []
            for item in orders[rank]:
                text = "" if item is None else str(item).strip()
                if not text or _BOOKKEEPING.match(text):
                    continue
                overlap = _OVERLAP.match(text)
                parts = overlap.group(1).split(";") if overlap else [text]
                parsed.extend(Action.parse(part) for part in parts)
            per_rank.append(tuple(parsed))
        if stage_ranks is None:
            held = {a.stage: rank for rank, acts in enumerate(per_rank) for a in acts}
            stage_ranks = tuple(held[s] for s in range(max(held) + 1))
        if n_micro is None:
            n_micro = 1 + max(a.micro_batch for acts in per_rank for a in acts)
        return cls(name, n_micro, tuple(stage_ranks), tuple(per_rank))

    def grid(self) -> str:
        """The schedule as text, one row per rank (compute actions only, as in the papers)."""
        rows = []
        for rank, actions in enumerate(self.actions):
            cells = " ".join(f"{str(a):>4}" for a in actions if a.is_compute)
            rows.append(f"rank {rank}: {cells}")
        return "\n".join(rows)

    def __str__(self) -> str:
        return f"{self.name} (p={self.n_ranks}, m={self.n_micro}, {self.n_stages} stages)\n" + (
            self.grid()
        )


def build(
    name: str, n_micro: int, stage_ranks: Sequence[int], per_rank: Sequence[Iterable[Action]]
) -> Schedule:
    """A :class:`Schedule` from per-rank lists (the generators' last line)."""
    return Schedule(name, n_micro, tuple(stage_ranks), tuple(tuple(a) for a in per_rank))
