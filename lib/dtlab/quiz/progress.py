"""Every attempt, one JSON line each, in an append-only progress file (default ``~/.dtlab/progress.jsonl``).

A line holds ``ts`` (UTC, ISO 8601), ``learner``, ``item``, ``topic``, ``correct``, ``score`` and
``bank_version`` (plus ``kind``: the item's kind, or ``"exercise"``). An attempt at a ``choice`` or
``multi`` item also records ``chosen``, the option keys picked, and ``shown``, the option keys in
the order they were displayed (:mod:`dtlab.quiz.shuffle`): keys, the options' identity, never
displayed positions, so a record means the same whatever order the learner saw. Both are optional;
files written before them read as before. The learner is a
pseudonym, never a name: a random id created once in ``~/.dtlab/learner_id``, or, when a name is
given (a workshop seat), ``"s-"`` + an HMAC-SHA-256 prefix of the name keyed with this install's
secret salt (``~/.dtlab/salt``, random, created once, readable only by you). Without the salt a
name cannot be recovered by hashing guesses; the price is that one name gets a *different* id on
every install (the same id on every run of one install). Ids ``"h-..."`` written by dtlab before
the salt (an unsalted SHA-256 of the name) are still read, but no longer match a name.

Safe with many writers: each record is written on an ``O_APPEND`` descriptor while holding an
exclusive ``fcntl.flock`` (a short write is finished before the lock is released), so lines never
interleave, and ``fsync``-ed before the call returns, so a recorded answer survives a power cut.
A writer that died mid-line leaves a torn last line; the next writer first starts a fresh line
(so its record stays whole), and :func:`read_progress` skips unreadable lines and reports them
instead of failing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from dtlab.files import create_once, write_all, write_atomic

try:
    import fcntl
except ImportError:  # Windows: O_APPEND single writes still keep lines whole on local disks
    fcntl = None

RECORD_FIELDS = ("ts", "learner", "item", "topic", "correct", "score", "bank_version")
SALT_BYTES = 32
ID_PREFIXES = ("s-", "r-", "h-")  # salted name hash, random machine id, unsalted (older dtlab)


def dtlab_home() -> Path:
    return Path.home() / ".dtlab"


def default_progress_path() -> Path:
    return dtlab_home() / "progress.jsonl"


def install_salt(path: str | Path | None = None) -> bytes:
    """This install's secret salt for learner names, created on first use (random, mode 0600).

    Created with :func:`~dtlab.files.create_once`, so two processes starting at once agree on it.
    """
    path = Path(path) if path is not None else dtlab_home() / "salt"
    text = create_once(path, (secrets.token_hex(SALT_BYTES) + "\n").encode()).decode().strip()
    try:
        salt = bytes.fromhex(text)
    except ValueError:
        salt = b""
    if len(salt) != SALT_BYTES:
        raise ValueError(
            f"{path} is damaged (expected {2 * SALT_BYTES} hex digits); delete it and dtlab makes "
            "a new one — names used on shared seats then get new learner ids"
        )
    return salt


def learner_id(name: str | None = None, id_file: str | Path | None = None) -> str:
    """A pseudonymous learner id: a salted hash of ``name`` if given, else this machine's random id."""
    if name is not None:
        if not name.strip():
            raise ValueError("learner name is empty; pass None to use this machine's random id")
        digest = hmac.new(install_salt(), name.strip().encode(), hashlib.sha256).hexdigest()
        return "s-" + digest[:16]
    path = Path(id_file) if id_file is not None else dtlab_home() / "learner_id"
    existing = create_once(path, ("r-" + secrets.token_hex(8) + "\n").encode()).decode().strip()
    if existing:
        return existing
    # An empty file left by a dtlab older than create_once, killed between creating and writing.
    write_atomic(path, "r-" + secrets.token_hex(8) + "\n")
    return path.read_text().strip()


