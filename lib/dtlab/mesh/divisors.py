"""Every divisor of a number, and how a rule names a list of them as the choices left.

A layout rule says what to choose instead — ``tp=3 does not divide 8 attention heads; choose 1,
2, 4 or 8`` — so every rule in :mod:`~dtlab.mesh.layout_rules` needs the divisors of what it
cuts and one way of listing them. It stands alone, below the rules, because it is arithmetic,
not a rule: :mod:`~dtlab.mesh.mesh` needs the divisors without any rule.
:mod:`~dtlab.mesh.layout_rules` re-exports both names.
"""

from __future__ import annotations


def divisors(n: int) -> list[int]:
    """Every positive divisor of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def choices(options: list[int]) -> str:
    """[1, 2, 4, 8] → '1, 2, 4 or 8'."""
    words = [str(o) for o in options]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
