"""FSDP's unit lifecycle is one state machine: the path a unit takes is the documented one.

:mod:`dtlab.parallel.zero.fsdp_lifecycle` records every transition of every unit. On two ranks,
a block unit's path through one training step — plain, under ``checkpoint(block, x)`` from
outside, with a block that checkpoints its own body, and under ``no_sync()`` — is read back and
held against the path the module docstring states; an event the table does not allow raises.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

import dtlab
from dtlab.parallel.zero import fsdp_lifecycle
from dtlab.parallel.zero.fsdp_lifecycle import (
    TRANSITIONS,
    Event,
    UnitLifecycle,
    UnitLifecycleError,
    UnitState,
)

DIM = 8


def _documented_path() -> list[str]:
    """The path the module docstring gives for one step of a block unit, prefetch on."""
    text = " ".join(fsdp_lifecycle.__doc__.split())
    found = re.search(r"One step of block unit k, prefetch on, goes (.*?) \(without", text)
    assert found, "the docstring no longer states a unit's path through one step"
    return found.group(1).split(" -> ")


PLAIN_EVENTS = [
    "STEP_START",
    "PREFETCH",  # unit 0 (the root) started its forward
    "FORWARD_START",
    "FORWARD_END",
    "PREFETCH",  # the gradient reached the next block's output
    "GRAD_AT_OUTPUT",
    "ALL_GRADIENTS",
    "BACKWARD_END",
]


class _Block(nn.Module):
    """``x + body(x)``; ``inner=True`` checkpoints the body from inside ``forward``."""

    def __init__(self, inner: bool) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)
        self.inner = inner

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inner:
            return x + checkpoint(self._body, x, use_reentrant=False)
        return x + self._body(x)


class _Net(nn.Module):
    def __init__(self, outer: bool = False, inner: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(DIM, DIM)
        self.blocks = nn.ModuleList(_Block(inner) for _ in range(2))
        self.head = nn.Linear(DIM, 4)
        self.outer = outer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=False) if self.outer else block(h)
        return self.head(h)


def _paths(scenario: str, prefetch: bool = True) -> dict:
    """One training step (two micro-batches for ``no_sync``) of a 3-unit FSDP model; the first
    block's (unit 1's) transitions, and its state whenever its body ran."""
    from dtlab.parallel import FullyShardedDataParallel

    model = _Net(outer=scenario == "outer", inner=scenario == "inner")
    fsdp = FullyShardedDataParallel(model, units=list(model.blocks), prefetch=prefetch)
    machine = fsdp.lifecycle.units[1]
    body_ran_in = []
    model.blocks[0].up.register_forward_pre_hook(lambda *_: body_ran_in.append(machine.state.name))
    x, y = torch.randn(4, DIM), torch.randn(4, 4)
    out: dict = {}
    with set_checkpoint_early_stop(False):  # a re-run runs the whole unit forward: both events
        if scenario == "no_sync":
            with fsdp.no_sync():
                F.mse_loss(fsdp(x), y).backward()
            out["unsynced_bytes"] = fsdp.unsynced_gradient_bytes()
            out["first_events"] = [e.name for e, _, _ in machine.history]
            machine.history.clear()
        F.mse_loss(fsdp(x), y).backward()
    out["events"] = [e.name for e, _, _ in machine.history]
    out["states"] = [s.name for s in machine.states()]
    out["body_ran_in"] = body_ran_in
    out["every_unit_reduced"] = all(m.state is UnitState.REDUCED for m in fsdp.lifecycle.units)
    out["blocks_hold_shards"] = all(p.dim() == 1 for b in model.blocks for p in b.parameters())
    return out


def _assert_one_step(r: dict, events: list[str]) -> None:
    assert r["states"] == _documented_path(), r
    assert r["events"] == events, r
    assert r["every_unit_reduced"] and r["blocks_hold_shards"], r


def test_a_units_path_through_one_step_is_the_documented_one(cluster2):
    for r in cluster2.run(_paths, "plain"):
        _assert_one_step(r, PLAIN_EVENTS)
        assert r["body_ran_in"] == ["GATHERED_FOR_FORWARD"], r


def test_without_prefetch_the_path_skips_prefetching(cluster2):
    expected = [s for s in _documented_path() if s != "PREFETCHING"]
    for r in cluster2.run(_paths, "plain", False):
        assert r["states"] == expected, r
        assert r["events"] == [e for e in PLAIN_EVENTS if e != "PREFETCH"], r


def test_a_checkpoint_from_outside_reruns_the_unit_inside_gathered_for_backward(cluster2):
    rerun = PLAIN_EVENTS[:6] + ["RECOMPUTE_START", "RECOMPUTE_END"] + PLAIN_EVENTS[6:]
    for r in cluster2.run(_paths, "outer"):
        _assert_one_step(r, rerun)
        assert r["body_ran_in"] == ["GATHERED_FOR_FORWARD", "GATHERED_FOR_BACKWARD"], r


def test_a_body_checkpointed_inside_the_unit_reruns_on_the_parameters_kept_gathered(cluster2):
    """No event of the unit during the body's re-run: it reads what GATHERED_FOR_BACKWARD keeps
    registered, from the gradient reaching the output until the gradients are reduced."""
    for r in cluster2.run(_paths, "inner"):
        _assert_one_step(r, PLAIN_EVENTS)
        assert r["body_ran_in"] == ["GATHERED_FOR_FORWARD", "GATHERED_FOR_BACKWARD"], r


def test_no_sync_takes_the_same_path_and_keeps_the_gradients_instead(cluster2):
    for r in cluster2.run(_paths, "no_sync"):
        assert r["first_events"] == PLAIN_EVENTS, r
        assert r["unsynced_bytes"] > 0, r
        # the synchronising step starts from REDUCED (the no_sync backward's end)
        assert r["states"] == ["REDUCED", *_documented_path()], r
        assert r["events"] == PLAIN_EVENTS, r


def _fake_unit(index: int = 3) -> SimpleNamespace:
    return SimpleNamespace(index=index, gradient_count=0)


def test_an_impossible_transition_raises_naming_the_unit_the_state_and_the_event():
    machine = UnitLifecycle(_fake_unit())
    with pytest.raises(UnitLifecycleError, match=r"unit 3: FORWARD_END .* state SHARDED"):
        machine.on_forward_end()  # a forward cannot end before it started
    assert machine.state is UnitState.SHARDED and machine.history == []
    machine.state = UnitState.REDUCING
    with pytest.raises(UnitLifecycleError, match="ALL_GRADIENTS"):
        machine.on_all_gradients(sync=True)  # a unit's gradients are reduced once per backward


def test_every_state_is_drawn_in_the_docstring_and_reachable_from_sharded():
    doc = fsdp_lifecycle.__doc__
    reached, frontier = {UnitState.SHARDED}, [UnitState.SHARDED]
    while frontier:
        state = frontier.pop()
        for (before, _event), after in TRANSITIONS.items():
            if before is state and after not in reached:
                reached.add(after)
                frontier.append(after)
    assert reached == set(UnitState)
    for name in [*UnitState.__members__, *Event.__members__]:
        assert name in doc, name


def test_the_hooks_in_fsdp_py_hold_no_unit_state():
    """Only the lifecycle reads or writes whether a unit is gathered, prefetched or reduced."""
    import inspect

    import dtlab.parallel.zero.fsdp as fsdp_module
    import dtlab.parallel.zero.fsdp_unit as unit_module

    for module in (fsdp_module, unit_module):
        source = inspect.getsource(module)
        for flag in (".gathered", ".reduced", ".prefetched", ".missing", "_in_backward", ".state"):
            assert flag not in source, (module.__name__, flag)
    assert dtlab.parallel.FullyShardedDataParallel is fsdp_module.FullyShardedDataParallel
