"""The router's counts taken over the tokens one process counts: the global batch, and the other
context-parallel shards of the same sequences.

**Global-batch balancing.** The Switch loss ``E · Σ_i f_i · P_i`` asks the router to balance
whatever batch ``f`` is counted on. Counted per micro-batch on one rank (the default), it asks
*every micro-batch of every rank* to be balanced: a rank whose data is all code must spread its
code tokens over all experts, so no expert may specialise in code. Counted over the **global
batch** — the tokens per expert summed over the data-parallel ranks and over the step's
micro-batches so far — it asks only the whole step to be balanced (Qiu et al. 2025, "Demons in
the Detail: On Implementing Load Balancing Loss for Training Specialized Mixture-of-Expert
Models"; Megatron-Core's ``moe_router_load_balancing_type="global_aux_loss"``).

What moves: one all-reduce of ``E`` counts over ``dp`` per MoE layer and forward (float64, so
``2(dp−1)/dp · 8E`` bytes on the ring), inside the forward, before the loss. ``P_i`` stays this
rank's own mean probability: the gradient each rank sends back is still its own tokens'. Over
micro-batches the counts accumulate in a running sum (the later micro-batches see the earlier
ones' counts, as Megatron-Core's running buffer does; :meth:`GlobalLoad.new_step` clears it).

**Context parallel** (:class:`SequenceShards`). A cp rank holds ``1/cp`` of every sequence, so
whatever the router counts — ``f`` of the micro-batch scope, the ``(B, E)`` per-sequence counts of
DeepSeek-V3's sequence-wise loss, the bias step's load — must be summed over the ``cp`` group
before use; ``P_i`` stays each rank's mean over its own tokens. Why that is one process's
gradient: a rank's loss is ``E·Σ f_i·P_i(local)`` with ``f`` the whole micro-batch's (detached);
:mod:`~dtlab.parallel.compose.step` averages every gradient over ``cp`` (as it does for the
cross-entropy, each rank's mean over its own tokens), and with equal shards (zig-zag and
contiguous both cut ``S/cp`` per rank) ``mean_cp P_i(local) = P_i(whole)``, so the averaged
gradient is ``∇ E·Σ f_i·P_i(whole)`` — factor 1, no rescaling (Megatron-Core likewise reduces the
router's counts over its ``tp × cp`` group). The z-loss needs nothing: a mean over local tokens,
averaged over ``cp``, is the mean over all. What moves: one all-reduce of the counts over
``cp`` per MoE layer and forward — ``E`` float64 numbers (``B·E`` for the sequence scope),
``2(cp−1)/cp · 8E`` bytes per rank on the ring. The ``"global"`` scope sums over ``cp`` then ``dp``
(two all-reduces: ``cp`` ranks hold other parts of the same sequences, ``dp`` ranks other
sequences).

Capacity (token dropping) is *not* composed with context parallel: which assignments one process
drops depends on the order of all ``B·S`` tokens, and a cp rank sees an interleaved subset
(zig-zag chunks); matching it would need every rank's choices in sequence order (an all-gather of
``T·k`` expert indices per layer and forward) and the positions, which the MoE layer does not
have. :func:`~dtlab.parallel.compose.checks.per_token_router_problems` refuses it and says to
choose ``capacity_factor=None`` (dropless) or ``cp=1``.

:func:`use_global_batch_balance` installs one :class:`GlobalLoad` per MoE layer as the layer's
``load_reducer``; the layer uses it when ``MoEConfig.aux_loss_scope == "global"``.
:func:`count_like_one_process` is what :func:`~dtlab.parallel.compose.compose_gpt` installs;
:func:`step_balancing_biases` is the bias step over the same groups (call it after each step).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from dtlab.comm import Communicator
from dtlab.models.moe import MoE, moe_layers


def _summed(counts: torch.Tensor, communicators, name: str) -> torch.Tensor:
    """``counts`` (detached, float64 — exact for integers below 2⁵³ — on their own device)
    all-reduced over each communicator in ``communicators`` in turn."""
    summed = counts.detach().to(torch.float64).clone()
    for comm in communicators:
        if comm is not None and comm.world_size > 1:
            comm.all_reduce(summed, name=f"{comm.dim}.{name}")
    return summed


class SequenceShards:
    """The ranks holding the other parts of this rank's sequences — the ``cp`` group, or on the
    folded layout the ``tp × cp`` ranks of one dp index
    (:func:`~dtlab.parallel.compose.fold_experts.sequence_shards`): :meth:`sum` adds the
    router's counts over it (one all-reduce of ``counts.numel()`` float64 numbers)."""

    def __init__(self, cp_comm: Communicator) -> None:
        self.comm = cp_comm

    @property
    def size(self) -> int:
        """How many shards each sequence is cut into (``cp``)."""
        return self.comm.world_size

    def sum(self, counts: torch.Tensor) -> torch.Tensor:
        """``counts`` summed over the shards, in their own dtype (integer counts stay exact)."""
        return _summed(counts, [self.comm], "moe_counts").to(counts.dtype)


