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

1F1B's heart — in the steady state, send the forward's activation and receive an older
micro-batch's gradient as one exchange — is written out in :func:`one_f_one_b`
(``messages=True``), beside the replay that proves it deadlock-free.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

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


def one_f_one_b(n_ranks: int, n_micro: int, *, messages: bool = False) -> Schedule:
    """1F1B (PipeDream-Flush; Narayanan et al. 2021): rank ``r`` runs ``w = p-1-r`` warm-up
    forwards, then alternates one forward and one backward, then drains the remaining backwards.

    The bubble is GPipe's, but a rank starts a backward as soon as one is due, so it never holds
    more than ``p-r`` micro-batches' activations (``p`` on stage 0, against GPipe's ``m``).

    Each rank's list is written in its three phases, with the messages that join them
    (``messages=True`` writes those out; without, the executor derives an order of its own with
    :func:`~dtlab.parallel.pipeline.communication.with_communication`)::

        warm-up    w times      recv activation · F · send activation
        steady     m - w times  F · send activation / recv gradient · B · send gradient / recv activation
        cool-down  w times      recv gradient · B · send gradient

    The steady state is the heart of 1F1B: every forward's activation goes up while the gradient
    of the micro-batch ``w`` older comes down, as one exchange with the next rank
    (:func:`send_forward_recv_backward`; Megatron-LM's function of the same name), and every
    backward's gradient goes down while the next micro-batch's activation comes up
    (:func:`send_backward_recv_forward`). The two ends of an exchange are the two halves of one
    pair, written in the same order on both ranks — activation first, then gradient — so blocking
    send/recv meet without deadlock; :func:`~dtlab.parallel.pipeline.validate.validate` replays
    every rank's list and proves it (``tests/test_pp_one_f_one_b_steady_state.py``).
    """
    _check(n_ranks, n_micro, "1F1B")
    p, m = n_ranks, n_micro
    per_rank = []
    for r in range(p):
        say = _Messages(r, p, written=messages)
        warmup = min(p - 1 - r, m)
        actions = []
        for i in range(warmup):
            actions += [*say.recv_forward(i), F(r, i), *say.send_forward(i)]
        for i in range(m - warmup):  # steady state: forward i + warmup, backward i
            forward, backward = i + warmup, i
            if i == 0:
                actions += say.recv_forward(forward)
            actions += [F(r, forward), *say.send_forward_recv_backward(forward, backward)]
            following = forward + 1 if forward + 1 < m else None
            actions += [B(r, backward), *say.send_backward_recv_forward(backward, following)]
        for i in range(m - warmup, m):
            actions += [*say.recv_backward(i), B(r, i), *say.send_backward(i)]
        per_rank.append(actions)
    return build("1F1B", n_micro, loop_stage_ranks(n_ranks), per_rank)


@dataclass(frozen=True)
class _Messages:
    """The point-to-point messages of stage ``r`` (one stage per rank) with its neighbours, in
    :func:`one_f_one_b`'s order; each is empty at a pipeline end, or when not ``written``."""

    r: int
    p: int
    written: bool

    def _to_next(self, *actions: Action) -> list[Action]:
        return list(actions) if self.written and self.r < self.p - 1 else []

    def _to_previous(self, *actions: Action) -> list[Action]:
        return list(actions) if self.written and self.r > 0 else []

    def recv_forward(self, mb: int) -> list[Action]:
        return self._to_previous(Action(self.r, "RECV_F", mb))

    def send_forward(self, mb: int) -> list[Action]:
        return self._to_next(Action(self.r, "SEND_F", mb))

    def recv_backward(self, mb: int) -> list[Action]:
        return self._to_next(Action(self.r, "RECV_B", mb))

    def send_backward(self, mb: int) -> list[Action]:
        return self._to_previous(Action(self.r, "SEND_B", mb))

    def send_forward_recv_backward(self, forward: int, backward: int) -> list[Action]:
        """One exchange with the next rank: this forward's activation up, then the gradient for
        the backward due now down. The next rank runs the same pair from its side,
        :meth:`send_backward_recv_forward`: it receives that activation, then sends that gradient."""
        return self._to_next(Action(self.r, "SEND_F", forward), Action(self.r, "RECV_B", backward))

    def send_backward_recv_forward(self, backward: int, forward: int | None) -> list[Action]:
        """One exchange with the previous rank: the next forward's activation up (none after the
        last), then this backward's gradient down — activation first, as on the other end."""
        up = [] if forward is None else [Action(self.r, "RECV_F", forward)]
        return self._to_previous(*up, Action(self.r, "SEND_B", backward))


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
