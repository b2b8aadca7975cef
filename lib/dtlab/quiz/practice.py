"""A small, widget-free API for the ``dtlab`` CLI and scripts.

from dtlab import quiz
for item in quiz.items_for("setup"):
    order = quiz.shown_order(item)                           # shuffled for this learner
    print(quiz.item_as_text(item, order))
    result = quiz.attempt(item.id, input("> "), order=order)  # graded and recorded
    print("right" if result.correct else f"{result.score:.0%} right")

Options are shown shuffled and labelled by position (:mod:`dtlab.quiz.shuffle`); ``attempt``
with ``order`` reads the labels the learner typed, without it option keys (identity).
"""

from __future__ import annotations

from pathlib import Path

from dtlab.quiz.bank import Bank, cached_bank, load_bank
from dtlab.quiz.grading import grade
from dtlab.quiz.progress import option_fields, record_attempt
from dtlab.quiz.schema import Grade, Item
from dtlab.quiz.shuffle import OptionOrder, option_order, shuffle_learner


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
    order: OptionOrder | None = None,
) -> Grade:
    """Grade one response and append it to the progress file; AnswerError for a bad shape.

    With ``order`` (what :func:`item_as_text` showed) a choice/multi response is in displayed
    labels and is turned into option keys first; without it, it is option keys.
    """
    chosen = _bank(bank)
    item = chosen[item_id]
    if order is not None:
        response = order.to_keys(item.kind, response)
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
            **option_fields(item, response, order),
        )
    return result


def shown_order(item: Item, learner: str | None = None, attempt: int = 0) -> OptionOrder:
    """The order ``item``'s options are shown to ``learner`` (a name, or None: this machine's
    learner) on their ``attempt``-th try; see :mod:`dtlab.quiz.shuffle`."""
    return option_order(item, shuffle_learner(learner), attempt)


def item_as_text(item: Item, order: OptionOrder | None = None) -> str:
    """The question as plain text for a terminal, with how to answer it.

    Options and steps are listed in ``order`` (default: :func:`shown_order` for this machine's
    learner, first attempt), choice/multi options labelled by displayed position.
    """
    order = order if order is not None else shown_order(item)
    lines = [f"[{item.id} · {item.difficulty}]", item.prompt, ""]
    if item.kind in ("choice", "multi"):
        text = {c.key: c.text for c in item.choices}
        lines += [f"  ({order.label(k)}) {text[k]}" for k in order.keys]
        lines.append(
            "Answer with one letter."
            if item.kind == "choice"
            else "Answer with every right letter, e.g. 'a c'."
        )
    elif item.kind == "numeric":
        lines.append(
            f"Answer with a number in {item.unit}." if item.unit else "Answer with a number."
        )
    elif item.kind == "ordering":
        text = {s.key: s.text for s in item.steps}
        lines += [f"  {k}: {text[k]}" for k in order.keys]
        lines.append("Answer with the keys in order, e.g. '" + " ".join(order.keys) + "'.")
    elif item.kind == "short":
        lines.append("Answer out loud, then tick the rubric points you made.")
    else:
        lines.append(
            f"A coding exercise: run check_exercise({item.exercise!r}, your_fn) in the lab."
        )
    return "\n".join(lines)
