"""The classic synchronous schedules as generators: GPipe, 1F1B and interleaved 1F1B.

Each returns a :class:`~dtlab.parallel.pipeline.actions.Schedule` — per rank, the order of its
forwards and backwards — for ``p`` ranks and ``m`` micro-batches. With equal stage costs
(``t_F`` forward, ``t_B`` backward) all three leave each rank idle for ``(p-1)`` fill and drain
slots (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", Sec. 2.2; formulas in :mod:`dtlab.cost.bubble`):

====================  ===============================  =========================================
schedule              bubble, idle / ideal              micro-batches' activations rank 0 holds
====================  ===============================  =========================================
GPipe                 ``(p-1) / m``                     ``m`` at its peak (all forwards first)
1F1B                  ``(p-1) / m``                     ``p`` (one backward per new forward)
interleaved, v        ``(p-1) / (v·m)``                 a little more than ``p``, in ``v`` chunks
====================  ===============================  =========================================

(``idle / total`` is ``(p-1) / (m+p-1)`` for the first two.) Interleaving pays for its smaller
bubble with ``v``× as many messages: every micro-batch crosses every rank ``v`` times.
"""

from __future__ import annotations

from collections import defaultdict

from dtlab.parallel.pipeline.actions import Action, B, F, Schedule, build, loop_stage_ranks


def _check(n_ranks: int, n_micro: int, name: str) -> None:
    if n_ranks < 1 or n_micro < 1:
        raise ValueError(
            f"{name} needs p >= 1 ranks and m >= 1 micro-batches, got p={n_ranks}, m={n_micro}"
        )


def gpipe(n_ranks: int, n_micro: int) -> Schedule:
    """GPipe (Huang et al. 2019): every forward, then every backward (in micro-batch order, as
    ``torch.distributed.pipelining.ScheduleGPipe``). Stage 0 holds all ``m`` micro-batches'
    activations when its first backward starts."""
    _check(n_ranks, n_micro, "GPipe")
    per_rank = [
        [F(r, i) for i in range(n_micro)] + [B(r, i) for i in range(n_micro)]
        for r in range(n_ranks)
    ]
    return build("GPipe", n_micro, loop_stage_ranks(n_ranks), per_rank)


def one_f_one_b(n_ranks: int, n_micro: int) -> Schedule:
    """1F1B (PipeDream-Flush; Narayanan et al. 2021): rank ``r`` runs ``p-1-r`` warm-up forwards,
    then alternates one forward and one backward, then drains the remaining backwards.

    The bubble is GPipe's, but a rank starts a backward as soon as one is due, so it never holds
    more than ``p-r`` micro-batches' activations (``p`` on stage 0, against GPipe's ``m``).
    """
    _check(n_ranks, n_micro, "1F1B")
    per_rank = []
    for r in range(n_ranks):
        warmup = min(n_ranks - 1 - r, n_micro)
        actions = [F(r, i) for i in range(warmup)]
        for i in range(n_micro - warmup):  # steady state: forward i+warmup, backward i
            actions += [F(r, i + warmup), B(r, i)]
        actions += [B(r, i) for i in range(n_micro - warmup, n_micro)]
        per_rank.append(actions)
    return build("1F1B", n_micro, loop_stage_ranks(n_ranks), per_rank)


def interleaved_1f1b(n_ranks: int, n_micro: int, n_virtual: int = 2) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2): each rank holds ``v`` model chunks
    (stage ``s`` on rank ``s % p``), so a micro-batch loops ``v`` times around the ranks and each
    fill/drain slot costs a ``1/v`` chunk: the bubble shrinks to ``(p-1) / (v·m)`` of ideal.

    Order (depth first, as Megatron-LM and ``ScheduleInterleaved1F1B``): micro-batches go in
    rounds of ``k = m // max(1, m // p)``; a rank's ``j``-th forward runs chunk
    ``(j // k) % v``. Rank ``r`` warms up with ``(v-1)·k + 2(p-1-r)`` forwards, then alternates
    forward and backward (backwards visit the chunks in reverse), then drains. Megatron needs
    ``m`` to be a multiple of ``p``; this flexible form (PyTorch's) needs ``m`` to be a
    multiple of the number of rounds ``max(1, m // p)``.
    """
    _check(n_ranks, n_micro, "interleaved 1F1B")
    if n_virtual < 1:
        raise ValueError(f"interleaved 1F1B needs v >= 1 chunks per rank, got v={n_virtual}")
    rounds = max(1, n_micro // n_ranks)
    if n_micro % rounds:
        choices = [m for m in range(n_ranks, 4 * n_ranks + 1) if m % max(1, m // n_ranks) == 0]
        raise ValueError(
            f"interleaved 1F1B runs micro-batches in rounds of p={n_ranks}: m={n_micro} is not a "
            f"multiple of its {rounds} rounds; choose m < {n_ranks} or one of {choices[:8]}…"
        )
    per_round = n_micro // rounds
    per_rank = [
        _interleaved_rank(n_ranks, n_micro, n_virtual, per_round, r) for r in range(n_ranks)
    ]
    return build(
        f"interleaved 1F1B (v={n_virtual})",
        n_micro,
        loop_stage_ranks(n_ranks, n_virtual),
        per_rank,
    )


def _interleaved_rank(p: int, m: int, v: int, per_round: int, r: int) -> list[Action]:
    total = m * v  # forwards (and backwards) on this rank
    warmup = min((v - 1) * per_round + 2 * (p - 1 - r), total)
    next_mb: dict[tuple[str, int], int] = defaultdict(int)

    def run(kind: str, chunk: int) -> Action:
        stage = chunk * p + r
        next_mb[(kind, stage)] += 1
        return Action(stage, kind, next_mb[(kind, stage)] - 1)

    def forward(step: int) -> Action:  # chunks 0, 1, ..., v-1, one round of micro-batches each
        return run("F", (step // per_round) % v)

    def backward(step: int) -> Action:  # the same rounds, chunks in reverse
        return run("B", v - 1 - ((step - warmup) // per_round) % v)

    actions = [forward(step) for step in range(warmup)]
    for step in range(warmup, total):
        actions += [forward(step), backward(step)]
    actions += [backward(step) for step in range(total, total + warmup)]
    return actions
