"""One line of a ``dtlab doctor`` report, shared by the environment and the network checks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Check:
    """One line of the report. ``ok`` False + ``essential`` True makes ``dtlab doctor`` fail."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    essential: bool = True
    checked: bool = True  # False: could not be checked on this machine (reported as n/a)
