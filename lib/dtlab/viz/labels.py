"""Human-readable numbers for hover text: bytes in binary units, durations in µs or ms."""

from __future__ import annotations

MIB = 2**20


def format_bytes(nbytes: float) -> str:
    """``4096`` -> ``"4.0 KiB"``; binary units, as memory and message sizes are counted."""
    if abs(nbytes) < 1024:
        return f"{int(nbytes)} B"
    value, unit = float(nbytes), "B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):  # noqa: B007 - the last unit tried is the one shown
        value /= 1024
        if abs(value) < 1024:
            break
    return f"{value:.1f} {unit}"


def format_duration_ns(ns: int) -> str:
    """Microseconds below one millisecond, milliseconds above."""
    return f"{ns / 1e3:.1f} µs" if ns < 1_000_000 else f"{ns / 1e6:.3f} ms"


def format_labels(labels: dict) -> str:
    return ", ".join(f"{key}={value}" for key, value in labels.items())
