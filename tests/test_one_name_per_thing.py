"""One name for the communication layer and one for its statistics (DESIGN: one name per thing).

The layer is :class:`dtlab.comm.Communicator` — an instance is ``comm``, a dict of them
``communicators`` — and what it counted is a :class:`~dtlab.collectives.stats.CommStats`, read as
``.comm_stats`` on a communicator and on every wrapper that owns one (DDP, ZeRO, FSDP), and from
:func:`dtlab.collectives.comm_stats` for the counted rings of this process. The data-parallel
group's communicator is a plain ``Communicator(group, collectives, dim="dp")``, not a class of
its own. The text of the library, the tests, the lab sources and README is read for the old
names, so none creeps back.
"""

from __future__ import annotations

import re
from pathlib import Path

from dtlab.comm import Communicator

REPO = Path(__file__).resolve().parents[1]
OLD_NAMES = {
    r"\bDataParallelComm\b": "a Communicator on the dp group: Communicator(group, collectives, "
    'dim="dp")',
    r"\bcomms\b": "communicators",
    r"\b\w*comm\w*\.stats\b": "<communicator>.comm_stats",
    r"\.communicators\(\)": ".communicators (a property: every communicator, by group)",
}


def _texts():
    paths = [
        *(REPO / "lib" / "dtlab").rglob("*.py"),
        *(REPO / "tests").glob("*.py"),
        *(REPO / "solutions").glob("*.py"),
        REPO / "README.md",
        *(REPO / "quizzes").glob("*.yaml"),
    ]
    this = Path(__file__).resolve()
    return [(p, p.read_text(encoding="utf-8")) for p in paths if p.resolve() != this]


def test_no_old_name_for_the_communicator_or_its_statistics_is_left():
    found = [
        f"{path.relative_to(REPO)}:{text.count(chr(10), 0, match.start()) + 1}: "
        f"{match.group(0)!r} → {instead}"
        for path, text in _texts()
        for pattern, instead in OLD_NAMES.items()
        for match in re.finditer(pattern, text)
    ]
    assert not found, "\n".join(found)


def test_a_communicator_keeps_its_counts_in_comm_stats():
    names = Communicator.__init__.__code__.co_names
    assert "comm_stats" in names and "stats" not in names
