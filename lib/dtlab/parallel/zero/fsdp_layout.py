"""Which FSDP unit owns which parameter, and the casts at a unit's boundary.

A parameter belongs to the *innermost* unit whose module contains it (FSDP2's rule when
``fully_shard`` is applied to a block and to a norm inside it); everything no unit claims belongs
to the root unit, the wrapped model itself. A weight tied between two units cannot be sharded
with both: the error says to put both users in one unit.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dtlab.precision.mixed_precision import MixedPrecision

Slot = tuple[nn.Module, str]
Owned = list[tuple[nn.Parameter, list[Slot]]]


def default_units(module: nn.Module) -> list[nn.Module]:
    """Every element of every ``nn.ModuleList`` (the transformer blocks of a typical model)."""
    return [m for child in module.modules() if isinstance(child, nn.ModuleList) for m in child]


def assign_units(
    module: nn.Module,
    units: list[nn.Module] | None,
    shard: Callable[[str, nn.Parameter], bool],
) -> list[tuple[nn.Module, Owned, Owned]]:
    """``(unit module, sharded, replicated)`` per unit, the root first, then in module order.

    ``sharded`` and ``replicated`` list each trainable parameter once with every
    ``(module, attribute)`` slot it is registered in (a tied weight has two).
    """
    units = default_units(module) if units is None else list(units)
    names = {id(m): name for name, m in module.named_modules()}
    for unit in units:
        if id(unit) not in names:
            raise ValueError(
                f"unit {type(unit).__name__} is not a submodule of the wrapped model; pass "
                "modules of the model itself (e.g. list(model.blocks))"
            )
    unit_ids = {id(u) for u in units} | {id(module)}
    owned: dict[int, list[nn.Module]] = {}
    order: list[nn.Module] = []
    seen: set[int] = set()

    def walk(m: nn.Module, owner: nn.Module) -> None:
        if id(m) in seen:
            return
        seen.add(id(m))
        if id(m) in unit_ids:
            owner = m
            order.append(m)
        owned.setdefault(id(owner), []).append(m)
        for child in m.children():
            walk(child, owner)

    walk(module, module)
    result, owner_of = [], {}
    for unit in order:
        slots: dict[int, list[Slot]] = {}
        params: dict[int, tuple[str, nn.Parameter]] = {}
        for m in owned.get(id(unit), []):
            for attr, p in m._parameters.items():
                if p is None or not p.requires_grad:
                    continue
                if owner_of.setdefault(id(p), id(unit)) != id(unit):
                    raise ValueError(
                        f"parameter {names[id(m)]}.{attr} is shared by two units (tied weights?); "
                        "put both users in one unit or leave the weight to the root unit"
                    )
                slots.setdefault(id(p), []).append((m, attr))
                params.setdefault(id(p), (_join(names[id(m)], attr), p))
        sharded = [(p, slots[key]) for key, (name, p) in params.items() if shard(name, p)]
        replicated = [(p, slots[key]) for key, (name, p) in params.items() if not shard(name, p)]
        result.append((unit, sharded, replicated))
    return result


def _join(prefix: str, attr: str) -> str:
    return f"{prefix}.{attr}" if prefix else attr


def tensors_in(output) -> list[torch.Tensor]:
    """Every tensor in a (nested) output of tuples, lists and dicts."""
    if torch.is_tensor(output):
        return [output]
    if isinstance(output, (list, tuple)):
        return [t for o in output for t in tensors_in(o)]
    if isinstance(output, dict):
        return [t for o in output.values() for t in tensors_in(o)]
    return []


def cast_inputs(value, policy: MixedPrecision | None, dtype: torch.dtype | None = None):
    """``value`` with its floating tensors cast to ``dtype`` (default: the policy's compute dtype,
    when the policy asks for input casting); other values pass through unchanged."""
    if dtype is None:
        if policy is None or not policy.cast_forward_inputs or policy.param_dtype is None:
            return value  # FSDP2 casts inputs only to a param_dtype it was given
        dtype = policy.param_dtype
    if torch.is_tensor(value):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(cast_inputs(v, policy, dtype) for v in value)
    if isinstance(value, list):
        return [cast_inputs(v, policy, dtype) for v in value]
    if isinstance(value, dict):
        return {k: cast_inputs(v, policy, dtype) for k, v in value.items()}
    return value
