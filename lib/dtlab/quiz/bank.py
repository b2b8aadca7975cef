"""The question bank: ``quizzes/<topic>.yaml`` files, loaded and checked into :class:`Item` objects.

File layout — one topic per file, the file named after the topic::

    topic: zero                  # must equal the file name (quizzes/zero.yaml)
    title: ZeRO and FSDP         # optional, shown by the CLI
    items:
      - id: zero.stage2_bytes    # dotted lowercase, starting with the topic; unique across files
        kind: numeric            # choice | multi | numeric | ordering | short | code
        difficulty: medium       # easy | medium | hard (easy = first contact, hard = interview deep-dive)
        source: [seed:004#zero-table]   # tags naming the interview topic/seed question it covers
        link: lab:03#zero-stages        # the lab section that teaches it (never a library symbol)
        see: dtlab.memory.formulas:model_state_bytes   # optional: the symbol that computes it
        prompt: ...              # markdown; $math$ renders in the notebook
        explanation: ...         # why the right answer is right (shown after every attempt)
        # ... plus the kind's own fields below. Unknown fields are errors (typos get a suggestion).

Kinds and their fields:

``choice`` / ``multi``
    ``choices``: a list of ``{key, text, correct, why}``. ``key`` defaults to a, b, c, … by
    position; ``correct`` defaults to false; ``why`` is required on *every* choice (why it is
    right, or why a learner might pick it and why it is wrong). ``choice`` has exactly one
    correct option; ``multi`` at least one and is scored by the fraction of options judged
    right (fully correct only when every option is). Options are shown shuffled per learner
    (:mod:`dtlab.quiz.shuffle`) unless ``shuffle: false``, for options whose order means
    something ("All of the above").
``numeric``
    ``key: {call: "dtlab.module:function", args: [...], kwargs: {...}, scale: 1e-9, pick: field}``
    — the answer is *computed*, never typed: ``scale * pick(call(*args, **kwargs))``. Only
    ``dtlab`` functions may be called; an argument written as ``{call: ..., kwargs: ...}`` is
    computed first (e.g. a config dataclass). ``unit`` is the unit the answer is asked in
    ("GB", "s", "%", "" for a plain number). ``tolerance: {rel: 0.01, abs: 0.5}`` passes a
    response within either bound; omitted means exact. A literal ``answer`` is an error here.
``ordering``
    ``steps``: a list of ``{key, text}`` in the order shown (scrambled — listing them already in
    order is an error); ``answer``: the step keys in the correct order. Score = fraction of step
    pairs in the right relative order.
``short``
    ``answer``: the model answer text; ``rubric``: the points a good spoken answer hits
    (mechanism, why it matters, trade-offs, a common mistake). The learner ticks the points they
    made; score = fraction ticked, correct when all are.
``code``
    ``exercise``: an id from the exercise registry (:mod:`dtlab.quiz.exercises`); the learner's
    function runs on a Cluster and is compared with the reference.

Loading checks structure only (fast, imports nothing);
:func:`dtlab.quiz.references.reference_problems` also resolves numeric keys, ``see`` symbols
and exercise ids, and the test suite runs it on the bank.
``Bank.version`` is a hash of the files' contents, recorded with every attempt.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import yaml

from dtlab.quiz.parse import parse_item
from dtlab.quiz.schema import BankError, Item


def default_quiz_dir() -> Path:
    """The repository's ``quizzes/`` folder, found relative to this source file (src layout)."""
    return Path(__file__).resolve().parents[3] / "quizzes"


class Bank(Mapping[str, Item]):
    """Items by id, in file order, with the hash of the files they came from."""

    def __init__(
        self, items: list[Item], version: str, files: tuple[Path, ...], titles: dict[str, str]
    ):
        self._items = {item.id: item for item in items}
        self.version = version
        self.files = files
        self.titles = titles

    def __getitem__(self, item_id: str) -> Item:
        try:
            return self._items[item_id]
        except KeyError:
            close = difflib.get_close_matches(item_id, list(self._items), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise KeyError(f"no quiz item {item_id!r} in the bank{hint}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def topics(self) -> list[str]:
        """Topics in file order."""
        return list(dict.fromkeys(item.topic for item in self._items.values()))

    def items_for(self, topic: str, difficulty: str | None = None) -> list[Item]:
        """The items of ``topic`` (optionally only one difficulty), easiest first, else file order."""
        if topic not in self.topics():
            raise KeyError(f"no quiz topic {topic!r}; topics are {', '.join(self.topics())}")
        chosen = [i for i in self._items.values() if i.topic == topic]
        if difficulty is not None:
            chosen = [i for i in chosen if i.difficulty == difficulty]
        return sorted(chosen, key=lambda i: i.difficulty_rank)

    def __repr__(self) -> str:
        return f"Bank({len(self)} items, topics={self.topics()}, version={self.version!r})"


def _yaml_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
    raise BankError([f"{path}: no such quiz file or folder; pass load_bank(path) explicitly"])


def _version_of(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def bank_version(path_or_dir: str | Path | None = None) -> str | None:
    """The hash :func:`load_bank` would give, without parsing; None when there is no bank."""
    try:
        return _version_of(_yaml_files(Path(path_or_dir) if path_or_dir else default_quiz_dir()))
    except (BankError, OSError):
        return None


def load_bank(path_or_dir: str | Path | None = None) -> Bank:
    """Load and check every ``*.yaml`` under ``path_or_dir`` (default: the repo's ``quizzes/``).

    Raises :class:`BankError` listing every problem, each naming the file and item id.
    """
    root = Path(path_or_dir) if path_or_dir is not None else default_quiz_dir()
    files = _yaml_files(root)
    base = (root if root.is_dir() else root.parent).parent
    problems: list[str] = []
    items: list[Item] = []
    first_file_of: dict[str, str] = {}
    titles: dict[str, str] = {}
    for file in files:
        label = file.relative_to(base).as_posix() if file.is_relative_to(base) else str(file)
        try:
            data = yaml.safe_load(file.read_bytes())
        except yaml.YAMLError as error:
            problems.append(f"{label}: not valid YAML: {error}")
            continue
        if (
            not isinstance(data, dict)
            or set(data) - {"topic", "title", "items"}
            or "items" not in data
        ):
            problems.append(
                f"{label}: the file must be a mapping with 'topic', optional 'title' and 'items'"
            )
            continue
        topic = data.get("topic")
        if topic != file.stem:
            problems.append(
                f"{label}: declares topic {topic!r}; it must equal the file name {file.stem!r}"
            )
            continue
        titles[topic] = str(data.get("title", topic))
        if not isinstance(data["items"], list):
            problems.append(f"{label}: 'items' must be a list")
            continue
        for index, raw in enumerate(data["items"]):
            item = parse_item(raw, label, topic, index, problems)
            if item is None:
                continue
            if item.id in first_file_of:
                problems.append(
                    f"{label}: item {item.id!r}: duplicate id, already defined in {first_file_of[item.id]}"
                )
                continue
            first_file_of[item.id] = label
            items.append(item)
    if problems:
        raise BankError(problems)
    return Bank(items, _version_of(files), tuple(files), titles)


_cached: dict[Path, Bank] = {}


def cached_bank(path_or_dir: str | Path | None = None) -> Bank:
    """:func:`load_bank`, reused until a file under the path changes (its version moves)."""
    root = (Path(path_or_dir) if path_or_dir is not None else default_quiz_dir()).resolve()
    version = bank_version(root)
    if root not in _cached or _cached[root].version != version:
        _cached[root] = load_bank(root)
    return _cached[root]
