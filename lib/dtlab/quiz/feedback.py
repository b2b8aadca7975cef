"""What a learner reads after an attempt: a hint first, the answer only after a second miss.

:func:`dtlab.quiz.grading.grade` returns the full report (it names the key and how the library
computed it, which item authors and tests need). A learner sees a different text, built here as
Markdown from the item and the response:

* :func:`hint_markdown` — after a first miss: which idea to revisit, as a link to the lab section
  that teaches it (the item's ``link``) and, when the item has a ``see``, the library function that
  computes it as a second pointer, plus a slip hint for a number off by a telltale factor (8, 1000, 1.024^k).
  It never names the right option or the key.
* :func:`answer_markdown` — after a right answer, a second miss, or "Show answer": the verdict,
  why the chosen option is right or wrong, the answer, and the explanation. No grader internals:
  no "key is", no "Computed by ...".

Both are Markdown (code spans, ``$math$``, lists); :func:`markdown_to_html` renders them for the
notebook cell and :mod:`dtlab.quiz.drill` for a terminal. Lab references ``lab:NN#anchor`` anywhere
in the text become links to the section of the sibling notebook ``NN_name.ipynb#anchor`` (labs/
and solutions/ hold the same file names, so the relative link works from either folder).
"""

from __future__ import annotations

import html
import json
import re
from functools import lru_cache

from dtlab.quiz.schema import Grade, Item
from dtlab.quiz.shuffle import OptionOrder
from dtlab.quiz.units import parse_number, slip_hint

_LAB_REFERENCE = re.compile(r"\blab:(?P<lab>\d{2})#(?P<anchor>[a-z0-9]+(?:-[a-z0-9]+)*)")
_SYMBOL_REFERENCE = re.compile(r"(?<![`\w])(?P<symbol>dtlab(?:\.\w+)+:[\w.]+)")
_MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+?\$", re.S)
_HEADING = re.compile(r"^#{1,6}\s+(?P<text>.+?)\s*#*\s*$")


@lru_cache(maxsize=64)
def lab_section(lab: str, anchor: str) -> tuple[str, str]:
    """``(title, href)`` of a lab section: the heading at or before ``anchor``, and its notebook
    link (``NN_name.ipynb#cell-id=…``, :func:`_href`). Falls back to ``("Lab NN", "")`` when the source is absent."""
    from dtlab.quiz.links import default_solutions_dir, lab_source_for, markdown_anchors
    from dtlab.workshop.build import section_cell_id

    try:
        source = lab_source_for(lab, default_solutions_dir())
    except Exception:  # an installed package without the repository's folders
        source = None
    if source is None:
        return f"Lab {lab}", ""
    from dtlab.workshop.source import read_lab_source

    title = ""
    for cell in read_lab_source(source).cells:
        if cell.cell_type != "markdown":
            continue
        headings = [m["text"] for m in map(_HEADING.match, cell.source.splitlines()) if m]
        if anchor in markdown_anchors(cell.source):
            title = headings[0] if headings else title
            title = re.sub(r"<[^>]*>", "", title).strip()
            href = _href(source, anchor, section_cell_id(cell.source))
            return (f"Lab {lab} · {title}" if title else f"Lab {lab}"), href
        title = headings[-1] if headings else title
    return f"Lab {lab}", _href(source, anchor)


def _href(source, anchor: str, cell_id: str | None = None) -> str:
    """``NN_name.ipynb#cell-id=<id>`` for a section's cell (JupyterLab 4 scrolls to the cell
    with that id, and the workshop build gives a section's cell its anchor as id), else
    ``NN_name.ipynb#anchor`` (a heading)."""
    return f"{source.stem}.ipynb#" + (f"cell-id={cell_id}" if cell_id else anchor)


def link_markdown(link: str) -> str:
    """A bank link (``lab:NN#anchor`` or ``dtlab.module:attr``) as a Markdown link or code."""
    lab = _LAB_REFERENCE.fullmatch(link.strip())
    if lab:
        title, href = lab_section(lab["lab"], lab["anchor"])
        return f"[{title}]({href})" if href else title
    if link.strip().startswith("dtlab.quiz.graders"):
        return "the lab's exercise"  # a grader is no reading for a learner
    return f"`{link.strip().replace(':', '.')}`"


