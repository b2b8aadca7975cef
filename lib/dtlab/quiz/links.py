"""Check that every quiz item's ``link`` lands on a real lab section, and its ``see`` on a real symbol.

Two kinds of pointer (see ``quizzes/README.md``):

``link: lab:NN#anchor`` — where the idea is *taught*; the hint after a miss sends the learner there.
    Lab ``NN``'s source ``solutions/NN_*.py`` must exist (exactly one file), and one of its
    **markdown** cells must define ``anchor``, either

    * as a heading (``# ## 3. Ring all-reduce``) whose slug is the anchor: the heading text,
      HTML tags removed, lowercased, every run of characters other than ``a-z`` and ``0-9`` turned into one ``-``,
      leading and trailing dashes stripped — ``"3. Ring all-reduce"`` → ``3-ring-all-reduce``,
      ``"ZeRO & FSDP"`` → ``zero-fsdp``; or
    * as an explicit ``<a id="anchor"></a>`` (or ``name="anchor"``) placed in the markdown, for a
      stable anchor that survives rewording the heading.

``see: dtlab.module:attribute`` — optional: the library function that computes the idea, the
    hint's second pointer. The module imports and the attribute path (dots allowed) exists.

A library symbol in ``link`` is refused (issue 28): a function is no lesson, so the hint must reach
the lab section first; the message says to move the symbol to ``see``. Loading refuses it already
(:mod:`dtlab.quiz.parse`); :class:`LinkResolver` says the same for an item built without loading.

:func:`link_problems` checks a whole bank and returns one message per broken link, naming the
file, the item and, for a missing anchor, the anchors the lab does have (closest first), so a
broken link is fixed in one edit. :func:`quiz_cell_problems` does the reverse check: every
``ask("id")`` and ``check_exercise("id", ...)`` in a lab source names an item or exercise that
exists.

Lab sources are read by :mod:`dtlab.workshop.source`, which sits below the quiz: the quiz's
links point into lab sources, never the other way round.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

from dtlab.quiz.bank import Bank
from dtlab.workshop.source import explicit_anchors, read_lab_source

_LAB_LINK = re.compile(r"^lab:(?P<lab>\d{2})#(?P<anchor>[a-z0-9]+(?:-[a-z0-9]+)*)$")
_HEADING = re.compile(r"^#{1,6}\s+(?P<text>.+?)\s*#*\s*$")
_HTML_TAG = re.compile(r"<[^>]*>")


def slugify(heading: str) -> str:
    """The anchor of a heading: lowercase, non-alphanumeric runs → ``-``, no edge dashes.

    >>> slugify("3. Ring all-reduce — by hand!")
    '3-ring-all-reduce-by-hand'
    """
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


def markdown_anchors(markdown: str) -> list[str]:
    """The anchors one markdown text defines: heading slugs and explicit ``<a id=...>`` tags."""
    anchors = []
    in_fence = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        heading = None if in_fence else _HEADING.match(line)
        slug = slugify(_HTML_TAG.sub("", heading["text"])) if heading else ""
        if slug:
            anchors.append(slug)
        anchors += explicit_anchors(line)
    return anchors


def lab_source_for(lab: str, solutions_dir: Path) -> Path | None:
    """The single ``solutions/NN_*.py`` of lab ``NN``, or None when there is none."""
    matches = sorted(solutions_dir.glob(f"{lab}_*.py"))
    return matches[0] if len(matches) == 1 else None


def lab_anchors(source: Path) -> list[str]:
    """Every anchor the markdown cells of a lab source define, in order."""
    lab = read_lab_source(source)
    return [
        a
        for cell in lab.cells
        if cell.cell_type == "markdown"
        for a in markdown_anchors(cell.source)
    ]


def default_solutions_dir() -> Path:
    """The repository's ``solutions/`` folder (next to ``quizzes/``)."""
    from dtlab.quiz.bank import default_quiz_dir

    return default_quiz_dir().parent / "solutions"


