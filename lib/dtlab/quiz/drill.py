"""Interview drill: pick questions the learner most needs, run a timed mock set, score it by topic.

**Selection** (:func:`select_items`) is weighted sampling without replacement, seeded so the same
seed and history always give the same questions. An item's weight comes from its history in the
progress records (see :func:`item_weight`):

=======================  ===========================================
never attempted          ``NEW_WEIGHT`` = 2
attempted                ``1 + 3·(1 - latest score)``: 4 if the latest attempt missed, 1 if it
                         was right, in between for partial credit
=======================  ===========================================

so a missed item is four times as likely to come back as a solved one, and new material is
favoured over what is already known. Sampling uses the Efraimidis–Spirakis keys ``u^(1/w)``
(Efraimidis & Spirakis 2006, "Weighted random sampling with a reservoir"): take the ``n`` items
with the largest keys.

**Mock interview** (:func:`mock_set`): ``n`` items spread over topics as evenly as possible
(round-robin, each topic's picks weighted as above), shuffled, with a time limit of
``SECONDS_PER_ITEM`` per question unless given. :class:`MockScore` totals the results per topic;
an answer given after the deadline is shown its feedback but scores 0, as in an interview.

Code items (``kind: code``) need a cluster and are left to the labs; the drill uses the others.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from dtlab.quiz.schema import Item
from dtlab.quiz.shuffle import OptionOrder, written_order

NEW_WEIGHT = 2.0
MISSED_BONUS = 3.0
SECONDS_PER_ITEM = 90.0
TERMINAL_KINDS = ("choice", "multi", "numeric", "ordering", "short")


def item_as_markdown(item: Item, order: OptionOrder | None = None) -> str:
    """The question as Markdown for a terminal (rendered by ``rich``), with how to answer it.

    Options and steps are listed in ``order`` (:mod:`dtlab.quiz.shuffle`; None: written order),
    choice/multi options labelled by displayed position.
    """
    order = order if order is not None else written_order(item)
    lines = [f"**{item.id}** · {item.difficulty}", "", item.prompt, ""]
    if item.kind in ("choice", "multi"):
        text = {c.key: c.text for c in item.choices}
        lines += [f"- **({order.label(k)})** {text[k]}" for k in order.keys]
        lines += [
            "",
            "Answer with one letter."
            if item.kind == "choice"
            else "Answer with every right letter, e.g. `a c`.",
        ]
    elif item.kind == "numeric":
        lines.append(
            f"Answer with a number in {item.unit}." if item.unit else "Answer with a number."
        )
    elif item.kind == "ordering":
        text = {s.key: s.text for s in item.steps}
        lines += [f"- **{k}**: {text[k]}" for k in order.keys]
        lines += ["", f"Answer with the keys in order, e.g. `{' '.join(order.keys)}`."]
    elif item.kind == "short":
        lines.append("Answer out loud (or type it), then press Enter to see the rubric.")
    return "\n".join(lines)


def latest_scores(records: Iterable[dict]) -> dict[str, float]:
    """item id → the score of its most recent attempt (records ordered by ``ts``)."""
    latest: dict[str, tuple[str, float]] = {}
    for record in records:
        ts = str(record.get("ts", ""))
        if record["item"] not in latest or ts >= latest[record["item"]][0]:
            latest[record["item"]] = (ts, float(record["score"]))
    return {item: score for item, (_, score) in latest.items()}


def item_weight(latest_score: float | None) -> float:
    """Sampling weight of an item given its latest score (None: never attempted)."""
    if latest_score is None:
        return NEW_WEIGHT
    return 1.0 + MISSED_BONUS * (1.0 - min(max(latest_score, 0.0), 1.0))


def drillable(items: Iterable[Item], topic: str | None = None) -> list[Item]:
    """The items a terminal can ask (no code exercises), optionally of one topic."""
    return [i for i in items if i.kind in TERMINAL_KINDS and (topic is None or i.topic == topic)]


def _weighted_pick(items: list[Item], n: int, latest: dict[str, float], rng: random.Random):
    keyed = []
    for item in items:
        u = 1.0 - rng.random()  # in (0, 1], so the key is defined for every weight
        keyed.append((u ** (1.0 / item_weight(latest.get(item.id))), item))
    keyed.sort(key=lambda pair: pair[0], reverse=True)
    return [item for _, item in keyed[:n]]


def select_items(
    items: Iterable[Item],
    n: int,
    records: Iterable[dict] = (),
    seed: int | None = None,
    topic: str | None = None,
) -> list[Item]:
    """``n`` drillable items (fewer if the pool is smaller), favouring missed and new ones.

    Deterministic for a given ``seed``, pool and history; ``seed=None`` draws a fresh seed.
    """
    if n < 1:
        raise ValueError(f"n={n}: ask for at least one question")
    pool = drillable(items, topic)
    if not pool:
        where = f"topic {topic!r}" if topic else "the bank"
        raise ValueError(f"{where} has no questions a terminal can ask (only code exercises)")
    return _weighted_pick(pool, n, latest_scores(records), random.Random(seed))


def mock_set(
    items: Iterable[Item], n: int, records: Iterable[dict] = (), seed: int | None = None
) -> list[Item]:
    """``n`` items mixed across topics: topic counts differ by at most one, order shuffled."""
    if n < 1:
        raise ValueError(f"n={n}: a mock interview needs at least one question")
    rng = random.Random(seed)
    latest = latest_scores(records)
    by_topic: dict[str, list[Item]] = {}
    for item in drillable(items):
        by_topic.setdefault(item.topic, []).append(item)
    if not by_topic:
        raise ValueError("the bank has no questions a terminal can ask")
    # Each topic's queue is already in weighted order; deal from them round-robin.
    queues = {t: _weighted_pick(pool, len(pool), latest, rng) for t, pool in by_topic.items()}
    order = list(queues)
    rng.shuffle(order)
    chosen: list[Item] = []
    while len(chosen) < n and any(queues.values()):
        for topic in order:
            if queues[topic] and len(chosen) < n:
                chosen.append(queues[topic].pop(0))
    rng.shuffle(chosen)
    return chosen


def time_limit_for(n_items: int, seconds_per_item: float = SECONDS_PER_ITEM) -> float:
    """The mock interview's time limit: ``seconds_per_item`` per question."""
    return n_items * seconds_per_item


