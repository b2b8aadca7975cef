"""Zero-bubble schedules with more than one stage per rank: ZB-V and interleaved zero bubble.

Both split each backward into I (the input's gradient, which the previous stage waits for) and
W (the weights' gradient, which nobody waits for) and use the W's to fill the bubbles (Qi et al.
2023, "Zero Bubble Pipeline Parallelism"):

* **ZB-V** (Sec. 6 of the paper; ``torch.distributed.pipelining.ScheduleZBVZeroBubble``): two
  stages per rank in a V (rank ``r`` holds stages ``r`` and ``2p-1-r``, so the first and the last
  stage share rank 0). Rank ``r`` warms up with ``2(p-r)-1`` forwards of its down-going chunk,
  ``r`` pairs of forwards (up chunk, down chunk), ``p-r`` times F·I·W of the up chunk, then
  repeats F·I·W of the down chunk, F·I·W of the up chunk until every forward ran, and drains the
  remaining I's and W's. Each chunk is half a stage, so with equal per-chunk costs
  ``t_F = t_I = t_W = t`` every rank idles ``(p-1)·t`` — half of ZB-H1's ``(p-1)·2t`` on the
  same model (:func:`zero_bubble_idle`). That is the least any schedule on this placement can
  idle: rank ``p-1`` cannot start before ``p-1`` chunk forwards have run, and every rank has
  ``6m·t`` of work, so the step is at least ``(6m + p - 1)·t``. The authors' summary table
  lists ZB-V's bubble rate as 0 at equal costs, and torch's docstring calls it zero bubble;
  neither removes this fill, which the simulation counts. It holds at most ``2p`` chunk
  activations at once, ``p`` whole stages' worth: 1F1B's first-stage peak, on every rank. With
  unequal costs ZB-V's idle time has no closed form here: simulate it.
* **Interleaved zero bubble** (the paper's ZB-1P with ``v`` chunks per rank, torch's
  ``ScheduleInterleavedZeroBubble``): interleaved 1F1B's loop placement and rounds of
  micro-batches, the backward split into I and W, and rank ``r``'s W's running ``r`` steps late so
  the drain fills with them. ``v = 1`` is :func:`~dtlab.parallel.pipeline.zero_bubble.zb_h1`.
  Every rank idles ``(p-1)(t_F + t_I - t_W)`` (per-chunk costs, ``t_W <= t_F``): ZB-H1's formula
  with every cost ``v`` times smaller, and holds ``v·p`` chunk activations (``p`` stages' worth).

Both follow PyTorch's generators action for action (``tests/test_pp_zero_bubble_v.py`` compares
them with :func:`~dtlab.parallel.pipeline.torch_orders.torch_schedule` and runs torch's own
schedule validator on them), so a dtlab schedule and torch's can be swapped in a trace.
"""

from __future__ import annotations

from collections import defaultdict

from dtlab.parallel.pipeline.actions import (
    Action,
    Schedule,
    build,
    loop_stage_ranks,
    v_stage_ranks,
)


def zero_bubble_idle(
    p: int, forward: float, backward_input: float, backward_weight: float
) -> float:
    """Idle time per rank of ZB-H1 and interleaved zero bubble, ``(p-1)(t_F + t_I - t_W)``,
    with the costs of one chunk (Qi et al. 2023, Sec. 2.1); ZB-V's too when the three are
    equal. The drain's ``p-1`` slots each lose a forward and an input-backward and get a W
    back. ``tests/test_pp_zero_bubble_v.py`` holds it against :func:`~dtlab.parallel.pipeline.
    simulate.simulate`."""
    if backward_weight > forward:
        raise ValueError(
            f"the formula assumes a W no longer than an F (t_W={backward_weight} > "
            f"t_F={forward}); simulate the schedule instead"
        )
    return (p - 1) * (forward + backward_input - backward_weight)


def zbv(n_ranks: int, n_micro: int) -> Schedule:
    """ZB-V on ``p`` ranks (``2p`` stages in a V), ``m`` micro-batches (any ``m >= 1``; below
    ``2p-1`` the warm-up cannot fill and the bubble grows).

    The order is generated for ``max(m, 2p-1)`` micro-batches and the ones beyond ``m`` dropped,
    as torch does, so small ``m`` keeps the same shape with holes."""
    if n_ranks < 1 or n_micro < 1:
        raise ValueError(f"ZB-V needs p >= 1 and m >= 1, got p={n_ranks}, m={n_micro}")
    per_rank = [_zbv_rank(n_ranks, n_micro, r) for r in range(n_ranks)]
    return build("ZB-V", n_micro, v_stage_ranks(n_ranks), per_rank)


