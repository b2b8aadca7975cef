"""Pipeline bubbles: the idle time of a synchronous pipeline schedule, in two conventions.

With ``p`` pipeline stages and ``m`` micro-batches, GPipe (Huang et al. 2019, "GPipe: Efficient
Training of Giant Neural Networks using Pipeline Parallelism") and 1F1B (PipeDream-Flush;
Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", Sec. 2.2) both leave every stage idle for ``p-1`` micro-batch slots while the
pipeline fills and drains, next to ``m`` slots of useful work (per direction). Two ratios are in use,
and they are easy to confuse:

* :func:`bubble_fraction_of_total` = idle / (idle + useful) = ``(p-1) / (m+p-1)``: the share of
  wall time a stage is idle. Always below 1.
* :func:`bubble_ratio_to_ideal` = idle / useful = ``(p-1) / m``: how much longer than the
  bubble-free ideal the step takes. Megatron-LM's paper uses this one; it exceeds 1 when ``m < p-1``.

Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2) gives each device ``v`` model chunks
("virtual stages"); the fill/drain slots shrink by ``v``: idle/ideal = ``(p-1) / (v·m)``, at the
price of ``v``× more point-to-point messages.
"""

from __future__ import annotations

import math


def _check(p: int, m: int, v: int = 1) -> None:
    if p < 1 or m < 1 or v < 1:
        raise ValueError(
            f"pipeline stages p={p}, micro-batches m={m} and virtual stages v={v} must all be >= 1"
        )


def bubble_fraction_of_total(p: int, m: int) -> float:
    """Idle share of the pipeline step: ``(p-1) / (m+p-1)`` (GPipe / 1F1B)."""
    _check(p, m)
    return (p - 1) / (m + p - 1)


def bubble_ratio_to_ideal(p: int, m: int) -> float:
    """Idle time relative to the ideal (bubble-free) time: ``(p-1) / m`` (GPipe / 1F1B)."""
    _check(p, m)
    return (p - 1) / m


def interleaved_bubble_ratio_to_ideal(p: int, m: int, v: int) -> float:
    """Interleaved 1F1B with ``v`` virtual stages per device: ``(p-1) / (v·m)`` of the ideal time."""
    _check(p, m, v)
    return (p - 1) / (v * m)


def interleaved_bubble_fraction_of_total(p: int, m: int, v: int) -> float:
    """Interleaved 1F1B idle share of the step: ``(p-1) / (v·m + p-1)``."""
    _check(p, m, v)
    return (p - 1) / (v * m + p - 1)


def micro_batches_for_bubble(p: int, max_ratio_to_ideal: float, v: int = 1) -> int:
    """The fewest micro-batches keeping the bubble at most ``max_ratio_to_ideal`` of ideal time."""
    _check(p, 1, v)
    if max_ratio_to_ideal <= 0:
        raise ValueError(f"max_ratio_to_ideal={max_ratio_to_ideal} must be > 0, e.g. 0.1 for 10%")
    m = max(1, math.ceil((p - 1) / (v * max_ratio_to_ideal)))
    # The ceiling can land one too high through float rounding (3 / 0.1 = 30.000000000000004).
    while m > 1 and (p - 1) / (v * (m - 1)) <= max_ratio_to_ideal:
        m -= 1
    return m


def schedule_idle(
    schedule: str, p: int, v: float, forward: float, input_grad: float, weight_grad: float
) -> float:
    """Idle time one device spends per step in the fill and drain, for one micro-batch's
    forward ``F``, input-gradient backward ``B`` and weight-gradient backward ``W``
    (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", Table 2, with its ``B`` = ``B + W``):

    * ``"1f1b"``: ``(p−1)·(F+B+W)``; interleaved with ``v`` chunks, ``/v`` (Narayanan et al.
      2021, Sec. 2.2.2);
    * ``"zb-h1"``: ``(p−1)·(F+B−W)`` — the weight gradients fill the drain (Qi et al. 2024,
      "Zero Bubble Pipeline Parallelism"); a third of 1F1B's when ``F = B = W``;
    * ``"dualpipe"``/``"dualpipev"``: ``(p/2−1)·(F&B + (B+W) − 3W)`` with ``F&B = F+B+W``, the
      overlapped forward-and-backward chunk taking the sum of its parts: ``(p/2−1)·(F+2B−W)``.
    """
    if p < 1 or v < 1 or min(forward, input_grad, weight_grad) < 0:
        raise ValueError(f"need p >= 1, v >= 1 and times >= 0 (p={p}, v={v})")
    if schedule == "1f1b":
        return (p - 1) * (forward + input_grad + weight_grad) / v
    if schedule == "zb-h1":
        return (p - 1) * max(0.0, forward + input_grad - weight_grad)
    if schedule in ("dualpipe", "dualpipev"):
        return max(0.0, p / 2 - 1) * max(0.0, forward + 2 * input_grad - weight_grad)
    raise ValueError(f"schedule={schedule!r}: choose '1f1b', 'zb-h1', 'dualpipe' or 'dualpipev'")
