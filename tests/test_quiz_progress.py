"""Progress records: one JSON line per attempt, whole under concurrent writers, torn lines skipped."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import stat

import pytest

from dtlab.quiz import attempt, learner_id, read_progress, record_attempt
from dtlab.quiz.progress import RECORD_FIELDS, append_record, install_salt

WRITERS, RECORDS_EACH = 4, 50


def _append_many(path: str, writer: int) -> None:
    for n in range(RECORDS_EACH):
        record_attempt(
            item=f"demo.w{writer}",
            topic="demo",
            kind="choice",
            correct=n % 2 == 0,
            score=float(n % 2 == 0),
            bank_version="v" * 200,  # long lines make interleaving visible if writes were split
            learner=f"writer {writer}",
            path=path,
        )


def test_concurrent_writers_lose_and_tear_nothing(tmp_path):
    path = tmp_path / "progress.jsonl"
    # fork starts in milliseconds; each child is a separate process with its own descriptor.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    writers = [context.Process(target=_append_many, args=(str(path), w)) for w in range(WRITERS)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(60)
        assert p.exitcode == 0
    progress = read_progress(path)
    assert progress.skipped_lines == []
    assert len(progress) == WRITERS * RECORDS_EACH
    per_item = {f"demo.w{w}": 0 for w in range(WRITERS)}
    for record in progress.records:
        per_item[record["item"]] += 1
    assert set(per_item.values()) == {RECORDS_EACH}


LEARNER = "Ada Quine"  # not made of hex digits, unlike "ada", which a random id may contain


def _write(path, **overrides):
    fields = dict(
        item="demo.a", topic="demo", kind="choice", correct=True, score=1.0, bank_version="abc"
    )
    fields.update(overrides)
    return record_attempt(path=path, learner=LEARNER, **fields)


def test_torn_last_line_is_skipped_reported_and_the_next_record_stays_whole(tmp_path):
    path = tmp_path / "progress.jsonl"
    _write(path)
    with open(path, "ab") as handle:  # a writer that crashed half-way through its line
        handle.write(b'{"ts": "2025-01-01", "learner": "h-1", "ite')
    with pytest.warns(UserWarning, match="skipped 1 unreadable line"):
        torn = read_progress(path)
    assert len(torn) == 1 and torn.skipped_lines == [2]
    _write(path, item="demo.b")
    with pytest.warns(UserWarning):
        after = read_progress(path)
    assert [r["item"] for r in after.records] == ["demo.a", "demo.b"]
    assert after.skipped_lines == [2]


def test_record_has_the_documented_fields_and_never_the_raw_name(tmp_path):
    path = tmp_path / "progress.jsonl"
    record = _write(path)
    assert set(RECORD_FIELDS) <= set(record)
    line = path.read_text()
    assert LEARNER not in line  # the id is hex: a name with other letters cannot appear by chance
    assert json.loads(line)["learner"] == learner_id(LEARNER)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT.*\+00:00", record["ts"])


def test_learner_ids_are_pseudonymous_and_stable(tmp_path):
    assert learner_id("Ada Lovelace") == learner_id("Ada Lovelace")
    assert learner_id("Ada Lovelace").startswith("s-") and "Ada" not in learner_id("Ada Lovelace")
    id_file = tmp_path / "learner_id"
    first = learner_id(id_file=id_file)
    assert first.startswith("r-") and learner_id(id_file=id_file) == first
    with pytest.raises(ValueError, match="learner name is empty"):
        learner_id("  ")


def test_read_progress_filters_by_learner_and_summarises(tmp_path):
    path = tmp_path / "progress.jsonl"
    _write(path)
    _write(path, item="demo.b", correct=False, score=0.0)
    record_attempt(
        item="demo.a", topic="demo", kind="choice", correct=True, score=1.0, bank_version="abc",
        learner="grace", path=path,
    )  # fmt: skip
    assert len(read_progress(path, learner=LEARNER)) == 2
    assert read_progress(path).summary() == {"demo": {"attempts": 3, "items": 2, "solved": 1}}
    assert len(read_progress(tmp_path / "absent.jsonl")) == 0


def test_attempt_grades_and_records_with_the_bank_version(tmp_path):
    path = tmp_path / "progress.jsonl"
    result = attempt("setup.rank_sum_value", "28", learner="ada", progress_path=path)
    assert result.correct
    (record,) = read_progress(path).records
    assert record["item"] == "setup.rank_sum_value" and record["topic"] == "setup"
    from dtlab.quiz import load_bank

    assert record["bank_version"] == load_bank().version


def test_named_ids_are_salted_per_install_and_stable_on_one(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "laptop"))
    first = learner_id("Ada Lovelace")
    assert first == learner_id("Ada Lovelace") and first.startswith("s-")
    unsalted = hashlib.sha256(b"Ada Lovelace").hexdigest()[:16]
    assert unsalted not in first  # hashing a guessed name no longer finds the learner
    salt_file = tmp_path / "laptop" / ".dtlab" / "salt"
    assert stat.S_IMODE(salt_file.stat().st_mode) == 0o600
    monkeypatch.setenv("HOME", str(tmp_path / "other_laptop"))
    assert learner_id("Ada Lovelace") != first


def test_a_damaged_salt_is_an_error_that_says_to_delete_it(tmp_path):
    salt_file = tmp_path / "salt"
    salt_file.write_text("not hex\n")
    with pytest.raises(ValueError, match="delete it"):
        install_salt(salt_file)


def _salt_after_barrier(home: str, barrier, results) -> None:
    os.environ["HOME"] = home
    barrier.wait()
    results.put(install_salt().hex())


def test_racing_processes_create_one_salt_and_agree(tmp_path):
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    barrier, results = context.Barrier(WRITERS), context.Queue()
    racers = [
        context.Process(target=_salt_after_barrier, args=(str(tmp_path), barrier, results))
        for _ in range(WRITERS)
    ]
    for p in racers:
        p.start()
    salts = {results.get(timeout=60) for _ in racers}
    for p in racers:
        p.join(60)
        assert p.exitcode == 0
    assert len(salts) == 1
    assert (tmp_path / ".dtlab" / "salt").read_text().strip() == salts.pop()
    assert [p.name for p in (tmp_path / ".dtlab").iterdir()] == ["salt"]  # no temp file left


def test_a_short_write_still_appends_the_whole_record(tmp_path, monkeypatch):
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))
    path = tmp_path / "progress.jsonl"
    append_record({"ts": "t", "learner": "r-1", "item": "demo.a", "topic": "demo",
                   "correct": True, "score": 1.0, "bank_version": "v" * 100}, path)  # fmt: skip
    monkeypatch.undo()
    (record,) = read_progress(path).records
    assert record["bank_version"] == "v" * 100


def test_a_recorded_answer_is_fsynced_before_the_call_returns(tmp_path, monkeypatch):
    learner_id("ada")  # the salt exists already: the only fsync left is the record's
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.fstat(fd).st_size))
    _write(tmp_path / "progress.jsonl")
    assert synced == [(tmp_path / "progress.jsonl").stat().st_size]
