"""Reading a typed number like ``"1.12e12"``, ``"1,024"`` or ``"1.5 TB"`` in a question's unit.

Accepted: a plain number (taken to be in the item's unit), or a number followed by the item's
unit, or by the same base unit with another SI prefix (k M G T P E, m u µ n) or IEC prefix
(Ki Mi Gi Ti Pi Ei). Base units: B (bytes), bit, s, FLOP, FLOPs, FLOP/s, B/s, bit/s, Hz,
params, tokens; ``%`` and ``x`` only as themselves. So for a question asked in GB, ``"1.5 TB"``
reads as 1500 and ``"1 GiB"`` as 1.073741824 — but ``"3 s"`` is an :class:`AnswerError`.
"""

from __future__ import annotations

import math
import numbers
import re

from dtlab.quiz.schema import AnswerError

BASE_UNITS = ("B", "bit", "s", "FLOP", "FLOPs", "FLOP/s", "B/s", "bit/s", "Hz", "params", "tokens")
UNPREFIXED_UNITS = ("%", "x")
SYNONYMS = {
    "bytes": "B",
    "byte": "B",
    "bits": "bit",
    "sec": "s",
    "param": "params",
    "token": "tokens",
}
PREFIXES = {
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
    "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "m": 1e-3, "u": 1e-6, "µ": 1e-6, "μ": 1e-6, "n": 1e-9,
}  # fmt: skip

_NUMBER = re.compile(r"^\s*([+-]?(?:\d[\d_,]*(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(.*?)\s*$")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?([eE][+-]?\d+)?$")


def split_unit(unit: str) -> tuple[float, str] | None:
    """``"GiB"`` -> ``(2**30, "B")``; ``"%"`` -> ``(1, "%")``; None when not understood."""
    unit = SYNONYMS.get(unit, unit)
    if unit in BASE_UNITS or unit in UNPREFIXED_UNITS or unit == "":
        return 1.0, unit
    for prefix in sorted(PREFIXES, key=len, reverse=True):
        if unit.startswith(prefix):
            rest = SYNONYMS.get(unit[len(prefix) :], unit[len(prefix) :])
            if rest in BASE_UNITS:
                return PREFIXES[prefix], rest
    return None


def _example(unit: str) -> str:
    return f"'1.5 {unit}' or just '1.5'" if unit else "a plain number such as '1.5' or '2e9'"


def parse_number(response: object, unit: str = "") -> float:
    """The response as a number in ``unit``; :class:`AnswerError` if it is not one."""
    if isinstance(response, bool) or not isinstance(response, (numbers.Real, str)):
        raise AnswerError(
            f"expected a number, got {type(response).__name__}; answer with {_example(unit)}"
        )
    if isinstance(response, numbers.Real):
        value = float(response)
    else:
        match = _NUMBER.match(response)
        if not match:
            raise AnswerError(
                f"could not read {response!r} as a number; answer with {_example(unit)}"
            )
        digits, given_unit = match.groups()
        if "," in digits and not _THOUSANDS.match(digits):
            raise AnswerError(f"{digits!r}: use '.' for decimals (commas only between thousands)")
        value = float(digits.replace(",", "").replace("_", ""))
        if given_unit and given_unit != unit:
            value *= _conversion(given_unit, unit, response)
    if not math.isfinite(value):
        raise AnswerError(f"{response!r} is not a finite number")
    return value


def _conversion(given: str, wanted: str, response: str) -> float:
    if not wanted:
        raise AnswerError(f"{response!r}: this answer is a plain number without a unit")
    given_parts, wanted_parts = split_unit(given), split_unit(wanted)
    if given_parts is None or wanted_parts is None:
        raise AnswerError(
            f"unit {given!r} not understood; answer in {wanted}, e.g. {_example(wanted)}"
        )
    if given_parts[1] != wanted_parts[1]:
        raise AnswerError(f"{response!r} is in {given}, but the question asks for {wanted}")
    return given_parts[0] / wanted_parts[0]


def slip_hint(response: float, key: float) -> str:
    """Name the classic slip when a wrong number is a telltale factor away from the key."""
    if key == 0 or response == 0:
        return ""
    ratio = response / key
    for k in range(1, 5):
        if math.isclose(ratio, 1.024**k, rel_tol=1e-3) or math.isclose(
            ratio, 1.024**-k, rel_tol=1e-3
        ):
            return "Your number is off by 1.024^k: GB (10^9 bytes) vs GiB (2^30 bytes)?"
    hints = {
        8.0: "Off by a factor of 8: bits vs bytes?",
        2.0: "Off by a factor of 2: something counted once that happens twice, or the reverse?",
        1e3: "Off by 1000: check the unit prefix.",
        1e6: "Off by a million: check the unit prefix.",
        1e9: "Off by a billion: check the unit prefix.",
    }
    for factor, hint in hints.items():
        if math.isclose(ratio, factor, rel_tol=1e-3) or math.isclose(
            ratio, 1 / factor, rel_tol=1e-3
        ):
            return hint
    return ""
