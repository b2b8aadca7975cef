"""Quiz cells for notebooks: ``ask("setup.world_size")`` shows the question, an input that fits its
kind, a Check button, the feedback (why the chosen answer is right, or why that wrong choice is
wrong) and a Retry button. Every graded attempt is appended to the progress file.

Inputs by kind: radio buttons (choice), checkboxes (multi), a text box that accepts units
(numeric), up/down buttons (ordering), an answer box then rubric checkboxes (short), and a pointer
to the exercise cell (code). The cell is fully usable headlessly: ``cell.submit(response)``
grades a response directly, and the real widgets' values and ``.click()`` drive it too.
"""

from __future__ import annotations

import html
import re
import warnings
from pathlib import Path

import ipywidgets as w

from dtlab.quiz.bank import Bank, cached_bank, load_bank
from dtlab.quiz.grading import grade
from dtlab.quiz.progress import record_attempt
from dtlab.quiz.schema import AnswerError, Grade, Item

GREEN, RED, AMBER = "#1a7f37", "#cf222e", "#9a6700"


def markdown_to_html(text: str) -> str:
    """Just enough markdown for prompts: paragraphs, `code`, **bold**, *italic*, '- ' lists."""
    blocks = []
    for block in re.split(r"\n\s*\n", text.strip()):
        escaped = html.escape(block)
        escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
        escaped = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", escaped)
        escaped = re.sub(r"(?<![*\w])\*([^*\n]+)\*(?!\*)", r"<i>\1</i>", escaped)
        lines = escaped.splitlines()
        if all(line.lstrip().startswith("- ") for line in lines):
            items = "".join(f"<li>{line.lstrip()[2:]}</li>" for line in lines)
            blocks.append(f"<ul>{items}</ul>")
        else:
            blocks.append(f"<p>{' '.join(lines)}</p>")
    return "".join(blocks)


def _feedback_html(grade_: Grade) -> str:
    colour = GREEN if grade_.correct else (AMBER if grade_.score > 0 else RED)
    first, *rest = grade_.feedback.splitlines()
    body = "<br>".join(html.escape(line).replace("  ", "&nbsp;&nbsp;") for line in rest)
    return (
        f"<div style='border-left:4px solid {colour};padding:4px 10px'>"
        f"<b style='color:{colour}'>{html.escape(first)}</b><br>{body}</div>"
    )


