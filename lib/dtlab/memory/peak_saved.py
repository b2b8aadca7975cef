"""The peak of bytes saved for backward during one composed training step, on one rank, sorted
into the planner's categories (:mod:`dtlab.plan.predict_activations`) — measured, never computed.

:func:`measure_step_activations` runs ``composed.train_step`` inside one
:class:`~dtlab.memory.ActivationMeter` (saved-tensor hooks) that stays on through forward *and*
backward, so its ``peak_bytes`` is the most bytes held at once: for a pipeline, the micro-batches
in flight when the stage's first backward starts. The parameters and the global batch the caller
passed are left out (views of the batch share its storage: data, not activations).

Categories, from the module that saved each storage (pipeline stages prefix it with the stage):
``blocks.*`` → ``blocks``; ``embed`` → ``embedding``; ``final_norm``/``lm_head`` → ``head``; the
model's own forward (the loss) → ``loss``; every 1-D int64 tensor saved inside the model
(position indices) → ``positions``.
"""

from __future__ import annotations

import re

import torch

from dtlab.memory.activations import ActivationMeter, SavedStorage

_STAGE_PREFIX = re.compile(r"^\d+\.")


def category_of(record: SavedStorage) -> str:
    """The planner's category of one saved storage (see the module docstring)."""
    module = _STAGE_PREFIX.sub("", record.module)
    if module == "":
        return "loss"
    if record.dtype == torch.int64 and len(record.shape) == 1:
        return "positions"
    if module.startswith("blocks."):
        return "blocks"
    if module.startswith(("embed", "pos_embed")):
        return "embedding"
    if module.startswith(("final_norm", "lm_head")):
        return "head"
    raise ValueError(f"a storage saved by module {record.module!r} fits no category")


def by_category(records: list[SavedStorage]) -> dict[str, int]:
    """Bytes of every storage saved during the step, by category (summed over micro-batches)."""
    out = dict.fromkeys(("blocks", "embedding", "head", "loss", "positions"), 0)
    for record in records:
        out[category_of(record)] += record.nbytes
    return out


def measure_step_activations(composed, tokens: torch.Tensor, targets: torch.Tensor) -> dict:
    """Run one ``composed.train_step(tokens, targets)`` under the meter. Returns ``peak`` (bytes
    held at once), ``total`` (every storage saved in the step) and ``by_category`` (of ``total``),
    plus ``after_backward`` (bytes still held at the end: 0 when backward freed everything)."""
    with ActivationMeter(composed.module, exclude=[tokens, targets]) as meter:
        composed.train_step(tokens, targets)
    return {
        "peak": meter.peak_bytes,
        "total": meter.total_bytes,
        "by_category": by_category(meter.records),
        "after_backward": meter.current_bytes,
    }
