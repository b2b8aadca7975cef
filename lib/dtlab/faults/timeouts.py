"""Collective timeouts: how long to wait before calling a silent peer hung.

A hung rank (a deadlocked collective, a dead NIC, a GPU stuck in a kernel) stalls every rank that
waits on it; nothing errors until a timeout fires. The timeout trades two losses:

* **detection cost** — each real hang wastes the whole timeout before the restart begins:
  ``hangs/h · (timeout + restart)`` seconds per hour;
* **false positives** — a healthy rank that is merely slow for a while (a checkpoint write, a
  garbage-collection pause, a straggler, a recompilation) trips a timeout shorter than its pause
  and restarts a job that was fine. With pauses arriving at ``p``/h and lasting an exponential
  time of mean ``μ``, that costs ``p · e^(−timeout/μ) · restart`` seconds per hour.

Their sum (:func:`lost_seconds_per_hour`) is smallest at ``timeout* = μ · ln(p·restart/(h·μ))``
(:func:`best_timeout`, where its derivative ``h − (p·restart/μ)·e^(−t/μ)`` is zero).

**Two timeouts.** The first collective waits for the slowest rank to start: imports, loading a
checkpoint, compiling — minutes, once. Later collectives wait only for step-to-step jitter. One
timeout cannot fit both: long enough for start-up, it detects every later hang minutes late. So
jobs join the process group with a long timeout, pass one barrier once every rank is ready, and
then shorten the group's timeout for training — torchtitan's ``init_timeout_seconds`` and
``train_timeout_seconds``. :func:`dtlab.launch` takes both (``start_timeout`` and ``timeout``)
and :func:`dtlab.runtime.torchrun.set_training_timeout` shortens it after the barrier; a
:class:`~dtlab.Cluster` has ``start_timeout`` (ranks start and join) and ``timeout`` (each run).

**What each rank was doing.** When a timeout fires, the question is who is missing from which
collective. NCCL's flight recorder keeps the last collectives of each rank in a ring buffer and
dumps them on a timeout (``TORCH_NCCL_TRACE_BUFFER_SIZE`` — ``TORCH_FR_BUFFER_SIZE`` in newer
torch — with ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``), and torch's ``fr_trace`` tool lines the ranks'
dumps up. dtlab's Cluster does the same on CPU: its
:class:`~dtlab.ClusterTimeout` names, for every stuck rank, the call and process group it is
blocked in, the dtlab API in flight and the user's line (lab 10 shows one).
"""

from __future__ import annotations

import math


def lost_seconds_per_hour(
    timeout_s: float,
    hangs_per_hour: float,
    restart_s: float,
    pauses_per_hour: float,
    pause_mean_s: float,
) -> float:
    """Seconds lost per hour: hangs detected late plus healthy pauses mistaken for hangs."""
    if min(timeout_s, hangs_per_hour, restart_s, pauses_per_hour) < 0 or pause_mean_s <= 0:
        raise ValueError("rates and times must be >= 0, and the mean pause > 0 seconds")
    detection = hangs_per_hour * (timeout_s + restart_s)
    false_positives = pauses_per_hour * math.exp(-timeout_s / pause_mean_s) * restart_s
    return detection + false_positives


def best_timeout(
    hangs_per_hour: float, restart_s: float, pauses_per_hour: float, pause_mean_s: float
) -> float:
    """The timeout that minimises :func:`lost_seconds_per_hour`:
    ``μ · ln(p · restart / (h · μ))`` (0 when pauses are too rare to matter)."""
    if hangs_per_hour <= 0 or pause_mean_s <= 0 or restart_s < 0 or pauses_per_hour < 0:
        raise ValueError("need hangs_per_hour > 0, pause_mean_s > 0 and non-negative others")
    ratio = pauses_per_hour * restart_s / (hangs_per_hour * pause_mean_s)
    return pause_mean_s * math.log(ratio) if ratio > 1 else 0.0


def false_positive_share(timeout_s: float, pause_mean_s: float) -> float:
    """Share of healthy pauses (exponential, mean ``μ``) that outlast the timeout: ``e^(−t/μ)``."""
    if timeout_s < 0 or pause_mean_s <= 0:
        raise ValueError("need timeout_s >= 0 and pause_mean_s > 0")
    return math.exp(-timeout_s / pause_mean_s)
