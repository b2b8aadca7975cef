"""Single-process checks of the checkpoint pieces: boxes, rank files, the commit protocol."""

import json

import pytest
import torch

from dtlab.checkpoint import (
    CheckpointError,
    complete_checkpoints,
    copy_overlap,
    flat_range,
    load,
    read_metadata,
    replicated_state,
    save,
    split_along,
    whole,
)
from dtlab.checkpoint.commit import begin, final_dir
from dtlab.checkpoint.slices import flat_indices
from dtlab.checkpoint.storage import read_piece, write_pieces

SHAPE = (4, 6)
BOXES = [
    whole(SHAPE),
    flat_range(SHAPE, 5, 17),
    flat_range(SHAPE, 0, 3),
    split_along(SHAPE, 0, 1, 2),
    split_along(SHAPE, 1, 2, 3),
]


def _piece(box):
    full = torch.arange(24.0).reshape(SHAPE)
    return full.reshape(-1)[flat_indices(box)].reshape(box.lengths)


@pytest.mark.parametrize("src", BOXES)
@pytest.mark.parametrize("dest", BOXES)
def test_copy_overlap_moves_exactly_the_shared_elements(src, dest):
    out = torch.full(dest.lengths, -1.0)
    copied = copy_overlap(out, dest, _piece(src), src)
    shared = set(flat_indices(src).tolist()) & set(flat_indices(dest).tolist())
    assert copied == len(shared)
    filled = out != -1
    assert int(filled.sum()) == len(shared)
    assert torch.equal(out[filled], _piece(dest)[filled])


def test_box_outside_the_tensor_is_refused():
    with pytest.raises(ValueError, match="outside"):
        flat_range(SHAPE, 20, 30)
    with pytest.raises(ValueError, match="equal parts"):
        split_along(SHAPE, 1, 0, 4)


def test_rank_file_detects_truncation_and_flipped_bytes(tmp_path):
    path = tmp_path / "rank_0.bin"
    entries = write_pieces(
        path, [("a", torch.arange(6.0)), ("b", torch.ones(3, dtype=torch.bfloat16))]
    )
    assert torch.equal(read_piece(path, entries[1]), torch.ones(3, dtype=torch.bfloat16))
    data = bytearray(path.read_bytes())
    data[3] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"corrupted: tensor 'a'"):
        read_piece(path, entries[0])
    path.write_bytes(bytes(data[:20]))
    with pytest.raises(CheckpointError, match=r"truncated: tensor 'b'"):
        read_piece(path, entries[1])


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def test_newest_complete_checkpoint_wins_and_partial_ones_are_skipped(tmp_path):
    a, b = _model(0), _model(1)
    save(tmp_path, 1, replicated_state(a), {"pos": 1})
    save(tmp_path, 2, replicated_state(b), {"pos": 2})
    (final_dir(tmp_path, 2) / "COMPLETE").unlink()  # crashed between rename and marker
    begin(tmp_path, 3, "deadjob")  # a temporary directory left by a job that died
    assert complete_checkpoints(tmp_path) == [1]
    target = _model(5)
    result = load(tmp_path, replicated_state(target))
    assert result.step == 1 and result.extra == {"pos": 1}
    assert all(torch.equal(p, q) for p, q in zip(target.parameters(), a.parameters(), strict=True))
    with pytest.raises(
        CheckpointError, match="step 2 .* incomplete .*newest complete one is step 1"
    ):
        load(tmp_path, replicated_state(target), step=2)


def test_a_directory_being_written_by_a_live_job_is_refused(tmp_path):
    temp = begin(tmp_path, 7, "otherjob")  # OWNER records this (live) process
    owner = json.loads((temp / "OWNER").read_text())
    assert owner["job"] == "otherjob"
    with pytest.raises(CheckpointError, match="being written by another job"):
        begin(tmp_path, 7, "myjob")
    with pytest.raises(CheckpointError, match="incomplete"):
        load(tmp_path, replicated_state(_model(0)), step=7)


def test_shape_mismatch_names_the_tensor_and_the_fix(tmp_path):
    save(tmp_path, 1, replicated_state(_model(0)))
    wrong = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 2))
    with pytest.raises(CheckpointError, match=r"shape mismatch for tensor 'model/0.weight'"):
        load(tmp_path, replicated_state(wrong))


def test_saving_over_a_committed_step_is_refused(tmp_path):
    save(tmp_path, 1, replicated_state(_model(0)))
    with pytest.raises(CheckpointError, match="already exists"):
        save(tmp_path, 1, replicated_state(_model(0)))


def test_a_failed_load_leaves_the_model_untouched(tmp_path):
    save(tmp_path, 1, replicated_state(_model(0)))
    rank_file = final_dir(tmp_path, 1) / "rank_0.bin"
    (piece,) = read_metadata(final_dir(tmp_path, 1))["tensors"]["model/1.bias"]["pieces"]
    data = bytearray(rank_file.read_bytes())
    data[piece["offset"]] ^= 0xFF  # the last tensor: every earlier one would load fine
    rank_file.write_bytes(bytes(data))
    target = _model(3)
    before = [p.detach().clone() for p in target.parameters()]
    with pytest.raises(CheckpointError, match=r"rank_0.bin is corrupted: tensor 'model/1.bias'"):
        load(tmp_path, replicated_state(target))
    assert all(torch.equal(p, q) for p, q in zip(target.parameters(), before, strict=True))
