"""Quiz cells for notebooks: ``ask("setup.world_size")`` shows the question (Markdown, math), an
input that fits its kind, a Check button, feedback and a Retry button. A first miss gets a hint —
the idea to revisit, linked to its lab section — and the answer comes only after a second miss or
*Show answer* (:mod:`dtlab.quiz.feedback`). Every graded attempt is appended to the progress file.

Inputs by kind: one radio button per option row (choice), checkboxes (multi), both beside
wrapping Markdown text; a text box that accepts units and checks on Enter (numeric); up/down
buttons (ordering); an answer box then rubric checkboxes (short); a pointer to the exercise cell
(code). The cell is fully usable headlessly: ``cell.submit(response)``
grades a response directly, and the real widgets' values and ``.click()`` drive it too.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import ipywidgets as w

from dtlab.quiz.bank import Bank, cached_bank, load_bank
from dtlab.quiz.cell_style import AMBER, GREEN, QUIZ_CSS, RED, feedback_html, text_box
from dtlab.quiz.feedback import answer_markdown, hint_markdown, link_markdown, markdown_to_html
from dtlab.quiz.grading import grade
from dtlab.quiz.inputs import arrange_options, build_input, render_order
from dtlab.quiz.progress import option_fields, record_attempt
from dtlab.quiz.schema import AnswerError, Grade, Item
from dtlab.quiz.shuffle import option_order, shuffle_learner


class QuizCell:
    """One interactive question. ``widget`` is the ipywidgets box; ``attempts`` the grades so far.

    A first miss shows a hint (the idea to revisit, linked to its lab section); the answer comes
    after a second miss, a right answer, or the *Show answer* button. Enter in a number box
    checks it.

    Options (and ordering steps) are shown in ``option_order`` — shuffled for this learner and
    ``round`` (:mod:`dtlab.quiz.shuffle`). ``round`` counts *Retry* presses from 0, so the same
    learner re-running the notebook sees the same order, and each retry a new one. Responses,
    grading and records use option keys, never displayed positions.
    """

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
        self.misses = 0
        self.feedback_markdown = ""
        self._last_response: object = None
        self._locked = False
        self.round = 0
        self.shuffle_learner = shuffle_learner(learner)
        self.option_order = option_order(item, self.shuffle_learner, self.round)
        self.check_button = w.Button(description="Check", button_style="primary")
        self.show_answer_button = w.Button(
            description="Show answer", layout=w.Layout(display="none")
        )
        self.retry_button = w.Button(description="Retry", layout=w.Layout(display="none"))
        self.feedback = w.HTMLMath(value="", layout=w.Layout(width="auto"))
        self.feedback.add_class("dtlab-text")
        self.feedback.add_class("dtlab-feedback")
        self.check_button.on_click(lambda _: self._on_check())
        self.show_answer_button.on_click(lambda _: self.show_answer())
        self.retry_button.on_click(lambda _: self.retry())
        self._inputs: list[w.Widget] = []
        input_box = self._build_input()
        meta = f"`{item.id}` · {item.difficulty} · see {link_markdown(item.link)}"
        self.widget = w.VBox(
            [
                w.HTML(value=QUIZ_CSS),
                text_box(item.prompt),
                input_box,
                w.HBox([self.check_button, self.show_answer_button, self.retry_button]),
                self.feedback,
                w.HTML(value=f"<small style='color:#666'>{markdown_to_html(meta)}</small>"),
            ],
            layout=w.Layout(width="100%"),
        )
        self.widget.add_class("dtlab-quiz")

    # -- inputs per kind ---------------------------------------------------------------------

    def _build_input(self) -> w.Widget:
        return build_input(self)

    def _one_choice_only(self, change: dict) -> None:
        if change["new"] is None:
            return
        for key, button in self.choice_buttons.items():
            if key != change["new"] and button.value is not None:
                button.value = None

    def _on_enter(self, change: dict) -> None:
        if change["new"].strip() and not self._locked:
            self._on_check()

    def select(self, key: str) -> None:
        """Choose option ``key`` (its key, not its label) of a choice item, as clicking does."""
        self.choice_buttons[key].value = key

    def select_label(self, label: str) -> None:
        """Choose the option shown as ``(label)``, as clicking the radio button beside it does."""
        self.select(self.option_order.key_of(label))

    def _render_order(self) -> None:
        render_order(self)

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
            chosen = [key for key, button in self.choice_buttons.items() if button.value]
            if not chosen:
                raise AnswerError("pick one of the options first")
            return chosen[0]
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

    def _show(self, markdown: str, colour: str) -> None:
        self.feedback_markdown = markdown
        self.feedback.value = feedback_html(markdown, colour)

    def _lock(self, locked: bool) -> None:
        self._locked = locked
        for widget in self._inputs:
            widget.disabled = locked
        for row in getattr(self, "order_rows", []):
            for button in row.children[:2]:
                button.disabled = locked
        self.check_button.disabled = locked
        self.retry_button.layout.display = None if locked else "none"
        if locked:
            self.show_answer_button.layout.display = "none"

    def submit(self, response: object) -> Grade:
        """Grade ``response``, show a hint (first miss) or the answer, record the attempt.

        Bad shapes raise AnswerError and count as nothing.
        """
        try:
            result = grade(self.item, response, cluster=self.cluster)
        except AnswerError as error:
            self._show(f"*{error}*", AMBER)
            raise
        self.attempts.append(result)
        self._last_response = response
        if result.correct or self.item.kind in ("short", "code"):
            self._show(
                answer_markdown(self.item, response, result, self.option_order),
                GREEN if result.correct else AMBER,
            )
            self._lock(True)
        else:
            self.misses += 1
            if self.misses >= 2:
                self._show(answer_markdown(self.item, response, result, self.option_order), RED)
                self._lock(True)
            else:
                self._show(hint_markdown(self.item, response, result), AMBER)
                self.show_answer_button.layout.display = None
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
                    **option_fields(self.item, response, self.option_order),
                )
            except OSError as error:
                warnings.warn(f"could not record progress: {error}", stacklevel=2)
        return result

    def _on_check(self) -> None:
        if self._locked:
            return
        try:
            response = self.read_response()
        except AnswerError as error:
            self._show(f"*{error}*", AMBER)
            return
        if self.misses and response == self._last_response:
            return  # the same answer again (e.g. Enter, then Check): not a second miss
        with contextlib.suppress(AnswerError):  # already shown in the feedback
            self.submit(response)

    def show_answer(self) -> None:
        """Reveal the answer (and why) without another attempt."""
        last = self.attempts[-1] if self.attempts else None
        self._show(
            answer_markdown(self.item, self._last_response, last, self.option_order),
            RED if last else AMBER,
        )
        self._lock(True)

    def retry(self) -> None:
        """Clear the feedback and the inputs for another attempt, with the options reshuffled."""
        self.feedback.value = ""
        self.feedback_markdown = ""
        self.misses = 0
        self._last_response = None
        self._lock(False)
        for widget in self._inputs:
            if isinstance(widget, w.RadioButtons):
                widget.value = None
            else:
                widget.value = type(widget.value)()
        self.round += 1
        self.option_order = option_order(self.item, self.shuffle_learner, self.round)
        if self.item.kind in ("choice", "multi"):
            arrange_options(self)
        if self.item.kind == "ordering":
            self.order = list(self.option_order.keys)
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
