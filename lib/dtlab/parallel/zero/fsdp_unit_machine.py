"""One FSDP unit's state machine: each event checked against the transition table, then done.

:class:`UnitLifecycle` walks the diagram drawn in :mod:`~dtlab.parallel.zero.fsdp_lifecycle`
for one unit: one method per event. Each transition is looked up in
:data:`~dtlab.parallel.zero.fsdp_states.TRANSITIONS` for the current state (an impossible event
raises :class:`UnitLifecycleError` naming the unit, the state, the event and the unit's last
transitions; a prefetch hint to a unit not at rest is ignored), appended to ``history``, and
followed by what it means for the unit's :class:`~dtlab.parallel.zero.fsdp_unit.FSDPUnit`: wait
for a prefetch or gather now, register, free, launch or finish the reduce-scatter.

It stands alone because a unit's machine knows nothing of the other units: what they share
(the phase of the step, prefetch depth, ``sync``, the peak of gathered bytes) is
:class:`~dtlab.parallel.zero.fsdp_lifecycle.FSDPLifecycle`'s, which drives one of these per
unit and re-exports both names.
"""

from __future__ import annotations

from dtlab.comm import PendingCollective
from dtlab.parallel.zero.fsdp_states import GATHERED_STATES, TRANSITIONS, E, Event, S, UnitState
from dtlab.parallel.zero.fsdp_unit import FSDPUnit


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
        elif before not in GATHERED_STATES:
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

    def on_forward_end(self, keep: bool = False) -> None:
        """Free the gathered parameters, or with ``keep`` (``reshard_after_forward=False`` in a
        forward with gradients) hold them until backward, which then gathers nothing."""
        if keep and self.state is S.GATHERED_FOR_FORWARD:
            self._move(E.FORWARD_END_KEEP)
            self.unit.register(sharded=True)
            return
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