class GlobalLoad:
    """One MoE layer's tokens per expert summed over ``dp`` (and ``cp`` when given: the other
    shards of the same sequences) and the step's micro-batches."""

    def __init__(self, dp_comm: Communicator, cp_comm: Communicator | None = None) -> None:
        self.comm, self.cp_comm = dp_comm, cp_comm
        self.running: torch.Tensor | None = None

    def new_step(self) -> None:
        """Forget the last step's counts (call before the step's first micro-batch)."""
        self.running = None

    def __call__(self, counts: torch.Tensor) -> torch.Tensor:
        summed = _summed(counts, [self.cp_comm, self.comm], "moe_global_load")
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


def count_like_one_process(
    model: nn.Module, cp_comm: Communicator, dp_comm: Communicator
) -> list[MoE]:
    """What :func:`~dtlab.parallel.compose.compose_gpt` installs in every MoE layer of ``model``:
    with ``cp > 1`` a :class:`SequenceShards` (micro-batch and sequence scopes count whole
    sequences), and for the ``"global"`` scope a :class:`GlobalLoad` over ``cp`` and ``dp``,
    cleared before every forward of ``model`` (one forward per step without pipeline stages;
    with them, the step has no such hook, and ``per_token_router_problems`` refuses the scope)."""
    layers = moe_layers(model)
    for layer in layers:
        if cp_comm.world_size > 1:
            layer.sequence_shards = SequenceShards(cp_comm)
        if layer.moe.aux_loss_scope == "global":
            layer.load_reducer = GlobalLoad(dp_comm, cp_comm)
    if any(isinstance(layer.load_reducer, GlobalLoad) for layer in layers):
        model.register_forward_pre_hook(lambda module, args: new_step(module))
    return layers


@torch.no_grad()
def step_balancing_biases(model: nn.Module, *communicators: Communicator) -> None:
    """DeepSeek-V3's bias step on the load one process sees: every bias-balanced MoE layer's
    tokens per expert (its latest forward) summed over each group in ``communicators`` — ``dp``, and
    ``cp`` too under context parallel (one all-reduce per group for all layers) — so the bias,
    a buffer that steers every rank's routing, stays equal on every rank and to one process's.
    With ``communicators = (dp,)`` it steps as :func:`~dtlab.parallel.expert.update_balancing_biases`
    does (which sums float32 loads; these are float64, exact for any count below 2⁵³)."""
    layers = [m for m in moe_layers(model) if m.moe.bias_balancing]
    if not layers:
        return
    device = layers[0].balancing_bias.device
    loads = torch.tensor([m.stats.tokens_per_expert for m in layers], device=device)
    loads = _summed(loads, communicators, "moe_load_all_reduce")
    for layer, load in zip(layers, loads, strict=True):
        layer.update_balancing_bias(load)
