"""Turn one YAML item (a plain dict) into an :class:`~dtlab.quiz.schema.Item`, or explain why not.

Every check appends a message naming the file and item id to ``problems`` instead of raising, so
an author sees all of a file's mistakes in one go. The schema itself is documented in
:mod:`dtlab.quiz.bank`.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from dtlab.quiz.schema import (
    DIFFICULTIES,
    KINDS,
    Choice,
    Item,
    NumericKey,
    Step,
    Tolerance,
)

ID_PATTERN = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")
KEY_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")
CALL_PATTERN = re.compile(r"^dtlab(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
LAB_LINK_PATTERN = re.compile(r"^lab:\d\d(#[a-z0-9-]+)?$")
SYMBOL_LINK_PATTERN = re.compile(r"^dtlab(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)?$")
SEE_PATTERN = re.compile(r"^dtlab(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

COMMON_REQUIRED = ("id", "kind", "prompt", "explanation", "difficulty", "source", "link")
COMMON_OPTIONAL = ("topic", "see")
FIELDS_BY_KIND = {
    "choice": ("choices", "shuffle"),
    "multi": ("choices", "shuffle"),
    "numeric": ("key", "unit", "tolerance"),
    "ordering": ("steps", "answer"),
    "short": ("answer", "rubric"),
    "code": ("exercise",),
}
REQUIRED_BY_KIND = {
    "choice": ("choices",),
    "multi": ("choices",),
    "numeric": ("key",),
    "ordering": ("steps", "answer"),
    "short": ("answer", "rubric"),
    "code": ("exercise",),
}
KEY_FIELDS = ("call", "args", "kwargs", "scale", "pick")


def _nonempty_text(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _suggest(word: str, options: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_item(
    raw: Any, file_label: str, file_topic: str, index: int, problems: list[str]
) -> Item | None:
    """Validate one raw item; append problems and return None if it is unusable."""
    where = f"{file_label}: item #{index + 1}"
    if not isinstance(raw, dict):
        problems.append(f"{where}: each item must be a mapping of fields, got {type(raw).__name__}")
        return None
    item_id = raw.get("id")
    if isinstance(item_id, str):
        where = f"{file_label}: item {item_id!r}"
    start = len(problems)

    def bad(message: str) -> None:
        problems.append(f"{where}: {message}")

    for name in COMMON_REQUIRED:
        if name not in raw:
            bad(f"missing required field {name!r}")
    kind = raw.get("kind")
    if "kind" in raw and kind not in KINDS:
        bad(f"kind {kind!r} is not one of {', '.join(KINDS)}")
        kind = None
    allowed = set(COMMON_REQUIRED + COMMON_OPTIONAL + FIELDS_BY_KIND.get(kind, ()))
    for name in raw:
        if name not in allowed:
            if kind == "numeric" and name == "answer":
                bad(
                    "numeric items compute their key; replace 'answer' with "
                    "'key: {call: dtlab.module:function, kwargs: {...}}'"
                )
            elif kind is not None:
                hint = _suggest(str(name), sorted(allowed))
                bad(f"field {name!r} is not used by {kind} items{hint}")
    if kind is not None:
        for name in REQUIRED_BY_KIND[kind]:
            if name not in raw:
                bad(f"{kind} items need a {name!r} field")

    if "id" in raw and not (isinstance(item_id, str) and ID_PATTERN.match(item_id)):
        bad(f"id {item_id!r} must be dotted lowercase words, e.g. 'zero.stage2_bytes'")
    topic = raw.get("topic", file_topic)
    if topic != file_topic:
        bad(f"topic {topic!r} differs from the file's topic {file_topic!r}; one topic per file")
    if isinstance(item_id, str) and not item_id.startswith(f"{file_topic}."):
        bad(
            f"id {item_id!r} must start with the topic, e.g. '{file_topic}.{item_id.split('.')[-1]}'"
        )
    for name in ("prompt", "explanation"):
        if name in raw and not _nonempty_text(raw[name]):
            bad(f"{name!r} must be non-empty text")
    difficulty = raw.get("difficulty")
    if "difficulty" in raw and difficulty not in DIFFICULTIES:
        bad(f"difficulty {difficulty!r} must be one of {', '.join(DIFFICULTIES)}")
    source = raw.get("source")
    if isinstance(source, str):
        source = [source]
    if "source" in raw and not (
        isinstance(source, list) and source and all(_nonempty_text(s) for s in source)
    ):
        bad("'source' must be a non-empty list of tags such as 'seed:000#Q5'")
    link = raw.get("link")
    if "link" in raw and isinstance(link, str) and SYMBOL_LINK_PATTERN.match(link):
        bad(
            f"link {link!r} is a library symbol; 'link' names the lab section that teaches the "
            f"idea ('lab:03#zero-stages'): move the symbol to 'see: {link}'"
        )
    elif "link" in raw and not (isinstance(link, str) and LAB_LINK_PATTERN.match(link)):
        bad(f"link {link!r} must name a lab section, e.g. 'lab:03#zero-stages'")
    see = raw.get("see", "")
    if not (isinstance(see, str) and (see == "" or SEE_PATTERN.match(see))):
        bad(
            f"see {see!r} must name a library symbol, e.g. 'dtlab.memory.formulas:model_state_bytes'"
        )
    shuffle = raw.get("shuffle", True)
    if not isinstance(shuffle, bool):
        bad(f"shuffle {shuffle!r} must be true or false (false keeps the options in written order)")

    extra: dict[str, Any] = {}
    if kind in ("choice", "multi") and "choices" in raw:
        extra["choices"] = _parse_choices(raw["choices"], kind, bad)
    elif kind == "numeric":
        extra.update(_parse_numeric(raw, bad))
    elif kind == "ordering" and "steps" in raw:
        extra.update(_parse_ordering(raw["steps"], raw.get("answer"), bad))
    elif kind == "short":
        extra.update(_parse_short(raw.get("answer"), raw.get("rubric"), bad))
    elif kind == "code":
        exercise = raw.get("exercise")
        if not (isinstance(exercise, str) and ID_PATTERN.match(exercise)):
            bad(f"exercise {exercise!r} must be an exercise id such as 'setup.rank_sum'")
        extra["exercise"] = exercise

    if len(problems) > start:
        return None
    return Item(
        id=item_id,
        topic=topic,
        kind=kind,
        prompt=raw["prompt"].strip(),
        explanation=raw["explanation"].strip(),
        difficulty=difficulty,
        source=tuple(source),
        link=link,
        file=file_label,
        see=see,
        shuffle=shuffle,
        **extra,
    )


def _parse_choices(raw: Any, kind: str, bad) -> tuple[Choice, ...]:
    if not isinstance(raw, list) or len(raw) < 2:
        bad("'choices' must be a list of at least two options")
        return ()
    choices = []
    for position, entry in enumerate(raw):
        default_key = "abcdefghijklmnopqrstuvwxyz"[position] if position < 26 else str(position)
        if not isinstance(entry, dict):
            bad(f"choice #{position + 1} must be a mapping with 'text', 'why' (and 'correct')")
            continue
        key = entry.get("key", default_key)
        if not (isinstance(key, str) and KEY_PATTERN.match(key)):
            bad(f"choice #{position + 1} key {key!r} must be a short word such as 'a' (quote it)")
            continue
        unknown = set(entry) - {"key", "text", "correct", "why"}
        if unknown:
            bad(f"choice {key!r} has unknown fields {sorted(unknown)}; use key, text, correct, why")
        if not _nonempty_text(entry.get("text")):
            bad(f"choice {key!r} has no 'text'")
        if not _nonempty_text(entry.get("why")):
            bad(f"choice {key!r} has no 'why' (explain why it is right or wrong)")
        correct = entry.get("correct", False)
        if not isinstance(correct, bool):
            bad(f"choice {key!r}: 'correct' must be true or false, got {correct!r}")
        choices.append(
            Choice(
                key,
                str(entry.get("text", "")).strip(),
                correct is True,
                str(entry.get("why", "")).strip(),
            )
        )
    keys = [c.key for c in choices]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        bad(f"choice keys {duplicates} are repeated")
    n_correct = sum(c.correct for c in choices)
    if kind == "choice" and n_correct != 1:
        bad(f"a choice item needs exactly one choice with 'correct: true', found {n_correct}")
    if kind == "multi" and n_correct == 0:
        bad("a multi item needs at least one choice with 'correct: true'")
    return tuple(choices)


def _parse_numeric(raw: dict, bad) -> dict[str, Any]:
    out: dict[str, Any] = {}
    key = raw.get("key")
    if key is not None:
        if not isinstance(key, dict) or "call" not in key:
            bad(
                "'key' must be a mapping with 'call: dtlab.module:function' (and kwargs, scale, pick)"
            )
        else:
            unknown = set(key) - set(KEY_FIELDS)
            if unknown:
                bad(f"key has unknown fields {sorted(unknown)}; use {', '.join(KEY_FIELDS)}")
            call = key["call"]
            if not (isinstance(call, str) and CALL_PATTERN.match(call)):
                bad(f"key call {call!r} must be 'dtlab.module.path:function' (a dtlab function)")
            args, kwargs = key.get("args", []), key.get("kwargs", {})
            scale, pick = key.get("scale", 1.0), key.get("pick")
            if not isinstance(args, list):
                bad("key args must be a list")
            if not isinstance(kwargs, dict):
                bad("key kwargs must be a mapping of argument names to values")
            if isinstance(scale, bool) or not isinstance(scale, (int, float)):
                bad(f"key scale {scale!r} must be a number, e.g. 1e-9 for bytes to GB")
            if pick is not None and not _nonempty_text(pick):
                bad("key pick must name a field of the result, e.g. 'optimizer_bytes'")
            if (
                isinstance(args, list)
                and isinstance(kwargs, dict)
                and isinstance(scale, (int, float))
            ):
                out["key"] = NumericKey(str(call), tuple(args), dict(kwargs), float(scale), pick)
    unit = raw.get("unit", "")
    if not isinstance(unit, str):
        bad(f"unit {unit!r} must be text such as 'GB', 's', '%' or '' for a plain number")
    out["unit"] = str(unit).strip()
    tolerance = raw.get("tolerance", {})
    if not isinstance(tolerance, dict) or set(tolerance) - {"rel", "abs"}:
        bad("'tolerance' must be a mapping with 'rel' and/or 'abs', e.g. {rel: 0.01}")
    else:
        values = {k: v for k, v in tolerance.items()}
        if any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 for v in values.values()
        ):
            bad(f"tolerance values must be non-negative numbers, got {tolerance}")
        else:
            out["tolerance"] = Tolerance(**{k: float(v) for k, v in values.items()})
    return out


def _parse_ordering(raw_steps: Any, answer: Any, bad) -> dict[str, Any]:
    if not isinstance(raw_steps, list) or len(raw_steps) < 3:
        bad("'steps' must list at least three steps (key and text each)")
        return {}
    steps = []
    for position, entry in enumerate(raw_steps):
        if not (isinstance(entry, dict) and set(entry) == {"key", "text"}):
            bad(f"step #{position + 1} must be a mapping with exactly 'key' and 'text'")
            continue
        if not (isinstance(entry["key"], str) and KEY_PATTERN.match(entry["key"])):
            bad(f"step #{position + 1} key {entry['key']!r} must be a short word (quote it)")
            continue
        steps.append(Step(entry["key"], str(entry["text"]).strip()))
    keys = [s.key for s in steps]
    if len(set(keys)) != len(keys):
        bad(f"step keys {keys} are not unique")
    if not (isinstance(answer, list) and sorted(map(str, answer)) == sorted(keys)):
        bad(
            f"'answer' must list every step key exactly once in the correct order; steps are {keys}"
        )
        return {"steps": tuple(steps)}
    if list(answer) == keys:
        bad("the steps are listed in the correct order already; list them scrambled")
    return {"steps": tuple(steps), "answer": tuple(answer)}


def _parse_short(answer: Any, rubric: Any, bad) -> dict[str, Any]:
    if not _nonempty_text(answer):
        bad("'answer' of a short item is the model answer text; it must be non-empty")
    if not (
        isinstance(rubric, list) and len(rubric) >= 2 and all(_nonempty_text(r) for r in rubric)
    ):
        bad("'rubric' must list at least two points (mechanism, why it matters, trade-offs, ...)")
        return {}
    return {"answer": str(answer).strip(), "rubric": tuple(r.strip() for r in rubric)}