def symbol_markdown(symbol: str) -> str:
    """A library symbol ``dtlab.module:attr`` as inline code ``dtlab.module.attr``."""
    return f"`{symbol.strip().replace(':', '.')}`"


def linkify(text: str) -> str:
    """Turn every ``lab:NN#anchor`` into a section link and ``dtlab.x:y`` into code."""
    text = _LAB_REFERENCE.sub(lambda m: link_markdown(m.group(0)), text)
    return _SYMBOL_REFERENCE.sub(lambda m: f"`{m['symbol'].replace(':', '.')}`", text)


def markdown_to_html(text: str) -> str:
    """Markdown (CommonMark + tables) to HTML: raw HTML escaped, ``$math$`` left for MathJax,
    lab references as links that open in a new tab."""
    from markdown_it import MarkdownIt

    maths: list[str] = []

    def keep(match: re.Match) -> str:
        maths.append(match.group(0))
        return f"DTLABMATH{len(maths) - 1}X"

    protected = _MATH.sub(keep, linkify(text))
    rendered = MarkdownIt("commonmark", {"html": False}).enable("table").render(protected)
    rendered = re.sub(r"DTLABMATH(\d+)X", lambda m: html.escape(maths[int(m[1])]), rendered)
    rendered = _NOTEBOOK_LINK.sub(_in_app_link, rendered)
    return rendered.replace("<a href=", "<a target='_blank' rel='noopener' href=").strip()


_RECLICK = (
    "if (event.isTrusted) { const a = this; "
    "[1200, 3000].forEach(t => setTimeout(() => a.click(), t)); }"
)
_NOTEBOOK_LINK = re.compile(r'<a href="(?P<path>\d\d_\w+\.ipynb)(?P<fragment>#[^"]*)?"')


def _in_app_link(match: re.Match) -> str:
    """A lab link that JupyterLab itself follows: its command linker runs
    ``rendermime:handle-local-link``, which opens (or reveals) the notebook in the same window
    and scrolls to the fragment's cell; elsewhere the plain ``href`` opens in a new tab.

    JupyterLab 4.6 looks for the cell as soon as a *newly opened* notebook's file is loaded,
    before its cells exist, and then does not scroll (jupyterlab#15207); revealing an open
    notebook does scroll. So a real click also re-clicks the link twice, 1.2 s and 3 s later:
    the notebook is open by then and each re-click scrolls to the cell."""
    args = {"path": match["path"], "id": match["fragment"] or ""}
    return (
        "<a target='_blank' rel='noopener' "
        f'onclick="{_RECLICK}" '
        "data-commandlinker-command='rendermime:handle-local-link' "
        f"data-commandlinker-args='{html.escape(json.dumps(args), quote=True)}' "
        f'href="{match["path"]}{match["fragment"] or ""}"'
    )


def terminal_links(text: str) -> str:
    """:func:`linkify` for a terminal: lab links point into ``labs/`` from the repository root."""
    return re.sub(r"\]\((\d{2}_[\w-]+\.ipynb#)", r"](labs/\1", linkify(text))


# -- the texts ------------------------------------------------------------------------------


def _idea(item: Item) -> str:
    """The hint's pointer: the lab section that teaches the idea, then (when the item has a
    ``see``) the library symbol that computes or implements it — named, never called, so no
    number leaks. The wording is neutral ("in the library:") because a ``see`` may be a function
    or a class."""
    text = f"Revisit {link_markdown(item.link)} and try again"
    if item.see:
        text += f" (in the library: {symbol_markdown(item.see)})"
    return text + "."


