"""The question bank covers the syllabus: every seed question is tagged, every topic and kind present.

``quizzes/coverage/seed_manifest.yaml`` lists every question, quiz item, checklist entry and table
of the syllabus pages (``../shared/seeds/``) with a tag such as ``seed:003#quiz-7``. Each tag must
appear in the ``source`` of at least one item; a failure lists the missing tags with their titles.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from dtlab.quiz import load_bank, reference_problems
from dtlab.quiz.bank import default_quiz_dir
from dtlab.quiz.units import split_unit

MANIFEST = default_quiz_dir() / "coverage" / "seed_manifest.yaml"
SOLUTIONS = default_quiz_dir().parent / "solutions"
TAG = re.compile(r"^seed:\d{3}#[A-Za-z0-9-]+$")

# Topics the issue names, each with the bank topic(s) that hold its items.
REQUIRED_TOPICS = {
    "collectives and NCCL": ("collectives", "nccl"),
    "data parallel": ("data_parallel",),
    "ZeRO/FSDP": ("zero",),
    "tensor and sequence parallel": ("tensor_parallel",),
    "pipeline": ("pipeline",),
    "context parallel": ("context_parallel",),
    "MoE/expert parallel": ("moe",),
    "mixed precision": ("precision",),
    "activation checkpointing and gradient accumulation": ("activations",),
    "checkpointing": ("checkpointing",),
    "fault tolerance": ("fault_tolerance",),
    "hardware and topology": ("hardware",),
    "scaling and performance debugging": ("performance",),
    "sync vs async training": ("sync_async",),
    "system design": ("system_design",),
}
# The files this bank part owns; the stricter authoring checks apply to them.
OWNED_TOPICS = {t for topics in REQUIRED_TOPICS.values() for t in topics} - {"collectives"}
MIN_PER_KIND = {"choice": 40, "multi": 15, "numeric": 30, "ordering": 8, "short": 15}


@pytest.fixture(scope="module")
def bank():
    return load_bank()


@pytest.fixture(scope="module")
def manifest() -> dict[str, str]:
    pages = yaml.safe_load(MANIFEST.read_text())["manifest"]
    entries = [entry for page in pages for entry in page["entries"]]
    tags = [e["tag"] for e in entries]
    duplicates = sorted(t for t, n in Counter(tags).items() if n > 1)
    assert not duplicates, f"manifest lists these tags twice: {duplicates}"
    malformed = [t for t in tags if not TAG.match(t)]
    assert not malformed, f"manifest tags must look like 'seed:003#quiz-7': {malformed}"
    return {e["tag"]: e["title"] for e in entries}


def owned(bank):
    return [item for item in bank.values() if item.topic in OWNED_TOPICS]


def test_manifest_names_every_seed_page(manifest):
    pages = {tag[5:8] for tag in manifest}
    assert pages == {"000", "001", "002", "003", "004"}
    assert len(manifest) >= 100


def test_every_seed_question_is_covered_by_an_item(bank, manifest):
    tagged = {tag for item in bank.values() for tag in item.source}
    missing = [f"{tag} — {title}" for tag, title in manifest.items() if tag not in tagged]
    assert not missing, "seed questions with no quiz item:\n  " + "\n  ".join(missing)


def test_seed_tags_in_every_item_exist_in_the_manifest(bank, manifest):
    unknown = sorted(
        f"{item.id}: {tag}"
        for item in bank.values()
        for tag in item.source
        if tag.startswith("seed:") and tag not in manifest
    )
    assert not unknown, "typo'd or unlisted seed tags:\n  " + "\n  ".join(unknown)


def test_bank_holds_at_least_240_items(bank):
    assert len(bank) >= 240


def _manifest_file() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def _cover_problem(cover: object, bank) -> str | None:
    """Why ``covered_by`` does not resolve, or None: a lab section or a bank item."""
    if not isinstance(cover, str):
        return "has no covered_by"
    if cover.startswith("item:"):
        return None if cover[5:] in bank else f"names no bank item: {cover}"
    m = re.fullmatch(r"lab:(\d{2})#([a-z0-9-]+)", cover)
    if not m:
        return f"covered_by {cover!r} is neither lab:NN#anchor nor item:<id>"
    anchors = _lab_anchors(m.group(1))
    if anchors is None or m.group(2) not in anchors:
        return f"points at a lab section that does not exist: {cover}"
    return None


def test_every_manifest_entry_is_covered_by_a_teaching_lab_section(bank):
    pages = _manifest_file()["manifest"]
    problems = [
        f"{e['tag']}: {problem}"
        for page in pages
        for e in page["entries"]
        if (problem := _cover_problem(e.get("covered_by"), bank))
    ]
    assert not problems, "\n  ".join(["manifest entries not covered:", *problems])


def test_every_interview_topic_has_sources_a_teaching_section_and_items(bank):
    topics = _manifest_file()["topics"]
    tags = [t["tag"] for t in topics]
    assert len(tags) == len(set(tags)) and all(t.startswith("topic:") for t in tags)
    problems = [
        f"{t['tag']}: {p}" for t in topics if (p := _cover_problem(t.get("covered_by"), bank))
    ]
    problems += [f"{t['tag']}: no sources" for t in topics if not t.get("sources")]
    tagged = {tag for item in bank.values() for tag in item.source}
    problems += [f"{t}: no item carries this tag" for t in tags if t not in tagged]
    unknown = sorted(
        f"{item.id}: {tag}"
        for item in bank.values()
        for tag in item.source
        if tag.startswith("topic:") and tag not in tags
    )
    problems += [f"unlisted topic tag {u}" for u in unknown]
    assert not problems, "\n  ".join(["interview topics:", *problems])
    on_topics = [i for i in bank.values() if any(tag in tags for tag in i.source)]
    assert len(on_topics) >= 60, f"only {len(on_topics)} items on the interview topics"


def test_every_topic_named_in_the_issue_has_items(bank):
    counts = Counter(item.topic for item in bank.values())
    empty = [name for name, topics in REQUIRED_TOPICS.items() if not any(counts[t] for t in topics)]
    assert not empty, f"topics without items: {empty}"
    thin = sorted(t for t in OWNED_TOPICS if counts[t] < 5)
    assert not thin, f"topics with fewer than 5 items: {thin}"


def test_kinds_and_difficulties_are_mixed(bank):
    kinds = Counter(item.kind for item in bank.values())
    short_of = {k: (kinds[k], n) for k, n in MIN_PER_KIND.items() if kinds[k] < n}
    assert not short_of, f"kinds below their minimum (have, need): {short_of}"
    levels = Counter(item.difficulty for item in owned(bank))
    assert min(levels[d] for d in ("easy", "medium", "hard")) >= 20, levels


def test_every_choice_explains_why_it_is_right_or_wrong(bank):
    lazy = [
        f"{item.id} choice {c.key}"
        for item in bank.values()
        for c in item.choices
        if len(c.why.split()) < 4 or c.why.strip() == c.text.strip()
    ]
    assert not lazy, f"choices whose 'why' does not explain: {lazy}"


def test_short_answers_have_a_full_rubric(bank):
    thin = [i.id for i in owned(bank) if i.kind == "short" and len(i.rubric) < 4]
    assert not thin, f"short items need mechanism/why/trade-off/mistake rubric points: {thin}"


def test_every_numeric_key_recomputes_and_its_unit_is_understood(bank):
    assert reference_problems(bank) == []
    bad_units = [
        f"{i.id}: {i.unit!r}"
        for i in owned(bank)
        if i.kind == "numeric" and split_unit(i.unit) is None
    ]
    assert not bad_units, f"units the answer parser cannot read: {bad_units}"


def _strings_that_look_like_numbers(value) -> list[str]:
    if isinstance(value, str):
        return [value] if re.fullmatch(r"[+-]?\d[\d_]*(\.\d*)?[eE][+-]?\d+", value) else []
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings_that_look_like_numbers(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings_that_look_like_numbers(v)]
    return []


def test_no_numeric_key_argument_is_a_number_yaml_read_as_text(bank):
    # PyYAML reads 7.0e9 and 70e9 as strings (YAML 1.1 wants 7.0e+9); a key would silently break.
    suspicious = [
        f"{item.id}: {s!r}"
        for item in bank.values()
        if item.kind == "numeric"
        for s in _strings_that_look_like_numbers([item.key.args, item.key.kwargs])
    ]
    assert not suspicious, f"write these as 7.0e+9 (dot and signed exponent): {suspicious}"


def _lab_anchors(number: str) -> set[str] | None:
    sources = sorted(SOLUTIONS.glob(f"{number}_*.py"))
    if not sources:
        return None
    text = sources[0].read_text()
    headings = re.findall(r"^# #+ (.+)$", text, flags=re.MULTILINE)
    slugs = {re.sub(r"[^a-z0-9]+", "-", h.lower()).strip("-") for h in headings}
    return slugs | set(re.findall(r'<a id="([a-z0-9-]+)"', text))


def test_lab_links_in_owned_items_point_at_existing_lab_sections(bank):
    dangling = []
    for item in owned(bank):
        if not item.link.startswith("lab:"):
            continue
        number, _, anchor = item.link[4:].partition("#")
        anchors = _lab_anchors(number)
        if anchors is None or (anchor and anchor not in anchors):
            dangling.append(f"{item.id}: {item.link}")
    assert not dangling, f"links to labs or sections that do not exist yet: {dangling}"


def test_manifest_file_is_outside_the_topic_folder():
    # The loader reads every *.yaml directly under quizzes/ as a topic; the manifest is not one.
    assert MANIFEST.parent != default_quiz_dir()
    assert not (default_quiz_dir() / "seed_manifest.yaml").exists()
    assert Path(MANIFEST).exists()
