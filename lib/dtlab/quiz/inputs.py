"""The input widgets of a quiz cell, one builder per item kind (:class:`~dtlab.quiz.widgets.QuizCell`
calls :func:`build_input`).

Every option is a row: its own control (a radio button, a checkbox, up/down buttons) beside
wrapping Markdown text, laid out the same for right and wrong options so the layout never hints
at the answer. The builders set the widgets on the cell (``choice_buttons``, ``checkboxes``,
``number``, ``order_box``, ``rubric_boxes`` …) where :meth:`QuizCell.read_response` reads them.
"""

from __future__ import annotations

import ipywidgets as w

from dtlab.quiz.cell_style import text_box


def option_row(control: w.Widget, markdown: str) -> w.HBox:
    """One option: its control, then its text wrapping in the rest of the width."""
    control.add_class("dtlab-control")
    row = w.HBox([control, text_box(markdown)], layout=w.Layout(width="100%"))
    row.add_class("dtlab-option")
    return row


def build_input(cell) -> w.Widget:
    """The input box for ``cell.item``'s kind (module docstring).

    Options and steps are shown in ``cell.option_order`` (:mod:`dtlab.quiz.shuffle`): the controls
    are keyed by option key (identity), their labels are positions ``(a)``, ``(b)`` … in display.
    """
    kind = cell.item.kind
    if kind == "choice":
        # one single-option radio per row: real radio controls, each beside wrapping text
        cell.choice_buttons = {
            c.key: w.RadioButtons(options=[("", c.key)], value=None, layout=w.Layout(width="auto"))
            for c in cell.item.choices
        }
        for button in cell.choice_buttons.values():
            button.observe(cell._one_choice_only, "value")
        cell._inputs = list(cell.choice_buttons.values())
        cell.options_box = w.VBox(layout=w.Layout(width="100%"))
        arrange_options(cell)
        return cell.options_box
    if kind == "multi":
        cell.checkboxes = {
            c.key: w.Checkbox(value=False, indent=False, layout=w.Layout(width="auto"))
            for c in cell.item.choices
        }
        cell._inputs = list(cell.checkboxes.values())
        cell.options_box = w.VBox(layout=w.Layout(width="100%"))
        arrange_options(cell)
        return cell.options_box
    if kind == "numeric":
        hint = (
            f"a number in {cell.item.unit}, then Enter"
            if cell.item.unit
            else "a number, then Enter"
        )
        # continuous_update=False: the value arrives on Enter (or leaving the box) — checked then
        cell.number = w.Text(placeholder=hint, continuous_update=False)
        cell.number.observe(cell._on_enter, "value")
        cell._inputs = [cell.number]
        return w.HBox([cell.number, w.Label(cell.item.unit)])
    if kind == "ordering":
        cell.order = list(cell.option_order.keys)
        cell.order_box = w.VBox(layout=w.Layout(width="100%"))
        render_order(cell)
        return cell.order_box
    if kind == "short":
        cell.answer_text = w.Text(
            placeholder="Write (or say out loud) your answer, then Enter to see the rubric",
            continuous_update=False,
            layout=w.Layout(width="100%"),
        )
        cell.answer_text.observe(lambda change: change["new"] and cell.reveal_rubric(), "value")
        cell.reveal_button = w.Button(description="Reveal rubric")
        cell.rubric_boxes = [
            w.Checkbox(
                value=False,
                description=f"{i + 1}.",
                indent=False,
                layout=w.Layout(width="auto"),
            )
            for i, _ in enumerate(cell.item.rubric)
        ]
        cell.rubric_rows = [
            option_row(box, point)
            for box, point in zip(cell.rubric_boxes, cell.item.rubric, strict=True)
        ]
        cell.rubric_panel = w.VBox(
            [w.HTML("<b>Tick the points your answer made:</b>"), *cell.rubric_rows],
            layout=w.Layout(display="none", width="100%"),
        )
        cell.check_button.layout.display = "none"
        cell.reveal_button.on_click(lambda _: cell.reveal_rubric())
        cell._inputs = [cell.answer_text, *cell.rubric_boxes]
        return w.VBox([cell.answer_text, cell.reveal_button, cell.rubric_panel])
    cell.check_button.layout.display = "none"  # code: graded by check_exercise in the lab cell
    return text_box(
        f"Solve this in the lab's exercise cell, then run "
        f'`check_exercise("{cell.item.exercise}", your_function, cluster)`.'
    )


def arrange_options(cell) -> None:
    """Lay out a choice/multi cell's option rows in ``cell.option_order``, labelled by position."""
    text = {c.key: c.text for c in cell.item.choices}
    controls = cell.choice_buttons if cell.item.kind == "choice" else cell.checkboxes
    for key, control in controls.items():
        label = f"({cell.option_order.label(key)})"
        if isinstance(control, w.RadioButtons):
            control.options = [(label, key)]
            control.value = None
        else:
            control.description = label
    cell.option_rows = [option_row(controls[k], text[k]) for k in cell.option_order.keys]
    cell.options_box.children = cell.option_rows


def render_order(cell) -> None:
    """Draw the ordering item's steps in ``cell.order``, each with up/down buttons."""
    text = {s.key: s.text for s in cell.item.steps}
    rows = []
    for position, key in enumerate(cell.order):
        up = w.Button(description="▲", layout=w.Layout(width="36px"), disabled=position == 0)
        down = w.Button(
            description="▼",
            layout=w.Layout(width="36px"),
            disabled=position == len(cell.order) - 1,
        )
        up.on_click(lambda _, k=key: cell.move(k, -1))
        down.on_click(lambda _, k=key: cell.move(k, +1))
        row = w.HBox([up, down, text_box(f"{position + 1}. {text[key]}")])
        row.add_class("dtlab-option")
        rows.append(row)
    cell.order_rows = rows
    cell.order_box.children = rows
