"""Schedules that split the backward in two: ZB-H1 and DualPipeV.

Splitting a stage's backward into I (gradient of its *input*, which the previous stage waits
for) and W (gradient of its *weights*, which nobody waits for) lets W fill the bubbles that
1F1B leaves (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"). With costs ``t_F``, ``t_I``,
``t_W`` per stage:

* **ZB-H1** keeps 1F1B's memory (at most ``p`` micro-batches in flight on stage 0) and postpones
  W's into the drain, shrinking the bubble from 1F1B's ``(p-1)(t_F+t_I+t_W)`` to
  ``(p-1)(t_F+t_I-t_W)`` per rank — a third of it when the three costs are equal.
* **DualPipeV** (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", Sec. 3.2.1; the "cut in half"
  V-shaped variant of DualPipe) gives each rank two stages in a V (rank ``r`` holds ``r`` and
  ``2p-1-r``), feeds micro-batches in from both ends of the V, and pairs one chunk's forward with
  the other chunk's backward in the steady state (``OVERLAP_F_B``). DeepSeek overlaps the two so
  one's expert all-to-all hides behind the other's compute; this dense CPU pipeline has no such
  communication, so the pair runs one after the other (F, then B) and only the order matters.
  The full DualPipe (two model copies, micro-batches entering from both ends at once) is not
  built here: DualPipeV has the same schedule shape on half the parameter memory, and it is the
  variant ``torch.distributed.pipelining`` ships (``ScheduleDualPipeV``), so the two can be
  compared action for action.

Both follow PyTorch's generators (``ScheduleInterleavedZeroBubble`` with one stage per rank, and
``ScheduleDualPipeV``, itself a port of github.com/deepseek-ai/DualPipe), so the orders agree.
"""

from __future__ import annotations

from collections import defaultdict, deque

from dtlab.parallel.pipeline.actions import (
    Action,
    F,
    I,
    Schedule,
    W,
    build,
    loop_stage_ranks,
    v_stage_ranks,
)


def zb_h1(n_ranks: int, n_micro: int) -> Schedule:
    """ZB-H1 (Qi et al. 2023, Sec. 2.1): 1F1B's warm-up (``p-1-r`` forwards on rank ``r``), then
    each steady step runs F and I; rank ``r`` starts running W's ``r`` steps late — oldest first —
    so the ranks nearest the end keep their W's for the drain, where 1F1B sat idle."""
    if n_ranks < 1 or n_micro < 1:
        raise ValueError(f"ZB-H1 needs p >= 1 and m >= 1, got p={n_ranks}, m={n_micro}")
    per_rank = []
    for r in range(n_ranks):
        warmup = min(n_ranks - 1 - r, n_micro)
        actions = [F(r, i) for i in range(warmup)]
        waiting_w: deque[int] = deque()
        for step in range(warmup, n_micro + warmup):
            if step < n_micro:
                actions.append(F(r, step))
            actions.append(I(r, step - warmup))  # backwards go in micro-batch order
            waiting_w.append(step - warmup)
            if step - warmup >= r:
                actions.append(W(r, waiting_w.popleft()))
        actions += [W(r, i) for i in waiting_w]
        per_rank.append(actions)
    return build("ZB-H1", n_micro, loop_stage_ranks(n_ranks), per_rank)


def dualpipe_v(n_ranks: int, n_micro: int) -> Schedule:
    """DualPipeV on ``p`` ranks (``2p`` stages in a V); needs ``m >= 2p`` micro-batches.

    Rank ``r`` with chunks ``c0 = r`` (going down the V) and ``c1 = 2p-1-r`` (coming back):

    1. ``2(p-1-r)`` forwards of ``c0``;  2. ``r+1`` pairs F ``c0``, F ``c1``;
    3. ``p-1-r`` times I ``c1``, W, F ``c1`` (zero-bubble warm-up);
    4. the main phase: ``m-2p+r+1`` times (F ``c0`` + B ``c1``), (F ``c1`` + B ``c0``) — the
       overlapped pairs; 5. ``p-1-r`` times B ``c1``, (F ``c1`` + B ``c0``);
    6. ``r+1`` pairs of backwards ``c1``, ``c0`` (switching to I half-way);
    7. ``p-1-r`` times W, then a backward of ``c0``;  8. the remaining W's.
    """
    if n_ranks < 1:
        raise ValueError(f"DualPipeV needs p >= 1 ranks, got p={n_ranks}")
    if n_micro < 2 * n_ranks:
        raise ValueError(
            f"DualPipeV needs at least 2·p = {2 * n_ranks} micro-batches (one per stage of the "
            f"V), got m={n_micro}; choose m >= {2 * n_ranks}"
        )
    per_rank = [_dualpipe_v_rank(n_ranks, n_micro, r) for r in range(n_ranks)]
    return build("DualPipeV", n_micro, v_stage_ranks(n_ranks), per_rank)


def _dualpipe_v_rank(p: int, m: int, r: int) -> list[Action]:
    c0, c1 = r, 2 * p - 1 - r
    actions: list[Action] = []
    next_mb: dict[tuple[int, str], int] = defaultdict(int)  # (stage, "F" or "I") -> micro-batch
    waiting_w: deque[tuple[int, int]] = deque()

    def run(stage: int, kind: str) -> None:
        """Append ``kind`` of ``stage`` for its next micro-batch (B and I share a counter)."""
        key = (stage, "F" if kind == "F" else "I")
        mb = next_mb[key]
        next_mb[key] += 1
        actions.append(Action(stage, kind, mb))
        if kind == "I":
            waiting_w.append((stage, mb))

    def weight() -> None:
        if waiting_w:
            actions.append(W(*waiting_w.popleft()))

    def overlapped(forward_stage: int, backward_stage: int) -> None:
        run(forward_stage, "F")  # DeepSeek runs these two at once; here, one after the other
        run(backward_stage, "B")

    for _ in range(2 * (p - 1 - r)):  # 1
        run(c0, "F")
    for _ in range(r + 1):  # 2
        run(c0, "F")
        run(c1, "F")
    for _ in range(p - 1 - r):  # 3
        run(c1, "I")
        weight()
        run(c1, "F")
    for i in range(m - 2 * p + r + 1):  # 4
        if i == 0 and r == p - 1:  # the turn of the V: not overlapped, to shrink the bubble
            run(c0, "F")
            run(c1, "B")
        else:
            overlapped(c0, c1)
        overlapped(c1, c0)
    for _ in range(p - 1 - r):  # 5
        run(c1, "B")
        overlapped(c1, c0)
    split = False  # 6: the second half of the backwards leave their W for later
    for i in range(r + 1):
        if i == (r + 1) // 2 and r % 2 == 1:
            split = True
        run(c1, "I" if split else "B")
        if i == (r + 1) // 2 and r % 2 == 0:
            split = True
        run(c0, "I" if split else "B")
    for _ in range(p - 1 - r):  # 7
        weight()
        run(c0, "I" if split else "B")
    while waiting_w:  # 8
        weight()
    return actions