@dataclass(frozen=True)
class Answered:
    """One question of a drill: its item, the score that counts, and what happened."""

    item: Item
    score: float
    correct: bool
    status: str  # "answered", "late" (after the deadline: scores 0), "skipped", "unanswered"


@dataclass
class TopicScore:
    topic: str
    asked: int = 0
    correct: int = 0
    points: float = 0.0

    @property
    def percent(self) -> float:
        return 100.0 * self.points / self.asked if self.asked else 0.0


@dataclass
class MockScore:
    """Per-topic totals of a drill or mock interview."""

    results: list[Answered] = field(default_factory=list)
    interrupted: bool = False  # the learner pressed Ctrl-C (the exit status says so)

    def add(self, result: Answered) -> None:
        self.results.append(result)

    def by_topic(self) -> list[TopicScore]:
        """One :class:`TopicScore` per topic, weakest first (then by name)."""
        totals: dict[str, TopicScore] = {}
        for r in self.results:
            entry = totals.setdefault(r.item.topic, TopicScore(r.item.topic))
            entry.asked += 1
            entry.correct += int(r.correct)
            entry.points += r.score
        return sorted(totals.values(), key=lambda t: (t.percent, t.topic))

    @property
    def points(self) -> float:
        return sum(r.score for r in self.results)

    def report(self) -> str:
        """The score table a terminal prints at the end."""
        asked = len(self.results)
        lines = [f"Score: {self.points:.1f} / {asked} ({100 * self.points / max(asked, 1):.0f}%)"]
        lines.append(f"  {'topic':<16} {'right':>7} {'score':>6}")
        for t in self.by_topic():
            lines.append(f"  {t.topic:<16} {t.correct:>3}/{t.asked:<3} {t.percent:>5.0f}%")
        left = {
            status: sum(r.status == status for r in self.results)
            for status in ("skipped", "unanswered")
        }
        if any(left.values()):
            lines.append(
                f"Skipped {left['skipped']}, not reached {left['unanswered']} (each scores 0)."
            )
        missed = [r for r in self.results if not r.correct]
        if missed:
            lines.append("Review next: " + ", ".join(r.item.id for r in missed))
        return "\n".join(lines)
