"""Global-batch load balancing: the balance loss's expert counts taken over the whole step's batch.

The Switch loss ``E · Σ_i f_i · P_i`` asks the router to balance whatever batch ``f`` is counted
on. Counted per micro-batch on one rank (the default), it asks *every micro-batch of every rank*
to be balanced: a rank whose data is all code must spread its code tokens over all experts, so
no expert may specialise in code. Counted over the **global batch** — the tokens per expert
summed over the data-parallel ranks and over the step's micro-batches so far — it asks only the
whole step to be balanced (Qiu et al. 2025, "Demons in the Detail: On Implementing Load
Balancing Loss for Training Specialized Mixture-of-Expert Models"; Megatron-Core's
``moe_router_load_balancing_type="global_aux_loss"``).

What moves: one all-reduce of ``E`` counts over ``dp`` per MoE layer and forward (float64, so
``2(dp−1)/dp · 8E`` bytes on the ring), inside the forward, before the loss. ``P_i`` stays this
rank's own mean probability: the gradient each rank sends back is still its own tokens'. Over
micro-batches the counts accumulate in a running sum (the later micro-batches see the earlier
ones' counts, as Megatron-Core's running buffer does; :meth:`GlobalLoad.new_step` clears it).

:func:`use_global_batch_balance` installs one :class:`GlobalLoad` per MoE layer as the layer's
``load_reducer``; the layer uses it when ``MoEConfig.aux_loss_scope == "global"``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from dtlab.comm import Communicator
from dtlab.models.moe import MoE, moe_layers


class GlobalLoad:
    """One MoE layer's tokens per expert summed over ``dp`` and the step's micro-batches."""

    def __init__(self, dp_comm: Communicator) -> None:
        self.comm = dp_comm
        self.running: torch.Tensor | None = None

    def new_step(self) -> None:
        """Forget the last step's counts (call before the step's first micro-batch)."""
        self.running = None

    def __call__(self, counts: torch.Tensor) -> torch.Tensor:
        summed = counts.detach().to(torch.float64).clone()
        if self.comm.world_size > 1:
            self.comm.all_reduce(summed, name="dp.moe_global_load")
        self.running = summed if self.running is None else self.running + summed
        return self.running


def use_global_batch_balance(model: nn.Module, dp_comm: Communicator) -> list[GlobalLoad]:
    """Give every MoE layer of ``model`` a :class:`GlobalLoad` over ``dp_comm``; returns them
    (call ``new_step()`` on each before a step's first micro-batch)."""
    loads = []
    for layer in moe_layers(model):
        layer.load_reducer = GlobalLoad(dp_comm)
        loads.append(layer.load_reducer)
    return loads


def new_step(model: nn.Module) -> None:
    """Clear every MoE layer's running global-batch counts."""
    for layer in moe_layers(model):
        if isinstance(layer, MoE) and isinstance(layer.load_reducer, GlobalLoad):
            layer.load_reducer.new_step()
