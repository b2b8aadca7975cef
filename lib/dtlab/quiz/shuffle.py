"""The order a learner sees an item's options in: shuffled per learner and attempt, reproducibly.

Issue 28: the bank was written with the right option first in 111 of 115 ``choice`` items, and
every place that shows options showed them in written order under their written keys, so "pick
(a)" scored 96 %. Now every display — the notebook cell (:mod:`dtlab.quiz.inputs`), the terminal
drill (:mod:`dtlab.cli.drill`), the practice API (:func:`dtlab.quiz.practice.item_as_text`) —
asks :func:`option_order` for the order and the labels:

* **The order** is a permutation of the item's option keys drawn from ``random.Random`` seeded
  with SHA-256 of ``(learner, item id, attempt)``. SHA-256, not ``hash()``: Python salts
  ``hash`` per process, and the order must be the same on every run, so a learner's notebook is
  reproducible and a bug report can name the order seen. A different learner or a later attempt
  gets a different order.
* **The labels** are positional — ``a``, ``b``, ``c`` … in *displayed* order — never the written
  keys (a written key says where the author put the option, which is the very thing to hide).
  :meth:`OptionOrder.key_of` turns a typed label back into the option's key, and everything past
  the display — grading, feedback, progress records — works on option keys (identity), never on
  displayed positions.

``shuffle: false`` on a ``choice``/``multi`` item keeps the written order ("All of the above",
"never … always"); the labels are still positional. ``ordering`` items are shuffled the same way,
over their steps, but never into the answer order (that would give the task away); their steps are
labelled by their own keys, which are words, not positions. Other kinds have no options.

What *attempt* counts is the caller's choice, written where it is chosen: a notebook cell counts
its *Retry* rounds from 0 (so re-running a notebook shows the same order again); the drill counts
the learner's recorded attempts at the item (so an item that comes back in a later drill is
reshuffled).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from dtlab.quiz.schema import AnswerError, Item

LABELS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class OptionOrder:
    """How one item's options are shown: ``keys`` (option or step keys) in displayed order."""

    keys: tuple[str, ...]
    positional: bool  # labels a, b, c… by displayed position (choice/multi) or the keys (ordering)

    def label(self, key: str) -> str:
        """The label shown for option ``key``."""
        if not self.positional:
            return key
        return _positional_label(self.keys.index(key))

    def labels(self) -> list[str]:
        """The labels in displayed order."""
        return [self.label(k) for k in self.keys]

    def key_of(self, label: str) -> str:
        """The option key behind a typed label (case-insensitive); AnswerError if none."""
        typed = label.strip().lower()
        for key in self.keys:
            if self.label(key).lower() == typed:
                return key
        raise AnswerError(f"{label!r} is not one of the options; choose from {self.listing()}")

    def listing(self) -> str:
        return ", ".join(self.labels())

    def to_keys(self, kind: str, response: object) -> object:
        """A response typed in displayed labels (``"b"``, ``"a c"``, ``["a", "c"]``) in option
        keys, the shape :func:`dtlab.quiz.grading.grade` reads; other kinds pass through."""
        if kind not in ("choice", "multi") or not self.positional:
            return response
        if kind == "choice":
            if not isinstance(response, str):
                raise AnswerError(f"expected one option label such as 'a', got {response!r}")
            return self.key_of(response)
        if isinstance(response, str):
            typed = re.split(r"[\s,]+", response.strip())
        elif isinstance(response, (list, tuple)):
            typed = [str(label) for label in response]
        else:
            raise AnswerError(f"expected option labels such as 'a c', got {response!r}")
        return [self.key_of(label) for label in typed if label]


def _positional_label(position: int) -> str:
    return LABELS[position] if position < len(LABELS) else str(position + 1)


def _rng(learner: str, item_id: str, attempt: int) -> random.Random:
    seed = hashlib.sha256(f"{learner}\0{item_id}\0{attempt}".encode()).digest()
    return random.Random(int.from_bytes(seed[:8], "big"))


def option_order(item: Item, learner: str, attempt: int = 0) -> OptionOrder:
    """The displayed order of ``item``'s options for ``learner``'s ``attempt`` (module docstring).

    ``learner`` is any stable string — normally the pseudonymous id of
    :func:`dtlab.quiz.progress.learner_id`. The same arguments always give the same order.
    """
    if item.kind in ("choice", "multi"):
        keys = [c.key for c in item.choices]
        if item.shuffle:
            _rng(learner, item.id, attempt).shuffle(keys)
        return OptionOrder(tuple(keys), positional=True)
    if item.kind == "ordering":
        keys = [s.key for s in item.steps]
        rng = _rng(learner, item.id, attempt)
        rng.shuffle(keys)
        while keys == list(item.answer):  # ≥ 3 steps: at most 1 in 6 draws lands here
            rng.shuffle(keys)
        return OptionOrder(tuple(keys), positional=False)
    return OptionOrder((), positional=True)


def written_order(item: Item) -> OptionOrder:
    """The options (or steps) in the order the bank lists them, labelled as :func:`option_order`
    labels them — for authors' previews and tests, never for a learner."""
    if item.kind == "ordering":
        return OptionOrder(tuple(s.key for s in item.steps), positional=False)
    return OptionOrder(tuple(c.key for c in item.choices), positional=True)


def shuffle_learner(name: str | None) -> str:
    """The string that seeds the shuffle for a learner name (or None: this machine's learner).

    The pseudonymous :func:`~dtlab.quiz.progress.learner_id`; when the id file cannot be written
    (a read-only home) a fixed ``"anonymous"``, so showing a question never fails on it.
    """
    from dtlab.quiz.progress import learner_id

    try:
        return learner_id(name)
    except OSError:
        return "anonymous"
