"""Numeric answer keys are computed by the library, never typed into the bank.

A numeric item says *how* to get its answer::

    key:
      call: dtlab.cost.bubble:bubble_fraction_of_total   # module:function, must live in dtlab
      kwargs: {stages: 4, microbatches: 8}
      scale: 100                                  # fraction -> percent (optional, default 1)
      pick: bubble                                # a field of the result (optional)

so the key moves when the formula is corrected, and a test recomputes every key in the bank.
"""

from __future__ import annotations

import importlib
import numbers
from typing import Any

from dtlab.quiz.schema import Item, NumericKey

_cache: dict[tuple[str, str], float] = {}


class KeyComputationError(RuntimeError):
    """A numeric key could not be computed (bad function path, bad arguments, non-number result)."""


def resolve_callable(path: str) -> Any:
    """Import ``"dtlab.pkg.module:attr.sub"`` and return the object it names."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name.split(".")[0] == "dtlab":
        raise KeyComputationError(f"{path!r} must look like 'dtlab.module:function'")
    try:
        target = importlib.import_module(module_name)
    except ImportError as error:
        raise KeyComputationError(
            f"cannot import {module_name!r} for key {path!r}: {error}"
        ) from error
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise KeyComputationError(
                f"{module_name!r} has no {attribute!r} (key {path!r})"
            ) from None
    return target


def _evaluate(value: Any) -> Any:
    """Compute nested ``{call: ...}`` arguments; pass everything else through."""
    if isinstance(value, dict) and "call" in value:
        return _evaluate_call(
            NumericKey(value["call"], tuple(value.get("args", ())), dict(value.get("kwargs", {})))
        )
    if isinstance(value, list):
        return [_evaluate(v) for v in value]
    if isinstance(value, dict):
        return {k: _evaluate(v) for k, v in value.items()}
    return value


def _evaluate_call(key: NumericKey) -> Any:
    function = resolve_callable(key.call)
    if not callable(function):
        raise KeyComputationError(f"{key.call!r} is not callable")
    args = [_evaluate(a) for a in key.args]
    kwargs = {name: _evaluate(v) for name, v in key.kwargs.items()}
    try:
        return function(*args, **kwargs)
    except Exception as error:
        raise KeyComputationError(
            f"{key.describe()} raised {type(error).__name__}: {error}"
        ) from error


def _pick(result: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(result, dict):
            if part not in result:
                raise KeyComputationError(f"result has no key {part!r}; it has {sorted(result)}")
            result = result[part]
        elif hasattr(result, part):
            result = getattr(result, part)
        else:
            raise KeyComputationError(f"result {type(result).__name__} has no field {part!r}")
    return result


def compute_key(item: Item) -> float:
    """The item's answer in its unit: ``scale * pick(call(*args, **kwargs))`` (cached per bank text)."""
    if item.key is None:
        raise KeyComputationError(f"item {item.id!r} is {item.kind}, not numeric")
    cache_key = (item.id, repr(item.key))
    if cache_key not in _cache:
        result = _evaluate_call(item.key)
        if item.key.pick:
            result = _pick(result, item.key.pick)
        if hasattr(result, "item") and callable(result.item):  # a 0-d tensor or numpy scalar
            result = result.item()
        if isinstance(result, bool) or not isinstance(result, numbers.Real):
            raise KeyComputationError(
                f"{item.key.describe()} returned {type(result).__name__}, not a number"
                + ("; add 'pick: <field>'" if not item.key.pick else "")
            )
        _cache[cache_key] = float(result) * item.key.scale
    return _cache[cache_key]