def hint_markdown(item: Item, response: object, grade_: Grade) -> str:
    """After a first miss: what to revisit, never the answer."""
    lines = [
        "**Not quite yet.**" if grade_.score == 0 else f"**Partly right ({grade_.score:.0%}).**"
    ]
    if item.kind == "choice":
        lines.append("That option is not the one. " + _idea(item))
    elif item.kind == "multi":
        right = round(grade_.score * len(item.choices))
        lines.append(
            f"{right} of the {len(item.choices)} options are judged right (ticked or left "
            f"unticked as they should be). " + _idea(item)
        )
    elif item.kind == "numeric":
        slip = ""
        try:
            from dtlab.quiz.keys import compute_key

            slip = slip_hint(parse_number(response, item.unit), compute_key(item))
        except Exception:
            slip = ""
        lines.append("That number is outside the accepted range. " + (slip + " " if slip else ""))
        lines[-1] += _idea(item)
    elif item.kind == "ordering":
        order, answer = list(response), list(item.answer)
        in_place = next(
            (i for i, (a, b) in enumerate(zip(order, answer, strict=False)) if a != b), len(order)
        )
        lines.append(f"The first {in_place} step(s) are in place; the rest are not. " + _idea(item))
    else:
        lines.append(_idea(item))
    lines.append("Change your answer and press *Check* again, or *Show answer*.")
    return "\n\n".join(lines)


def _verdict(grade_: Grade) -> str:
    if grade_.correct:
        return "**Correct.**"
    return f"**Partly right ({grade_.score:.0%}).**" if grade_.score > 0 else "**Not quite.**"


def answer_markdown(
    item: Item, response: object, grade_: Grade | None, order: OptionOrder | None = None
) -> str:
    """The full answer: verdict (when there is an attempt), reasons, answer, explanation.

    ``response`` holds option keys (identity); ``order`` is how the options were shown, so each
    is named by the label the learner saw (its written key when None) and multi options are
    listed in displayed order.
    """
    label = order.label if order is not None and order.keys else (lambda key: key)
    shown = order.keys if order is not None and order.keys else [c.key for c in item.choices]
    parts = [_verdict(grade_)] if grade_ is not None else ["**The answer.**"]
    chosen = None
    if item.kind == "choice":
        keys = {c.key.lower(): c for c in item.choices}
        chosen = keys.get(str(response).strip().lower()) if response is not None else None
        right = item.choice(item.correct_keys[0])
        if chosen is not None:
            parts.append(f"({label(chosen.key)}) {chosen.why}")
        if chosen is None or not chosen.correct:
            parts.append(
                f"The answer is **({label(right.key)})** {right.text.rstrip('.')}. {right.why}"
            )
    elif item.kind == "multi":
        picked = {str(k).lower() for k in (response or [])}
        notes = []
        for c in map(item.choice, shown):
            mark = "✓" if c.correct else "✗"
            chosen_note = " (you ticked it)" if c.key.lower() in picked else ""
            notes.append(f"- {mark} **({label(c.key)})**{chosen_note}: {c.why}")
        parts.append("Right options are marked ✓:\n\n" + "\n".join(notes))
    elif item.kind == "numeric":
        from dtlab.quiz.keys import compute_key

        unit = f" {item.unit}" if item.unit else ""
        value = compute_key(item)
        parts.append(
            f"The answer is **{value:.4g}{unit}** (accepted: {item.tolerance.describe()})."
        )
        if response is not None and grade_ is not None and not grade_.correct:
            try:
                slip = slip_hint(parse_number(response, item.unit), value)
            except Exception:
                slip = ""
            if slip:
                parts.append(slip)
    elif item.kind == "ordering":
        text = {s.key: s.text for s in item.steps}
        parts.append(
            "The order:\n\n" + "\n".join(f"{i + 1}. {text[k]}" for i, k in enumerate(item.answer))
        )
    elif item.kind == "short":
        parts.append(f"A model answer: {item.answer}")
        if grade_ is not None and response is not None and not grade_.correct:
            ticked = set(response) if not all(isinstance(t, bool) for t in response) else None
            missed = [
                p for i, p in enumerate(item.rubric) if ticked is not None and i not in ticked
            ]
            if missed:
                parts.append("Points to add next time:\n\n" + "\n".join(f"- {p}" for p in missed))
    parts.append(item.explanation)
    more = f"More in {link_markdown(item.link)}"
    parts.append(more + (f" (in the library: {symbol_markdown(item.see)})." if item.see else "."))
    return "\n\n".join(p for p in parts if p)
