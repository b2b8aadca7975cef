"""Mastery per topic, computed from progress records (``dtlab progress``, the labs' closing chart).

The definition, in two steps:

1. **Item mastery** is a recency-weighted mean of that item's attempt scores: the latest attempt
   has weight 1, the one before it ``RECENCY_DECAY`` (1/2), the one before that 1/4, and so on.
   The latest attempt therefore counts as much as all earlier ones together: a learner who
   missed an item twice and then got it right is at ``(1 + 0/2 + 0/4) / 1.75 ≈ 0.57``, and one
   more right answer lifts it to ``0.8``; a right answer followed by a miss drops to ``1/3``.
   Scores are the graded ``score`` in [0, 1], so partial credit (multi, ordering, rubric) counts.
2. **Topic mastery** is the mean item mastery over the topic's items *in the bank* — items never
   tried count as 0, so answering one question right does not make a topic "mastered". For a
   topic the bank does not know (or without a bank) the denominator is the items tried.

An item is **mastered** at item mastery ≥ ``MASTERED_AT`` (0.8). Records are ordered by their
``ts`` (ISO 8601 UTC strings sort chronologically); a record for an item no longer in the bank
is still counted under its recorded topic.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

RECENCY_DECAY = 0.5
MASTERED_AT = 0.8


def item_mastery(scores_oldest_first: list[float]) -> float:
    """Recency-weighted mean of one item's scores (latest weight 1, then 1/2, 1/4, ...)."""
    if not scores_oldest_first:
        return 0.0
    weights = [RECENCY_DECAY**age for age in range(len(scores_oldest_first))]
    newest_first = list(reversed(scores_oldest_first))
    return sum(w * s for w, s in zip(weights, newest_first, strict=True)) / sum(weights)


@dataclass(frozen=True)
class TopicMastery:
    """One topic's row of the mastery table."""

    topic: str
    mastery: float  # in [0, 1], see the module docstring
    items_total: int  # items of the topic in the bank (or tried, without a bank)
    items_tried: int
    items_mastered: int
    attempts: int
    last_attempt: str  # ISO timestamp of the latest attempt, "" if none


def scores_by_item(records: Iterable[dict]) -> dict[str, tuple[str, list[float], str]]:
    """item id → (topic, scores oldest first, latest timestamp), records ordered by ``ts``."""
    grouped: dict[str, tuple[str, list[float], str]] = {}
    for record in sorted(records, key=lambda r: str(r["ts"])):
        topic, scores, _ = grouped.get(record["item"], (record["topic"], [], ""))
        scores.append(float(record["score"]))
        grouped[record["item"]] = (topic, scores, str(record["ts"]))
    return grouped


def mastery_by_topic(records: Iterable[dict], bank=None) -> list[TopicMastery]:
    """A :class:`TopicMastery` per topic: the bank's topics in bank order, then any others.

    ``bank`` (a :class:`~dtlab.quiz.bank.Bank`, optional) supplies each topic's item count;
    topics with no attempts are listed too (at 0) so the table shows what is left to study.
    """
    per_item = scores_by_item(records)
    tried: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    for topic, scores, last in per_item.values():
        tried[topic].append((item_mastery(scores), len(scores), last))
    bank_topics = bank.topics() if bank is not None else []
    totals = {t: len(bank.items_for(t)) for t in bank_topics}
    rows = []
    for topic in bank_topics + sorted(set(tried) - set(bank_topics)):
        entries = tried.get(topic, [])
        total = max(totals.get(topic, 0), len(entries))
        rows.append(
            TopicMastery(
                topic=topic,
                mastery=sum(m for m, _, _ in entries) / total if total else 0.0,
                items_total=total,
                items_tried=len(entries),
                items_mastered=sum(m >= MASTERED_AT for m, _, _ in entries),
                attempts=sum(n for _, n, _ in entries),
                last_attempt=max((last for _, _, last in entries), default=""),
            )
        )
    return rows


def mastery_table(rows: list[TopicMastery]) -> str:
    """The rows as a plain-text table (for the terminal), with a 20-character bar per topic."""
    header = f"{'topic':<16} {'mastery':>7}  {'':<20} {'mastered':>8} {'tried':>7} {'attempts':>8}"
    lines = [header, "-" * len(header)]
    for row in rows:
        bar = "#" * round(20 * row.mastery)
        lines.append(
            f"{row.topic:<16} {row.mastery:>7.0%}  {bar:<20} "
            f"{row.items_mastered:>3}/{row.items_total:<4} {row.items_tried:>3}/{row.items_total:<3} "
            f"{row.attempts:>8}"
        )
    if not rows:
        lines.append("(no attempts recorded yet: answer a quiz cell or run `dtlab drill`)")
    return "\n".join(lines)


def mastery_chart(rows: list[TopicMastery], title: str = "Mastery per topic"):
    """A plotly bar chart: mastery per topic (%), hover shows items mastered/tried/total."""
    import plotly.graph_objects as go

    from dtlab.viz.theme import DTLAB_TEMPLATE

    colours = ["#1a7f37" if r.mastery >= MASTERED_AT else "#4C78A8" for r in rows]
    figure = go.Figure(
        go.Bar(
            x=[r.topic for r in rows],
            y=[100 * r.mastery for r in rows],
            marker_color=colours,
            text=[f"{r.mastery:.0%}" for r in rows],
            textposition="outside",
            customdata=[[r.items_mastered, r.items_tried, r.items_total, r.attempts] for r in rows],
            hovertemplate=(
                "<b>%{x}</b><br>mastery %{y:.0f}%<br>mastered %{customdata[0]} of "
                "%{customdata[2]} items<br>tried %{customdata[1]}, %{customdata[3]} attempts"
                "<extra></extra>"
            ),
        )
    )
    figure.add_hline(
        y=100 * MASTERED_AT, line_dash="dot", line_color="#888888", annotation_text="mastered"
    )
    figure.update_layout(
        template=DTLAB_TEMPLATE,
        title=title,
        yaxis={"title": "mastery (%)", "range": [0, 110]},
        xaxis={"title": "topic"},
        showlegend=False,
    )
    return figure
