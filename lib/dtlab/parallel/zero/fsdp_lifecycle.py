"""FSDP's unit lifecycle: one explicit state machine per unit, driven by the wrapper's hooks.

ZeRO stage 3 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC 2020, §5.3) and PyTorch FSDP (Zhao et al., "PyTorch FSDP: Experiences on
Scaling Fully Sharded Data Parallel", VLDB 2023, §3.2-3.3) gather a unit's parameters just
before it runs, free them right after, gather them again for backward and reduce-scatter the
gradients as soon as they exist. Every one of those moves is a transition below; nothing else
in dtlab decides when a unit gathers, frees or reduces. The hooks in
:mod:`~dtlab.parallel.zero.fsdp` only report events; the operations themselves (the collectives
and the buffers) are :class:`~dtlab.parallel.zero.fsdp_unit.FSDPUnit`'s.

The states of one unit in one training step (``k-1``/``k+1`` are its neighbours in the wrapper's
unit order; a *re-run* is a forward that activation checkpointing runs inside backward)::

     +-------------------------------------------------------->  SHARDED  <-------------+
     |                                                            |  |  |               |
     |            PREFETCH (k-1 or k+1 started; overlaps compute) |  |  |               |
     |     +------------------------------------------------------+  |  |               |
     |     v                                                         |  |               |
     |  PREFETCHING --FORWARD_START--+      +------FORWARD_START-----+  |               |
     |     |                         v      v                           |               |
     |     |                     GATHERED_FOR_FORWARD --FORWARD_END (freed)-------------+
     |     |                                                            |
     |     |   GRAD_AT_OUTPUT (the gradient reached an output;          |
     |     |   prefetch k-1) or RECOMPUTE_START (a re-run region)       |
     |     +----------------------> GATHERED_FOR_BACKWARD <-------------+
     |                               |  loops on RECOMPUTE_START, RECOMPUTE_END and another
     |                               |  GRAD_AT_OUTPUT: a checkpoint re-runs the unit on its
     |                               |  whole parameters, gathering nothing, freeing nothing
     |                               |
     |                               | ALL_GRADIENTS: its last gradient accumulated (or the
     |                               v end of backward, for a unit that got none)
     |                            REDUCING    reduce-scatter launched, parameters freed
     |                               |        (under no_sync: gradients added to ``unsynced``)
     |                               | BACKWARD_END: waited, averaged into ``.grad``
     |                               v
     +-----STEP_START------------ REDUCED --FORWARD_START--> GATHERED_BETWEEN_STEPS
       (a training forward)              <--FORWARD_END----  (a no-grad forward)

One step of block unit k, prefetch on, goes SHARDED -> PREFETCHING -> GATHERED_FOR_FORWARD ->
SHARDED -> PREFETCHING -> GATHERED_FOR_BACKWARD -> REDUCING -> REDUCED (without prefetch the two
PREFETCHING drop out). Activation checkpointing adds no state: ``checkpoint(block, x)`` from
outside re-runs the unit as RECOMPUTE_START/RECOMPUTE_END inside GATHERED_FOR_BACKWARD; a block
that checkpoints its own body re-runs the body with no event at all, reading the parameters
GATHERED_FOR_BACKWARD keeps registered (FSDP2's pre-backward hook does the same). A unit that
only appears inside a re-run region (reentrant checkpointing ran its forward under no_grad)
enters GATHERED_FOR_BACKWARD straight from SHARDED by RECOMPUTE_START. ``no_sync`` changes what
ALL_GRADIENTS sends (nothing), not the states.

``reshard_after_forward=False`` (FSDP2's flag) adds one state and one event: in a forward with
gradients, GATHERED_FOR_FORWARD --FORWARD_END_KEEP--> KEPT_FOR_BACKWARD (nothing freed), then
GRAD_AT_OUTPUT or RECOMPUTE_START --> GATHERED_FOR_BACKWARD without gathering again: one
all-gather per unit per step instead of two, all units held gathered at the end of forward.

Two rules fall out of the table. A unit is prefetched only from SHARDED: never one already
gathered or in flight, never one whose gradients are reduced — which is why, between a backward
and the next training forward (every unit REDUCED), a no-grad forward gathers each unit only
when it runs. And a re-run inside backward prefetches nothing. Any event not in
:data:`TRANSITIONS` for the current state is impossible and raises :class:`UnitLifecycleError`
naming the unit, the state, the event and the unit's last transitions; every transition is
appended to the machine's ``history``, so a test can read the path a unit took. The states,
events and the table itself are data, in :mod:`~dtlab.parallel.zero.fsdp_states`; one unit's
machine, :class:`UnitLifecycle`, is in :mod:`~dtlab.parallel.zero.fsdp_unit_machine`; this
module holds :class:`FSDPLifecycle`, which drives every unit's machine.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dtlab.parallel.gradient_sync import queue_end_of_backward
from dtlab.parallel.zero.fsdp_states import TRANSITIONS, Event, S, UnitState
from dtlab.parallel.zero.fsdp_unit import FSDPUnit
from dtlab.parallel.zero.fsdp_unit_machine import UnitLifecycle, UnitLifecycleError

__all__ = [
    "TRANSITIONS",
    "Event",
    "FSDPLifecycle",
    "UnitLifecycle",
    "UnitLifecycleError",
    "UnitState",
]


class FSDPLifecycle:
    """Every unit's machine plus what they share: the phase of the step, prefetch and ``sync``.

    The wrapper's hooks call one method each. ``end_of_backward`` is queued on the autograd
    engine when the first gradient reaches a unit's output (it must call :meth:`backward_end`).

    Prefetch depth: when a unit starts its forward, the next ``forward_prefetch`` units in
    forward order launch their all-gathers (if at rest); when a unit is gathered for backward,
    the next ``backward_prefetch`` units in backward order do. Depth ``d`` holds up to ``d + 1``
    gathered units at once (``d`` in flight, one computing) — more memory, and an earlier start
    for each gather, which hides more only where the link would otherwise idle (the gathers
    still run one after another: :func:`~dtlab.parallel.zero.prefetch.prefetch_timeline`);
    ``prefetch=False`` is depth 0 both ways. ``reshard_after_forward=False``
    keeps every unit gathered from its forward to its backward: no backward all-gather (2 instead
    of 3 transfers of Ψ per step) for holding all the gathered parameters at the end of forward.
    ``peak_gathered_bytes`` is the largest sum of gathered buffers seen after any event since
    :meth:`reset_peak` (counted from the buffers' storages).
    """

    def __init__(
        self,
        units: list[FSDPUnit],
        prefetch: bool,
        end_of_backward: Callable[[], None],
        *,
        forward_prefetch: int = 1,
        backward_prefetch: int = 1,
        reshard_after_forward: bool = True,
    ) -> None:
        if forward_prefetch < 0 or backward_prefetch < 0:
            raise ValueError(
                f"prefetch depths must be 0 or more units, got forward={forward_prefetch}, "
                f"backward={backward_prefetch}"
            )
        self.units = [UnitLifecycle(u) for u in units]
        self.prefetch = prefetch
        self.forward_prefetch, self.backward_prefetch = forward_prefetch, backward_prefetch
        self.reshard_after_forward = reshard_after_forward
        self.sync = True  # False inside the wrapper's no_sync(): reductions are kept, not sent
        self.in_backward = False
        self._end_of_backward = end_of_backward
        self.peak_gathered_bytes = 0

    def gathered_bytes(self) -> int:
        """Bytes of gathered parameter buffers this rank holds right now."""
        return sum(m.unit.held_bytes()["gathered"] for m in self.units)

    def reset_peak(self) -> None:
        self.peak_gathered_bytes = self.gathered_bytes()

    def _note_peak(self) -> None:
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes())

    def _prefetch(self, order: list[int]) -> None:
        if self.prefetch:
            for index in order:
                self.units[index].on_prefetch()
        self._note_peak()

    def _backward_order_after(self, index: int) -> list[int]:
        """The units backward reaches after ``index``: the root (0) first, then L-1, ..., 1."""
        order = [0, *range(len(self.units) - 1, 0, -1)]
        at = order.index(index)
        return order[at + 1 : at + 1 + self.backward_prefetch]

    def step_start(self) -> None:
        """The wrapper's forward with gradients enabled: a training step begins."""
        self.in_backward = False
        for machine in self.units:
            machine.on_step_start()

    def forward_start(self, index: int) -> None:
        if self.in_backward:  # a checkpoint re-runs the unit: it prefetches nothing
            self.units[index].on_recompute_start()
        else:
            self.units[index].on_forward_start()
            last = min(index + 1 + self.forward_prefetch, len(self.units))
            self._prefetch(list(range(index + 1, last)))

    def forward_end(self, index: int) -> bool:
        """Returns whether the gradients of the unit's outputs are to be watched
        (:meth:`grad_at_output`): in a forward with gradients, not in a re-run."""
        if self.in_backward:
            self.units[index].on_recompute_end()
            return False
        keep = not self.reshard_after_forward and torch.is_grad_enabled()
        self.units[index].on_forward_end(keep)
        return torch.is_grad_enabled()

    def grad_at_output(self, index: int) -> None:
        if not self.in_backward:
            self.in_backward = True
            queue_end_of_backward(self._end_of_backward)
        machine = self.units[index]
        machine.on_grad_at_output()
        if machine.state is S.GATHERED_FOR_BACKWARD:  # backward runs the units in reverse
            self._prefetch(self._backward_order_after(index))

    def gradient(self, index: int) -> None:
        self.units[index].on_gradient(self.sync)

    def backward_end(self) -> None:
        """Reduce every unit that got no gradient (zeros), then wait for every reduction."""
        if not self.in_backward:
            return
        for machine in self.units:
            if machine.state not in (S.REDUCING, S.REDUCED):
                machine.on_all_gradients(self.sync)
        for machine in self.units:
            machine.on_backward_end()
        self.in_backward = False
