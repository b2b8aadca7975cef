"""Fit the alpha-beta model to measured times: what α and β does *this* machine have?

Every algorithm's time is ``a·α + b·β`` with ``(a, b)`` known from
:func:`dtlab.cost.collectives.terms`, so a sweep of measured ``(size, seconds)`` points is a
linear least-squares problem in the two unknowns ``α`` and ``β``. Rows are divided by the
measured time so each point counts by its *relative* error — otherwise the 64 MiB points
(hundreds of milliseconds) drown the 1 KiB ones (tens of microseconds) that pin down ``α``.
Both unknowns are kept non-negative: a negative fit of one is refitted with it at zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dtlab.cost.alpha_beta import Link
from dtlab.cost.collectives import collective_time, terms


def fit_alpha_beta(
    sizes_bytes: Sequence[float],
    seconds: Sequence[float],
    op: str = "all_reduce",
    algorithm: str = "ring",
    n: int = 2,
    name: str = "",
) -> Link:
    """The :class:`Link` whose model best explains ``seconds`` measured at ``sizes_bytes``.

    ``op``/``algorithm``/``n`` say what was measured (e.g. our ring all-reduce on 4 ranks); for
    a plain ping-pong use ``op="broadcast", algorithm="flat", n=2`` (one message of ``M`` bytes).
    """
    if len(sizes_bytes) != len(seconds):
        raise ValueError("sizes_bytes and seconds must have one entry per measured point")
    label = name or f"fitted from {op} {algorithm} on {n} ranks"
    return fit_alpha_beta_jointly(
        [(op, algorithm, n, m, t) for m, t in zip(sizes_bytes, seconds, strict=True)], label
    )


def fit_alpha_beta_jointly(
    measurements: Sequence[tuple[str, str, int, float, float]], name: str = "fitted"
) -> Link:
    """One :class:`Link` explaining measurements of *several* algorithms at once.

    Each measurement is ``(op, algorithm, n, nbytes, seconds)``. One machine has one α and one
    β; fitting them across ring, tree and recursive doubling together and then predicting each
    algorithm from that single link is the honest test of the model.
    """
    if len(measurements) < 2:
        raise ValueError("fitting α and β needs at least two measurements")
    if any(m[4] <= 0 for m in measurements):
        raise ValueError("every measured time must be > 0 seconds")
    rows = [terms(op, algorithm, nbytes, n) for op, algorithm, n, nbytes, _ in measurements]
    a = np.array([[r.latencies, r.bandwidth_bytes] for r in rows], dtype=float)
    t = np.array([m[4] for m in measurements], dtype=float)
    a_weighted, ones = a / t[:, None], np.ones_like(t)
    alpha, beta = np.linalg.lstsq(a_weighted, ones, rcond=None)[0]
    if beta <= 0:  # latency explains everything: only possible for tiny sweeps
        alpha = float(np.linalg.lstsq(a_weighted[:, :1], ones, rcond=None)[0][0])
        beta = 1e-15
    elif alpha < 0:
        alpha = 0.0
        beta = float(np.linalg.lstsq(a_weighted[:, 1:], ones, rcond=None)[0][0])
    return Link(alpha_s=float(alpha), bandwidth_bytes_per_s=1.0 / float(beta), name=name)


def model_relative_error(
    link: Link,
    sizes_bytes: Sequence[float],
    seconds: Sequence[float],
    op: str,
    algorithm: str,
    n: int,
) -> list[float]:
    """``(predicted - measured) / measured`` at each point: how well the fitted line tracks."""
    return [
        collective_time(op, algorithm, m, n, link) / t - 1.0
        for m, t in zip(sizes_bytes, seconds, strict=True)
    ]
