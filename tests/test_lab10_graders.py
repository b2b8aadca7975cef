"""Lab 10's graders: hand-written resharding reads and atomic commits pass; the library's own
answers are refused; reads that miss, duplicate or overrun, and commits in the wrong order, fail
with a message that says what to change."""

from __future__ import annotations

import json
import os

from dtlab.checkpoint import plan_reads
from dtlab.checkpoint.commit import commit as library_commit
from dtlab.files import write_atomic
from dtlab.quiz import check_exercise
from dtlab.quiz.graders.checkpoint import async_interval_minutes_key, cluster_mtbf_hours_key


def hand_reads(pieces, want):
    lo, hi = want
    reads = []
    for i, (_file, first, end) in enumerate(pieces):
        a, b = max(first, lo), min(end, hi)
        if a < b:
            reads.append((i, a - first, b - first, a - lo))
    return reads


def test_a_hand_written_resharding_read_passes(cluster2):
    result = check_exercise("checkpointing.resharding_read", hand_reads, cluster2, record=False)
    assert result, result.message


def test_reading_every_piece_whole_is_refused_as_wrong(cluster2):
    def everything(pieces, want):
        return [(i, 0, end - first, first) for i, (_f, first, end) in enumerate(pieces)]

    result = check_exercise("checkpointing.resharding_read", everything, cluster2, record=False)
    assert not result and "outside this rank's" in result.message


def test_an_off_by_one_read_fails_with_the_rule(cluster2):
    def off_by_one(pieces, want):
        return [(i, s, e, d + 1 if d else d) for i, s, e, d in hand_reads(pieces, want)]

    result = check_exercise("checkpointing.resharding_read", off_by_one, cluster2, record=False)
    assert not result and ("overlap" in result.message or "outside" in result.message)


def test_the_library_planner_is_refused(cluster2):
    def wrapped(pieces, want):
        plan_reads({"tensors": {"x": {"global_shape": [1], "pieces": []}}}, "x", None)
        return hand_reads(pieces, want)

    result = check_exercise("checkpointing.resharding_read", wrapped, cluster2, record=False)
    assert not result and "dtlab.checkpoint.plan_reads" in result.message


def hand_commit(temp, final, metadata):
    write_atomic(temp / "metadata.json", metadata)  # temp file, fsync, rename
    os.rename(temp, final)
    fd = os.open(final.parent, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    write_atomic(final / "COMPLETE", json.dumps({"done": True}))


def test_a_hand_written_atomic_commit_passes(cluster2):
    result = check_exercise("checkpointing.atomic_commit", hand_commit, cluster2, record=False)
    assert result, result.message


def test_a_marker_written_before_the_rename_fails(cluster2):
    def marker_first(temp, final, metadata):
        write_atomic(temp / "metadata.json", metadata)
        (temp / "COMPLETE").write_text("yes")
        os.rename(temp, final)

    result = check_exercise("checkpointing.atomic_commit", marker_first, cluster2, record=False)
    assert not result and "COMPLETE existed before the rename" in result.message


def test_metadata_without_fsync_fails(cluster2):
    def no_fsync(temp, final, metadata):
        (temp / "metadata.json").write_bytes(metadata)
        os.rename(temp, final)
        (final / "COMPLETE").write_text("yes")

    result = check_exercise("checkpointing.atomic_commit", no_fsync, cluster2, record=False)
    assert not result and "fsync" in result.message


def test_a_commit_that_never_fsyncs_the_parent_after_the_rename_fails(cluster2):
    def no_parent_fsync(temp, final, metadata):
        write_atomic(temp / "metadata.json", metadata)
        os.rename(temp, final)
        write_atomic(final / "COMPLETE", json.dumps({"done": True}))

    result = check_exercise("checkpointing.atomic_commit", no_parent_fsync, cluster2, record=False)
    assert not result and "parent directory was not fsync'd" in result.message


def test_a_parent_fsync_only_after_the_marker_fails(cluster2):
    def late_fsync(temp, final, metadata):
        write_atomic(temp / "metadata.json", metadata)
        os.rename(temp, final)
        write_atomic(final / "COMPLETE", json.dumps({"done": True}))
        fd = os.open(final.parent, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    result = check_exercise("checkpointing.atomic_commit", late_fsync, cluster2, record=False)
    assert not result and "parent directory was not fsync'd" in result.message


def test_a_commit_that_never_renames_fails(cluster2):
    def copy_instead(temp, final, metadata):
        import shutil

        write_atomic(temp / "metadata.json", metadata)
        shutil.copytree(temp, final)
        (final / "COMPLETE").write_text("yes")

    result = check_exercise("checkpointing.atomic_commit", copy_instead, cluster2, record=False)
    assert not result and "never renamed" in result.message


def test_the_library_commit_is_refused(cluster2):
    def wrapped(temp, final, metadata):
        library_commit(temp, final, {"step": 3, **json.loads(metadata)})

    result = check_exercise("checkpointing.atomic_commit", wrapped, cluster2, record=False)
    assert not result and "dtlab.checkpoint.commit.commit" in result.message


def test_quiz_keys_come_from_the_reliability_model():
    assert round(cluster_mtbf_hours_key(5, 16384), 2) == 2.67
    assert async_interval_minutes_key(blocking_s=2, write_s=60, mtbf_hours=3) > 0
