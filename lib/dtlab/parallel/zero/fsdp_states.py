"""The states, events and transition table of one FSDP unit's lifecycle.

The data of the state machine whose diagram, rules and driver are
:mod:`~dtlab.parallel.zero.fsdp_lifecycle` (read that first): :class:`UnitState` (where a unit's
parameters are), :class:`Event` (what the wrapper's hooks report) and :data:`TRANSITIONS`, every
possible (state, event) and the state it leads to — anything else is impossible and raises.
"""

from __future__ import annotations

import enum


class UnitState(enum.Enum):
    """Where one unit's parameters are and what its gradients are doing."""

    SHARDED = "shards registered, nothing gathered; gradients not reduced this step"
    PREFETCHING = "all-gather in flight (launched early to overlap compute); shards registered"
    GATHERED_FOR_FORWARD = "whole parameters gathered and registered for the forward"
    GATHERED_FOR_BACKWARD = "whole parameters gathered and registered until gradients reduce"
    REDUCING = "gradients handed to the reduce-scatter (or kept under no_sync); freed"
    REDUCED = "averaged gradients in .grad; at rest until the next training forward"
    GATHERED_BETWEEN_STEPS = "gathered for a no-grad forward after the step's backward"
    KEPT_FOR_BACKWARD = "forward done, whole parameters kept for backward (no reshard)"


class Event(enum.Enum):
    """What the wrapper's hooks report about a unit."""

    STEP_START = "a training forward of the wrapper begins"
    PREFETCH = "a neighbour started: fetch this unit early if it is at rest"
    FORWARD_START = "the unit's forward begins"
    FORWARD_END = "the unit's forward returned"
    FORWARD_END_KEEP = "the unit's forward returned; keep it gathered (reshard_after_forward=False)"
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
    # reshard_after_forward=False: stay gathered until backward has used the parameters
    (S.GATHERED_FOR_FORWARD, E.FORWARD_END_KEEP): S.KEPT_FOR_BACKWARD,
    (S.KEPT_FOR_BACKWARD, E.FORWARD_START): S.GATHERED_FOR_FORWARD,  # run twice in a forward
    (S.KEPT_FOR_BACKWARD, E.GRAD_AT_OUTPUT): S.GATHERED_FOR_BACKWARD,
    (S.KEPT_FOR_BACKWARD, E.RECOMPUTE_START): S.GATHERED_FOR_BACKWARD,
    (S.KEPT_FOR_BACKWARD, E.ALL_GRADIENTS): S.REDUCING,
    (S.KEPT_FOR_BACKWARD, E.STEP_START): S.GATHERED_FOR_FORWARD,
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

GATHERED_STATES = (
    S.GATHERED_FOR_FORWARD,
    S.GATHERED_FOR_BACKWARD,
    S.GATHERED_BETWEEN_STEPS,
    S.KEPT_FOR_BACKWARD,
)
