"""The position-wise MLP and the factory hook that lets a lab swap it (e.g. for mixture-of-experts).

A block's MLP may be any module mapping (B, S, d) to either a tensor (B, S, d) or a pair
``(tensor, aux_loss)`` — the second form is for a mixture-of-experts layer whose router adds a
load-balancing loss (Shazeer et al. 2017; Fedus et al. 2022, Switch Transformer). The block
records the aux loss and :class:`dtlab.models.GPT` sums it over blocks into ``model.aux_loss``.

:data:`MLPFactory` builds one block's MLP: ``factory(config, layer, device) -> nn.Module``. The
``layer`` index lets a factory put experts in some blocks only (every other layer, as GShard and
Switch do). Parameters of a factory's module are initialised by the model's name rule like every
other (weights ~ N(0, 0.02²), ``fc_out`` scaled by ``1/√(2·n_layers)``, biases 0, norms 1).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtlab.models.config import GPTConfig
from dtlab.models.dropout import residual_dropout

MLPFactory = Callable[[GPTConfig, int, "torch.device | str | None"], nn.Module]
"""``factory(config, layer, device) -> nn.Module`` building block ``layer``'s MLP."""


class MLP(nn.Module):
    """Position-wise feed-forward: ``fc_out(GELU(fc_in(x)))``, d → d_ff → d."""

    def __init__(self, config: GPTConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.dropout = config.dropout
        self.fc_in = nn.Linear(config.d_model, config.d_ff, bias=config.bias, device=device)
        self.fc_out = nn.Linear(config.d_ff, config.d_model, bias=config.bias, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(self.fc_in(x), approximate="tanh")
        return residual_dropout(self.fc_out(hidden), self.dropout, self.training)


def default_mlp(
    config: GPTConfig, layer: int, device: torch.device | str | None = None
) -> nn.Module:
    """The :data:`MLPFactory` every block uses unless told otherwise: a dense :class:`MLP`."""
    return MLP(config, device)
