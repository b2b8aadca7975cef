"""Micro-batch size against GEMM efficiency: which ``b`` gives the shortest pipeline step.

For a fixed global batch ``B`` per pipeline, a smaller micro-batch ``b`` means more micro-batches
``m = B/b`` and a smaller bubble — but each matmul gets thinner, and a thin GEMM runs below the
device's peak (its time stops shrinking in proportion to ``b``). With ``t(b)`` one stage's
forward + backward on one micro-batch:

* 1F1B (and GPipe):  step ``(m + p - 1)·t(b)`` (Narayanan et al. 2021, Sec. 3.4 on the
  micro-batch size, there written ``(b'/b + p - 1)·(t_f(b) + t_b(b))``);
* interleaved, ``v`` chunks per rank: each fill/drain slot is a ``1/v`` chunk, so step
  ``(m + (p - 1)/v)·t(b)``.

If ``t`` were linear in ``b`` (``t(b) = b·t(1)``), the step ``(B + (p-1)·b)·t(1)`` would always
favour ``b = 1``; the measured ``t(b)`` is not linear — a thin GEMM wastes the device — so the best
``b`` is where the bubble saved stops paying for the efficiency lost. Interleaving shrinks the
bubble term ``v``-fold, so for any ``t(b)`` that grows with ``b`` it can only keep the best
``b`` or move it up (toward efficient GEMMs), never down.

:func:`gemm_times` **measures** ``t(b)`` on this machine — the six GEMMs of one MLP block's
forward and backward (``x·W1``, ``h·W2`` and, for each, the input and the weight gradient), timed
on the clock (every size warmed up first, then timed round-robin ``repeats`` times and the
fastest kept: the run least disturbed by other processes on shared cores; CUDA synchronised) — and :func:`pipeline_steps` turns it
into step times per ``b``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class GemmTime:
    """One micro-batch size's measured MLP-block forward + backward: ``seconds``, and the FLOP/s
    it reached (``12·b·S·d·4d`` FLOP: six GEMMs of ``2·b·S·d·4d`` each)."""

    micro_batch: int
    seconds: float
    flops: float

    @property
    def flop_per_s(self) -> float:
        return self.flops / self.seconds


def gemm_times(
    micro_batches: list[int],
    seq_len: int = 64,
    d_model: int = 256,
    *,
    repeats: int = 7,
    device: str = "cpu",
    dtype=None,
    threads: int | None = 1,
) -> list[GemmTime]:
    """Measure one MLP block's forward + backward GEMMs at each micro-batch size (see module).
    ``threads``: CPU threads while measuring (1 by default: two threads on two shared cores
    spin against the other processes and time the machine's load, not the GEMM); ``None``
    keeps torch's setting."""
    import torch

    dtype = dtype or torch.float32
    before = torch.get_num_threads()
    if threads is not None and not device.startswith("cuda"):
        torch.set_num_threads(threads)
    try:
        return _measure(micro_batches, seq_len, d_model, repeats, device, dtype)
    finally:
        torch.set_num_threads(before)


def _measure(micro_batches, seq_len, d_model, repeats, device, dtype) -> list[GemmTime]:
    import torch

    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(d_model, 4 * d_model, generator=g).to(device, dtype)
    w2 = torch.randn(4 * d_model, d_model, generator=g).to(device, dtype)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    blocks = []
    for b in micro_batches:
        x = torch.randn(b * seq_len, d_model, generator=g).to(device, dtype)
        grad = torch.randn(b * seq_len, d_model, generator=g).to(device, dtype)

        def block(x=x, grad=grad) -> None:
            h = x @ w1  # forward
            y = h @ w2
            grad_h = grad @ w2.T  # backward: input gradients
            grad_x = grad_h @ w1.T
            grad_w2 = h.T @ grad  # backward: weight gradients
            grad_w1 = x.T @ grad_h
            del y, grad_x, grad_w1, grad_w2

        block()  # warm-up: every size before any is timed, so the first is not timed cold
        blocks.append(block)
    times: list[list[float]] = [[] for _ in micro_batches]
    for _ in range(repeats):  # round-robin: a burst of load on the shared cores hits every size
        for i, block in enumerate(blocks):
            sync()
            start = time.perf_counter()
            block()
            sync()
            times[i].append(time.perf_counter() - start)
    return [
        GemmTime(b, min(t), 6 * 2 * b * seq_len * d_model * 4 * d_model)
        for b, t in zip(micro_batches, times, strict=True)
    ]


@dataclass(frozen=True)
class StepAt:
    """The pipeline step at one micro-batch size: ``m`` micro-batches, ``one_f_one_b`` and
    ``interleaved`` step times (seconds, from the measured ``t(b)``)."""

    micro_batch: int
    n_micro: int
    stage_seconds: float
    one_f_one_b: float
    interleaved: float


def pipeline_steps(
    times: list[GemmTime],
    global_batch: int,
    p: int,
    v: int = 2,
    layers_per_stage: int = 1,
) -> list[StepAt]:
    """For every measured ``b`` dividing ``global_batch``: ``m = B/b``, ``t(b)`` = one stage
    (``layers_per_stage`` blocks), ``(m+p-1)·t(b)`` for 1F1B and ``(m+(p-1)/v)·t(b)``
    interleaved."""
    if global_batch < 1 or p < 1 or v < 1:
        raise ValueError(f"need B, p, v >= 1, got B={global_batch}, p={p}, v={v}")
    rows = []
    for t in times:
        if global_batch % t.micro_batch:
            continue
        m = global_batch // t.micro_batch
        stage = layers_per_stage * t.seconds
        rows.append(StepAt(t.micro_batch, m, stage, (m + p - 1) * stage, (m + (p - 1) / v) * stage))
    if not rows:
        raise ValueError(
            f"no measured micro-batch size divides the global batch {global_batch}; measure "
            "divisors of it"
        )
    return rows


def best_micro_batch(rows: list[StepAt], schedule: str = "one_f_one_b") -> int:
    """The ``b`` with the shortest step under ``schedule`` (``one_f_one_b`` or
    ``interleaved``)."""
    if schedule not in ("one_f_one_b", "interleaved"):
        raise ValueError(f"schedule={schedule!r}: choose 'one_f_one_b' or 'interleaved'")
    return min(rows, key=lambda r: getattr(r, schedule)).micro_batch


def step_with_linear_gemm(b: int, global_batch: int, p: int, t_one: float, v: int = 1) -> float:
    """The step if GEMM time were linear in ``b`` (``t(b) = b·t_one``): ``(B/b + (p-1)/v)·b·t_one``
    — the baseline the measured curve departs from (always best at ``b = 1``)."""
    return (global_batch / b + (p - 1) / v) * b * t_one
