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

Two rules fall out of the table. A unit is prefetched only from SHARDED: never one already
gathered or in flight, never one whose gradients are reduced — which is why, between a backward
and the next training forward (every unit REDUCED), a no-grad forward gathers each unit only
when it runs. And a re-run inside backward prefetches nothing. Any event not in
:data:`TRANSITIONS` for the current state is impossible and raises :class:`UnitLifecycleError`
naming the unit, the state, the event and the unit's last transitions; every transition is
appended to the machine's ``history``, so a test can read the path a unit took.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import torch

from dtlab.comm import PendingCollective
from dtlab.parallel.gradient_sync import queue_end_of_backward
from dtlab.parallel.zero.fsdp_unit import FSDPUnit


class UnitState(enum.Enum):
    """Where one unit's parameters are and what its gradients are doing."""

    SHARDED = "shards registered, nothing gathered; gradients not reduced this step"
    PREFETCHING = "all-gather in flight (launched early to overlap compute); shards registered"
    GATHERED_FOR_FORWARD = "whole parameters gathered and registered for the forward"
    GATHERED_FOR_BACKWARD = "whole parameters gathered and registered until gradients reduce"
    REDUCING = "gradients handed to the reduce-scatter (or kept under no_sync); freed"
    REDUCED = "averaged gradients in .grad; at rest until the next training forward"
    GATHERED_BETWEEN_STEPS = "gathered for a no-grad forward after the step's backward"


class Event(enum.Enum):
    """What the wrapper's hooks report about a unit."""

    STEP_START = "a training forward of the wrapper begins"
    PREFETCH = "a neighbour started: fetch this unit early if it is at rest"
    FORWARD_START = "the unit's forward begins"
    FORWARD_END = "the unit's forward returned"
    RECOMPUTE_START = "the unit's forward begins inside backward (a checkpoint re-run)"
    RECOMPUTE_END = "the unit's forward returned inside backward"
    GRAD_AT_OUTPUT = "the gradient reached one of the unit's outputs"
    ALL_GRADIENTS = "every parameter of the unit has its gradient (or backward ended)"
    BACKWARD_END = "the backward pass finished: wait for the unit's reductions"


S, E = UnitState, Event