def _zbv_rank(p: int, m: int, r: int) -> list[Action]:
    down, up = r, 2 * p - 1 - r
    n = max(2 * p - 1, m)
    count: dict[tuple[int, str], int] = defaultdict(int)  # (stage, kind) -> next micro-batch
    actions: list[Action] = []

    def run(stage: int, *kinds: str) -> None:
        for kind in kinds:
            mb = count[(stage, kind)]
            count[(stage, kind)] += 1
            actions.append(Action(stage, kind, mb))

    for _ in range(2 * (p - r) - 1):  # warm-up: the down chunk fills the V
        run(down, "F")
    for _ in range(r):
        run(up, "F")
        run(down, "F")
    for _ in range(p - r):  # the turn: the up chunk's first backwards
        run(up, "F", "I", "W")
    while count[(up, "F")] < count[(down, "F")] or count[(down, "F")] < n:  # steady state
        if count[(down, "F")] < n:
            run(down, "F")
        run(down, "I", "W")
        run(up, "F", "I", "W")
    for _ in range(r):  # drain: input gradients first, weights later
        run(down, "I")
        run(up, "I")
    for _ in range(p - r):
        run(down, "I", "W")
    while count[(up, "W")] < count[(up, "I")]:
        run(up, "W")
    while count[(down, "W")] < count[(down, "I")]:
        run(down, "W")
    return [a for a in actions if a.micro_batch < m]


def interleaved_zero_bubble(n_ranks: int, n_micro: int, n_virtual: int = 2) -> Schedule:
    """Interleaved zero bubble (ZB-1P with ``v`` chunks per rank, stage ``s`` on rank ``s % p``).

    Micro-batches go in rounds of ``k = m // max(1, m // p)`` as in interleaved 1F1B; rank ``r``
    warms up with ``(v-1)·k + (p-1-r)`` forwards, then each step runs one F and one I (chunks in
    reverse for the backwards) and, from step ``r`` on, the W of the oldest I still waiting; the
    drain runs the remaining I's and W's."""
    if n_ranks < 1 or n_micro < 1 or n_virtual < 1:
        raise ValueError(
            f"interleaved zero bubble needs p, m, v >= 1, got p={n_ranks}, m={n_micro}, "
            f"v={n_virtual}"
        )
    rounds = max(1, n_micro // n_ranks)
    if n_micro % rounds:
        raise ValueError(
            f"interleaved zero bubble runs micro-batches in rounds of p={n_ranks}: m={n_micro} "
            f"is not a multiple of its {rounds} rounds; choose m <= {n_ranks} or a multiple of "
            f"{n_ranks}"
        )
    per_round = n_micro // rounds
    per_rank = [
        _interleaved_zb_rank(n_ranks, n_micro, n_virtual, per_round, r) for r in range(n_ranks)
    ]
    return build(
        f"interleaved ZB (v={n_virtual})",
        n_micro,
        loop_stage_ranks(n_ranks, n_virtual),
        per_rank,
    )


def _interleaved_zb_rank(p: int, m: int, v: int, per_round: int, r: int) -> list[Action]:
    total = m * v
    warmup = min((v - 1) * per_round + (p - 1 - r), total)
    count: dict[tuple[int, str], int] = defaultdict(int)
    actions: list[Action] = []

    def run(kind: str, stage: int) -> None:
        actions.append(Action(stage, kind, count[(stage, kind)]))
        count[(stage, kind)] += 1

    def forward_stage(step: int) -> int:
        return ((step // per_round) % v) * p + r

    def backward_stage(step: int) -> int:
        return (v - 1 - ((step - warmup) // per_round) % v) * p + r

    for step in range(warmup):
        run("F", forward_stage(step))
    backward_steps: list[int] = []
    weights_done = 0
    for step in range(warmup, total + warmup):
        if step < total:
            run("F", forward_stage(step))
        run("I", backward_stage(step))
        backward_steps.append(step)
        if step - warmup >= r:  # rank r's W's run r steps behind its I's
            run("W", backward_stage(backward_steps[weights_done]))
            weights_done += 1
    for step in backward_steps[weights_done:]:
        run("W", backward_stage(step))
    return actions