@dataclass
class LinkResolver:
    """Resolves links against one ``solutions/`` folder, reading each lab source once."""

    solutions_dir: Path

    def __post_init__(self) -> None:
        self.solutions_dir = Path(self.solutions_dir)
        self._anchors: dict[str, tuple[Path | None, list[str]]] = {}

    def _lab(self, lab: str) -> tuple[Path | None, list[str]]:
        if lab not in self._anchors:
            source = lab_source_for(lab, self.solutions_dir)
            self._anchors[lab] = (source, lab_anchors(source) if source else [])
        return self._anchors[lab]

    def problem(self, link: str) -> str | None:
        """Why ``link`` does not land on a lab section, or None when it does."""
        if link.startswith("lab:"):
            return self._lab_link_problem(link)
        if link.startswith("dtlab"):
            return (
                f"link {link!r} is a library symbol; 'link' must name the lab section that teaches "
                f"the idea ('lab:NN#anchor'): move the symbol to 'see: {link}'"
            )
        return f"link {link!r} is not of the form 'lab:NN#anchor'"

    def _lab_link_problem(self, link: str) -> str | None:
        parsed = _LAB_LINK.match(link)
        if parsed is None:
            return (
                f"link {link!r} is not of the form 'lab:NN#anchor' (two digits, then a slug of "
                "lowercase letters, digits and single dashes)"
            )
        lab, anchor = parsed["lab"], parsed["anchor"]
        source, anchors = self._lab(lab)
        if source is None:
            found = sorted(p.name for p in self.solutions_dir.glob(f"{lab}_*.py"))
            if found:
                return f"link {link!r}: lab {lab} has several sources {found}; keep one"
            return f"link {link!r}: there is no lab {lab} (no {self.solutions_dir.name}/{lab}_*.py)"
        if anchor in anchors:
            return None
        close = difflib.get_close_matches(anchor, anchors, n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        return (
            f"link {link!r}: {source.parent.name}/{source.name} has no section {anchor!r} "
            f'(add a heading whose slug is {anchor!r} or an <a id="{anchor}"></a> to a '
            f"markdown cell){hint}"
        )


def symbol_problem(symbol: str, field: str = "see") -> str | None:
    """Why ``dtlab.module:attr`` does not import, or None when it does."""
    module_name, _, attribute = symbol.partition(":")
    try:
        target = importlib.import_module(module_name)
        for part in filter(None, attribute.split(".")):
            target = getattr(target, part)
    except (ImportError, AttributeError) as error:
        return f"{field} {symbol!r} does not resolve ({error})"
    return None


def link_problems(bank: Bank, solutions_dir: str | Path | None = None) -> list[str]:
    """One message per item whose link is not a real lab section or whose ``see`` does not import,
    naming its file and id; [] when all land."""
    resolver = LinkResolver(Path(solutions_dir) if solutions_dir else default_solutions_dir())
    problems = []
    for item in bank.values():
        for problem in (resolver.problem(item.link), item.see and symbol_problem(item.see)):
            if problem:
                problems.append(f"{item.file}: item {item.id!r}: {problem}")
    return problems


def quiz_calls(source_text: str) -> list[tuple[str, str, int]]:
    """``(function, id, line)`` for every ``ask("id")`` / ``check_exercise("id", ...)`` call."""
    calls = []
    for node in ast.walk(ast.parse(source_text)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        first = node.args[0]
        if name in ("ask", "check_exercise") and isinstance(first, ast.Constant):
            calls.append((name, str(first.value), node.lineno))
    return sorted(calls, key=lambda call: call[2])


def quiz_cell_problems(
    bank: Bank, solutions_dir: str | Path | None = None, exercises: set[str] | None = None
) -> list[str]:
    """Every quiz cell in the lab sources names a bank item, every grading call an exercise."""
    from dtlab.quiz.exercises import known_exercises

    folder = Path(solutions_dir) if solutions_dir else default_solutions_dir()
    exercises = set(known_exercises()) if exercises is None else exercises
    problems = []
    for source in sorted(folder.glob("[0-9][0-9]_*.py")):
        for function, item_id, line in quiz_calls(source.read_text()):
            where = f"{folder.name}/{source.name}:{line}"
            if function == "ask" and item_id not in bank:
                close = difflib.get_close_matches(item_id, list(bank), n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                problems.append(f"{where}: ask({item_id!r}) names no item in the bank{hint}")
            if function == "check_exercise" and item_id not in exercises:
                problems.append(
                    f"{where}: check_exercise({item_id!r}, ...) names no registered exercise"
                )
    return problems