TRANSITIONS: dict[tuple[UnitState, Event], UnitState] = {
    # a training step begins: the gradient count restarts
    (S.SHARDED, E.STEP_START): S.SHARDED,
    (S.PREFETCHING, E.STEP_START): S.PREFETCHING,  # a prefetch the last forward never used
    (S.REDUCED, E.STEP_START): S.SHARDED,
    # forward
    (S.SHARDED, E.PREFETCH): S.PREFETCHING,
    (S.SHARDED, E.FORWARD_START): S.GATHERED_FOR_FORWARD,
    (S.PREFETCHING, E.FORWARD_START): S.GATHERED_FOR_FORWARD,
    (S.GATHERED_FOR_FORWARD, E.FORWARD_END): S.SHARDED,
    # backward: gathered again from the moment the gradient reaches the unit's output
    (S.SHARDED, E.GRAD_AT_OUTPUT): S.GATHERED_FOR_BACKWARD,
    (S.PREFETCHING, E.GRAD_AT_OUTPUT): S.GATHERED_FOR_BACKWARD,
    (S.GATHERED_FOR_BACKWARD, E.GRAD_AT_OUTPUT): S.GATHERED_FOR_BACKWARD,  # another output
    (S.REDUCING, E.GRAD_AT_OUTPUT): S.REDUCING,  # its gradients already left: nothing to do
    (S.REDUCED, E.GRAD_AT_OUTPUT): S.REDUCED,  # a second backward through a retained graph
    # activation checkpointing re-runs the unit's forward inside backward
    (S.SHARDED, E.RECOMPUTE_START): S.GATHERED_FOR_BACKWARD,
    (S.PREFETCHING, E.RECOMPUTE_START): S.GATHERED_FOR_BACKWARD,
    (S.GATHERED_FOR_BACKWARD, E.RECOMPUTE_START): S.GATHERED_FOR_BACKWARD,
    (S.GATHERED_FOR_BACKWARD, E.RECOMPUTE_END): S.GATHERED_FOR_BACKWARD,
    # reduction (from SHARDED or PREFETCHING only at the end of backward: no gradient came)
    (S.GATHERED_FOR_BACKWARD, E.ALL_GRADIENTS): S.REDUCING,
    (S.SHARDED, E.ALL_GRADIENTS): S.REDUCING,
    (S.PREFETCHING, E.ALL_GRADIENTS): S.REDUCING,
    (S.REDUCING, E.BACKWARD_END): S.REDUCED,
    (S.REDUCED, E.BACKWARD_END): S.REDUCED,  # a second backward through a retained graph
    # a no-grad forward between a backward and the next training forward
    (S.REDUCED, E.FORWARD_START): S.GATHERED_BETWEEN_STEPS,
    (S.GATHERED_BETWEEN_STEPS, E.FORWARD_END): S.REDUCED,
    # a step an exception interrupted: the next forward carries on with what is gathered
    (S.GATHERED_FOR_FORWARD, E.FORWARD_START): S.GATHERED_FOR_FORWARD,
    (S.GATHERED_FOR_FORWARD, E.STEP_START): S.GATHERED_FOR_FORWARD,
    (S.GATHERED_BETWEEN_STEPS, E.FORWARD_START): S.GATHERED_BETWEEN_STEPS,
    (S.GATHERED_BETWEEN_STEPS, E.STEP_START): S.GATHERED_FOR_FORWARD,
    (S.GATHERED_FOR_BACKWARD, E.STEP_START): S.GATHERED_FOR_FORWARD,
    (S.REDUCING, E.STEP_START): S.SHARDED,  # its launched reductions finish at the next end
}
"""Every possible (state, event) and the state it leads to; anything else raises."""

_GATHERED = (S.GATHERED_FOR_FORWARD, S.GATHERED_FOR_BACKWARD, S.GATHERED_BETWEEN_STEPS)


class UnitLifecycleError(RuntimeError):
    """An event that cannot happen in the unit's state: a bug in the hooks, or a model that uses
    a unit's parameters outside the unit's forward."""


