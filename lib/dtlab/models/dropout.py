"""Dropout as the lab GPT applies it to embeddings and residual branches."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def residual_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout(x, p)`` while training with ``p > 0``; ``x`` itself otherwise.

    Skipping the call at ``p == 0`` keeps dropout masks out of the saved-activation accounting.
    """
    return F.dropout(x, p) if training and p > 0 else x
