"""A small, widget-free API for the ``dtlab`` CLI (and a future terminal drill).

from dtlab import quiz
for item in quiz.items_for("setup"):
    print(quiz.item_as_text(item))
    result = quiz.attempt(item.id, input("> "))    # graded and recorded
    print(result.feedback)
"""

from __future__ import annotations

from pathlib import Path

from dtlab.quiz.bank import Bank, cached_bank, load_bank
from dtlab.quiz.grading import grade
from dtlab.quiz.progress import record_attempt
from dtlab.quiz.schema import Grade, Item


def _bank(bank: Bank | str | Path | None) -> Bank:
    if isinstance(bank, Bank):
        return bank
    return cached_bank() if bank is None else load_bank(bank)


def topics(bank: Bank | str | Path | None = None) -> list[str]:
    """Every topic in the bank, in file order."""
    return _bank(bank).topics()


def items_for(
    topic: str, bank: Bank | str | Path | None = None, difficulty: str | None = None
) -> list[Item]:
    """The items of one topic, easiest first (optionally a single difficulty)."""
    return _bank(bank).items_for(topic, difficulty)


def get_item(item_id: str, bank: Bank | str | Path | None = None) -> Item:
    """One item by id (a KeyError suggests close ids)."""
    return _bank(bank)[item_id]


def attempt(
    item_id: str,
    response: object,
    *,
    bank: Bank | str | Path | None = None,
    learner: str | None = None,
    progress_path: str | Path | None = None,
    record: bool = True,
) -> Grade:
    """Grade one response and append it to the progress file; AnswerError for a bad shape."""
    chosen = _bank(bank)
    item = chosen[item_id]
    result = grade(item, response)
    if record:
        record_attempt(
            item=item.id,
            topic=item.topic,
            kind=item.kind,
            correct=result.correct,
            score=result.score,
            bank_version=chosen.version,
            learner=learner,
            path=progress_path,
        )
    return result


def item_as_text(item: Item) -> str:
    """The question as plain text for a terminal, with how to answer it."""
    lines = [f"[{item.id} · {item.difficulty}]", item.prompt, ""]
    if item.kind in ("choice", "multi"):
        lines += [f"  ({c.key}) {c.text}" for c in item.choices]
        lines.append(
            "Answer with one key."
            if item.kind == "choice"
            else "Answer with every right key, e.g. 'a c'."
        )
    elif item.kind == "numeric":
        lines.append(
            f"Answer with a number in {item.unit}." if item.unit else "Answer with a number."
        )
    elif item.kind == "ordering":
        lines += [f"  {s.key}: {s.text}" for s in item.steps]
        lines.append(
            "Answer with the keys in order, e.g. '" + " ".join(s.key for s in item.steps) + "'."
        )
    elif item.kind == "short":
        lines.append("Answer out loud, then tick the rubric points you made.")
    else:
        lines.append(
            f"A coding exercise: run check_exercise({item.exercise!r}, your_fn) in the lab."
        )
    return "\n".join(lines)