class UnitLifecycle:
    """One unit's state machine: one method per event, each checked against :data:`TRANSITIONS`.

    ``history`` lists every transition as ``(event, before, after)``; :meth:`states` is the path.
    """

    def __init__(self, unit: FSDPUnit) -> None:
        self.unit = unit
        self.state = S.SHARDED
        self.history: list[tuple[Event, UnitState, UnitState]] = []
        self.prefetched: PendingCollective | None = None
        self.missing = 0  # gradients still to accumulate in this backward

    def states(self) -> list[UnitState]:
        """The states this unit entered, in order (staying in a state is not a new entry)."""
        path = [self.history[0][1]] if self.history else [self.state]
        path += [after for _, before, after in self.history if after is not before]
        return path

    def _move(self, event: Event) -> UnitState:
        """Check ``event`` against the table, record it and enter the next state; return the
        state it left."""
        before = self.state
        after = TRANSITIONS.get((before, event))
        if after is None:
            recent = ", ".join(f"{e.name}: {b.name} -> {a.name}" for e, b, a in self.history[-4:])
            raise UnitLifecycleError(
                f"FSDP unit {self.unit.index}: {event.name} ({event.value}) cannot happen in "
                f"state {before.name} ({before.value}); last transitions: {recent or 'none'}. "
                "This is a bug in dtlab's FSDP hooks, or the model uses this unit's parameters "
                "outside the unit's forward."
            )
        self.state = after
        self.history.append((event, before, after))
        return before

    def _gathered_from(self, before: UnitState) -> None:
        """Make sure ``flat`` holds the whole parameters: wait for a prefetch, or gather now."""
        if before is S.PREFETCHING:
            if self.prefetched is not None:
                self.prefetched.wait()
                self.prefetched = None
        elif before not in _GATHERED:
            self.unit.launch_gather(async_op=False)

    # -- events ----------------------------------------------------------------------------------
    def on_step_start(self) -> None:
        self._move(E.STEP_START)
        self.missing = self.unit.gradient_count

    def on_prefetch(self) -> None:
        """A hint: only a unit at rest in SHARDED launches its all-gather; others ignore it."""
        if self.state is not S.SHARDED:
            return
        self._move(E.PREFETCH)
        self.prefetched = self.unit.launch_gather(async_op=True)

    def on_forward_start(self) -> None:
        self._gathered_from(self._move(E.FORWARD_START))
        self.unit.register(sharded=False)

    def on_forward_end(self) -> None:
        self._move(E.FORWARD_END)
        self.unit.register(sharded=True)
        self.unit.free()

    def on_recompute_start(self) -> None:
        self._gathered_from(self._move(E.RECOMPUTE_START))
        self.unit.register(sharded=False)

    def on_recompute_end(self) -> None:
        self._move(E.RECOMPUTE_END)  # keep everything: a checkpoint inside may re-run its body

    def on_grad_at_output(self) -> None:
        before = self._move(E.GRAD_AT_OUTPUT)
        if self.state is S.GATHERED_FOR_BACKWARD:
            # A block that checkpoints its own body re-runs it during this backward without any
            # event of the unit, reading whatever its modules hold: they must hold the gathered
            # parameters from here until the gradients are reduced.
            self._gathered_from(before)
            self.unit.register(sharded=False)

    def on_gradient(self, sync: bool) -> None:
        """One hooked parameter's gradient accumulated; the last one is ALL_GRADIENTS."""
        self.missing -= 1
        if self.missing == 0:
            self.on_all_gradients(sync)

    def on_all_gradients(self, sync: bool) -> None:
        """Reduce (``sync``) or keep the unit's gradients; free it; register the shards."""
        self._gathered_from(self._move(E.ALL_GRADIENTS))
        self.unit.launch_reduction(sync=sync)
        self.unit.register(sharded=True)

    def on_backward_end(self) -> None:
        self._move(E.BACKWARD_END)
        self.unit.finish_reduction()
        self.unit.free()
        self.unit.register(sharded=True)


class FSDPLifecycle:
    """Every unit's machine plus what they share: the phase of the step, prefetch and ``sync``.

    The wrapper's hooks call one method each. ``end_of_backward`` is queued on the autograd
    engine when the first gradient reaches a unit's output (it must call :meth:`backward_end`).
    """

    def __init__(
        self, units: list[FSDPUnit], prefetch: bool, end_of_backward: Callable[[], None]
    ) -> None:
        self.units = [UnitLifecycle(u) for u in units]
        self.prefetch = prefetch
        self.sync = True  # False inside the wrapper's no_sync(): reductions are kept, not sent
        self.in_backward = False
        self._end_of_backward = end_of_backward

    def _prefetch(self, index: int) -> None:
        if self.prefetch and 0 <= index < len(self.units):
            self.units[index].on_prefetch()

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
            self._prefetch(index + 1)

    def forward_end(self, index: int) -> bool:
        """Returns whether the gradients of the unit's outputs are to be watched
        (:meth:`grad_at_output`): in a forward with gradients, not in a re-run."""
        if self.in_backward:
            self.units[index].on_recompute_end()
            return False
        self.units[index].on_forward_end()
        return torch.is_grad_enabled()

    def grad_at_output(self, index: int) -> None:
        if not self.in_backward:
            self.in_backward = True
            queue_end_of_backward(self._end_of_backward)
        machine = self.units[index]
        machine.on_grad_at_output()
        if machine.state is S.GATHERED_FOR_BACKWARD:  # backward runs the units in reverse
            self._prefetch(len(self.units) - 1 if index == 0 else index - 1)

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
