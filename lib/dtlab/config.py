"""Run-size settings shared by labs, benchmarks and tests.

Labs run in one of two modes:

* ``fast`` — seconds on a 2-core laptop or CI: tiny model, world size 2–4, few steps.
* ``full`` — real sizes on a multi-GPU box.

The mode is ``full`` when at least two CUDA GPUs are visible and ``fast`` otherwise. The single
override is the ``DTLAB_MODE`` environment variable (``fast`` or ``full``), read here and nowhere
else, because a notebook run by ``pytest --nbval`` can be steered no other way.
"""

from __future__ import annotations

import os

MODES = ("fast", "full")


def lab_mode() -> str:
    """``"fast"`` or ``"full"`` (see module docstring)."""
    forced = os.environ.get("DTLAB_MODE", "").strip().lower()
    if forced:
        if forced not in MODES:
            raise ValueError(f"DTLAB_MODE={forced!r}: set it to 'fast' or 'full', or unset it")
        return forced
    try:
        import torch

        return "full" if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else "fast"
    except ImportError:
        return "fast"


def fast_mode() -> bool:
    """True when labs should run at their seconds-small size."""
    return lab_mode() == "fast"


def accelerator_count() -> int:
    """How many GPUs this process can see (0 without a GPU build or a GPU)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def lab_world_size(fast: int) -> int:
    """Ranks a lab starts: ``fast`` in fast mode, else one per GPU (at least ``fast``).

    Labs call this instead of asking the GPU runtime themselves, so a lab cell stays the same
    on every machine (DESIGN: a cell names a device only where it teaches the difference).
    """
    return fast if fast_mode() else max(fast, accelerator_count())