class QuizCell:
    """One interactive question. ``widget`` is the ipywidgets box; ``attempts`` the grades so far."""

    def __init__(
        self,
        item: Item,
        bank_version: str | None = None,
        learner: str | None = None,
        progress_path: str | Path | None = None,
        record: bool = True,
        cluster: object = None,
    ):
        self.item = item
        self.cluster = cluster
        self.bank_version = bank_version
        self.learner = learner
        self.progress_path = progress_path
        self.record = record
        self.attempts: list[Grade] = []
        self.check_button = w.Button(description="Check", button_style="primary")
        self.retry_button = w.Button(description="Retry", layout=w.Layout(display="none"))
        self.feedback = w.HTMLMath(value="")
        self.check_button.on_click(lambda _: self._on_check())
        self.retry_button.on_click(lambda _: self.retry())
        self._inputs: list[w.Widget] = []
        input_box = self._build_input()
        meta = f"{item.id} · {item.difficulty} · see {item.link}"
        self.widget = w.VBox(
            [
                w.HTMLMath(value=markdown_to_html(item.prompt)),
                input_box,
                w.HBox([self.check_button, self.retry_button]),
                self.feedback,
                w.HTML(value=f"<small style='color:#666'>{html.escape(meta)}</small>"),
            ]
        )

    # -- inputs per kind ---------------------------------------------------------------------

    def _build_input(self) -> w.Widget:
        kind = self.item.kind
        if kind == "choice":
            options = [(f"({c.key}) {c.text}", c.key) for c in self.item.choices]
            self.radio = w.RadioButtons(options=options, value=None, layout=w.Layout(width="auto"))
            self._inputs = [self.radio]
            return self.radio
        if kind == "multi":
            self.checkboxes = {
                c.key: w.Checkbox(value=False, description=f"({c.key}) {c.text}", indent=False)
                for c in self.item.choices
            }
            self._inputs = list(self.checkboxes.values())
            return w.VBox(self._inputs)
        if kind == "numeric":
            hint = f"a number in {self.item.unit}" if self.item.unit else "a number"
            self.number = w.Text(placeholder=hint)
            self._inputs = [self.number]
            return w.HBox([self.number, w.Label(self.item.unit)])
        if kind == "ordering":
            self.order = [s.key for s in self.item.steps]
            self.order_box = w.VBox()
            self._render_order()
            return self.order_box
        if kind == "short":
            self.answer_text = w.Textarea(
                placeholder="Write (or say out loud) your answer, then reveal the rubric"
            )
            self.reveal_button = w.Button(description="Reveal rubric")
            self.rubric_boxes = [
                w.Checkbox(value=False, description=p, indent=False) for p in self.item.rubric
            ]
            self.rubric_panel = w.VBox(
                [w.HTML("<b>Tick the points your answer made:</b>"), *self.rubric_boxes],
                layout=w.Layout(display="none"),
            )
            self.check_button.layout.display = "none"
            self.reveal_button.on_click(lambda _: self.reveal_rubric())
            self._inputs = [self.answer_text, *self.rubric_boxes]
            return w.VBox([self.answer_text, self.reveal_button, self.rubric_panel])
        self.check_button.layout.display = "none"  # code: graded by check_exercise in the lab cell
        return w.HTML(
            markdown_to_html(
                f"Solve this in the lab's exercise cell, then run "
                f'`check_exercise("{self.item.exercise}", your_function, cluster)`.'
            )
        )

    def _render_order(self) -> None:
        text = {s.key: s.text for s in self.item.steps}
        rows = []
        for position, key in enumerate(self.order):
            up = w.Button(description="▲", layout=w.Layout(width="36px"), disabled=position == 0)
            down = w.Button(
                description="▼",
                layout=w.Layout(width="36px"),
                disabled=position == len(self.order) - 1,
            )
            up.on_click(lambda _, k=key: self.move(k, -1))
            down.on_click(lambda _, k=key: self.move(k, +1))
            rows.append(w.HBox([up, down, w.HTML(f"{position + 1}. {html.escape(text[key])}")]))
        self.order_rows = rows
        self.order_box.children = rows

    def move(self, step_key: str, offset: int) -> None:
        """Move an ordering step up (-1) or down (+1)."""
        i = self.order.index(step_key)
        j = min(max(i + offset, 0), len(self.order) - 1)
        self.order[i], self.order[j] = self.order[j], self.order[i]
        self._render_order()

    def reveal_rubric(self) -> None:
        self.rubric_panel.layout.display = None
        self.reveal_button.layout.display = "none"
        self.check_button.layout.display = None

    def read_response(self) -> object:
        """The response the widgets currently hold, in the shape :func:`grade` expects."""
        kind = self.item.kind
        if kind == "choice":
            if self.radio.value is None:
                raise AnswerError("pick one of the options first")
            return self.radio.value
        if kind == "multi":
            return [key for key, box in self.checkboxes.items() if box.value]
        if kind == "numeric":
            if not self.number.value.strip():
                raise AnswerError("type a number first")
            return self.number.value
        if kind == "ordering":
            return list(self.order)
        if kind == "short":
            return [i for i, box in enumerate(self.rubric_boxes) if box.value]
        raise AnswerError("code items are checked with check_exercise in the exercise cell")

    # -- checking ------------------------------------------------------------------------------

    def submit(self, response: object) -> Grade:
        """Grade ``response``, show the feedback, record the attempt. Bad shapes raise AnswerError."""
        try:
            result = grade(self.item, response, cluster=self.cluster)
        except AnswerError as error:
            self.feedback.value = f"<span style='color:{AMBER}'>{html.escape(str(error))}</span>"
            raise
        self.attempts.append(result)
        self.feedback.value = _feedback_html(result)
        for widget in self._inputs:
            widget.disabled = True
        for row in getattr(self, "order_rows", []):
            for button in row.children[:2]:
                button.disabled = True
        self.check_button.disabled = True
        self.retry_button.layout.display = None
        if self.record:
            try:
                record_attempt(
                    item=self.item.id,
                    topic=self.item.topic,
                    kind=self.item.kind,
                    correct=result.correct,
                    score=result.score,
                    bank_version=self.bank_version,
                    learner=self.learner,
                    path=self.progress_path,
                )
            except OSError as error:
                warnings.warn(f"could not record progress: {error}", stacklevel=2)
        return result

    def _on_check(self) -> None:
        try:
            self.submit(self.read_response())
        except AnswerError as error:
            self.feedback.value = f"<span style='color:{AMBER}'>{html.escape(str(error))}</span>"

    def retry(self) -> None:
        """Clear the feedback and the inputs for another attempt."""
        self.feedback.value = ""
        for widget in self._inputs:
            widget.disabled = False
            widget.value = None if widget is getattr(self, "radio", None) else type(widget.value)()
        self.check_button.disabled = False
        self.retry_button.layout.display = "none"
        if self.item.kind == "ordering":
            self.order = [s.key for s in self.item.steps]
            self._render_order()

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"QuizCell({self.item.id!r}, {self.item.kind}, attempts={len(self.attempts)})"


def ask(
    item_id: str,
    bank: Bank | str | Path | None = None,
    learner: str | None = None,
    progress_path: str | Path | None = None,
    record: bool = True,
    cluster: object = None,
) -> QuizCell:
    """A quiz cell for ``item_id`` (display it by leaving it last in a notebook cell).

    ``learner`` is a name (stored only as a hash) or None for this machine's random id;
    ``cluster`` runs the learner's function for ``code`` items submitted through the cell.
    """
    if not isinstance(bank, Bank):
        bank = cached_bank() if bank is None else load_bank(bank)
    return QuizCell(bank[item_id], bank.version, learner, progress_path, record, cluster)