def append_record(record: dict, path: str | Path | None = None) -> Path:
    """Append ``record`` as one JSON line, atomically with respect to other writers."""
    path = Path(path) if path is not None else default_progress_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # close a torn line left by a crashed writer
        write_all(fd, line)
        os.fsync(fd)  # the answer is on disk before the learner sees "recorded"
    finally:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    return path


def record_attempt(
    *,
    item: str,
    topic: str,
    correct: bool,
    score: float,
    bank_version: str | None,
    kind: str,
    learner: str | None = None,
    path: str | Path | None = None,
    chosen: Sequence[str] | None = None,
    shown: Sequence[str] | None = None,
) -> dict:
    """Build and append one attempt record; ``learner`` is a name (salted hash) or None (machine id).

    ``chosen`` / ``shown``: option keys picked and displayed, for choice/multi items (module
    docstring); left out of the record when None.
    """
    record = {
        "ts": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "learner": learner_id(learner),
        "item": item,
        "topic": topic,
        "kind": kind,
        "correct": bool(correct),
        "score": round(float(score), 4),
        "bank_version": bank_version,
    }
    if chosen is not None:
        record["chosen"] = list(chosen)
    if shown is not None:
        record["shown"] = list(shown)
    append_record(record, path)
    return record


def option_fields(item, response: object, order=None) -> dict:
    """``{"chosen": [...], "shown": [...]}`` for a choice/multi attempt, ``{}`` for other kinds.

    ``response`` is graded input in option keys (``"b"``, ``["a", "c"]`` or ``"a c"``), matched to
    the item's keys case-insensitively; ``order`` the :class:`~dtlab.quiz.shuffle.OptionOrder`
    shown (None: written order).
    """
    if item.kind not in ("choice", "multi"):
        return {}
    typed = response.replace(",", " ").split() if isinstance(response, str) else list(response)
    keys = {c.key.lower(): c.key for c in item.choices}
    chosen = [keys.get(str(k).strip().lower(), str(k)) for k in typed]
    shown = list(order.keys) if order is not None and order.keys else list(keys.values())
    return {"chosen": chosen, "shown": shown}


@dataclass
class Progress:
    """The readable records of a progress file, and the line numbers that were skipped."""

    records: list[dict] = field(default_factory=list)
    skipped_lines: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)

    def summary(self) -> dict[str, dict]:
        """Per topic: attempts, distinct items tried, items answered correctly at least once."""
        by_topic: dict[str, dict] = {}
        for r in self.records:
            entry = by_topic.setdefault(
                r["topic"], {"attempts": 0, "items": set(), "solved": set()}
            )
            entry["attempts"] += 1
            entry["items"].add(r["item"])
            if r["correct"]:
                entry["solved"].add(r["item"])
        return {
            topic: {"attempts": e["attempts"], "items": len(e["items"]), "solved": len(e["solved"])}
            for topic, e in by_topic.items()
        }


def read_progress(path: str | Path | None = None, learner: str | None = None) -> Progress:
    """All readable records (optionally one learner's: a name or a pseudonymous id).

    Lines that are not complete JSON records — a write torn by a crash — are skipped, listed in
    ``skipped_lines`` (1-based) and reported with a warning; nothing else is lost.
    """
    path = Path(path) if path is not None else default_progress_path()
    progress = Progress()
    if not path.exists():
        return progress
    wanted = (
        None
        if learner is None
        else (learner if learner[:2] in ID_PREFIXES else learner_id(learner))
    )
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            if not isinstance(record, dict) or any(f not in record for f in RECORD_FIELDS):
                raise ValueError("not a progress record")
        except ValueError:
            progress.skipped_lines.append(number)
            continue
        if wanted is None or record["learner"] == wanted:
            progress.records.append(record)
    if progress.skipped_lines:
        warnings.warn(
            f"{path}: skipped {len(progress.skipped_lines)} unreadable line(s) "
            f"{progress.skipped_lines} (a write interrupted by a crash); the other records are intact",
            stacklevel=2,
        )
    return progress
