"""Single-process checks of the checkpoint pieces: boxes, rank files, the commit protocol, the
sealed metadata, plain state dicts and the async save's handle."""

import json
import threading

import pytest
import torch

from dtlab.checkpoint import (
    AsyncCheckpointer,
    CheckpointError,
    CheckpointNotFound,
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
from dtlab.checkpoint.metadata import unsealed
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


def _trained_plain(seed=0):
    """A tiny model and AdamW after one step, as plain ``state_dict()`` s would save them."""
    torch.manual_seed(seed)
    model = _model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95))
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return model, opt


def _saved_plain(root, step=1):
    model, opt = _trained_plain()
    save(root, step, {"model": model.state_dict(), "optim": opt.state_dict()}, {"pos": step})
    return model, opt


def _flipped(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def test_every_single_bit_flip_of_metadata_json_is_an_error_naming_it(tmp_path):
    """All bits through the check ``load`` runs first (in memory: seconds); every 61st bit, and
    every bit of the ``step`` and ``world_size`` values (the flips that used to load silently),
    through ``load`` itself on the file."""
    _saved_plain(tmp_path, step=3)
    path = final_dir(tmp_path, 3) / "metadata.json"
    good = path.read_bytes()
    for bit in range(8 * len(good)):
        with pytest.raises(CheckpointError, match="metadata.json is corrupted"):
            unsealed(_flipped(good, bit), path)
    values = [good.index(b'"step": 3') + 8, good.index(b'"world_size": 1') + 14]
    assert [good[i : i + 1] for i in values] == [b"3", b"1"]
    through_load = {*range(0, 8 * len(good), 61), *(8 * i + b for i in values for b in range(8))}
    for bit in sorted(through_load):
        path.write_bytes(_flipped(good, bit))
        with pytest.raises(CheckpointError, match=r"metadata.json is corrupted"):
            load(tmp_path, {"model": _model(1).state_dict()})
    path.write_bytes(good)
    assert load(tmp_path, {"model": _model(1).state_dict()}).step == 3


def test_metadata_saved_before_the_seal_still_loads_and_a_respaced_one_is_refused(tmp_path):
    """A format-1 checkpoint (bare JSON, no CRC) written by an older dtlab loads as before."""
    a = _model(0)
    save(tmp_path, 1, replicated_state(a), {"pos": 1})
    path = final_dir(tmp_path, 1) / "metadata.json"
    meta = read_metadata(final_dir(tmp_path, 1))
    old = {"format": 1, **{k: meta[k] for k in ("step", "world_size", "tensors", "extras")}}
    path.write_text(json.dumps(old))  # exactly what the old commit wrote
    target = _model(5)
    assert load(tmp_path, replicated_state(target)).extra == {"pos": 1}
    assert all(torch.equal(p, q) for p, q in zip(target.parameters(), a.parameters(), strict=True))
    path.write_text(json.dumps(old).replace('"step": 1,', '"step":  1,'))
    with pytest.raises(CheckpointError, match="metadata.json is corrupted"):
        load(tmp_path, replicated_state(target))


def test_a_missing_or_empty_directory_is_checkpoint_not_found_naming_it(tmp_path):
    missing, empty = tmp_path / "never_saved", tmp_path / "empty"
    empty.mkdir()
    for root, what in ((missing, "does not exist"), (empty, "holds no complete checkpoint")):
        with pytest.raises(FileNotFoundError, match=f"{root} {what}") as caught:
            load(root, replicated_state(_model(0)))
        assert isinstance(caught.value, CheckpointNotFound)
        assert isinstance(caught.value, CheckpointError)
    save(tmp_path / "one", 1, replicated_state(_model(0)))
    with pytest.raises(CheckpointNotFound, match="no checkpoint for step 9 .* is step 1"):
        load(tmp_path / "one", replicated_state(_model(0)), step=9)


def test_a_plain_model_and_optimizer_state_dict_round_trip_bit_for_bit(tmp_path):
    model, opt = _saved_plain(tmp_path)
    fresh = _model(7)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.5)  # no state yet, other lr
    target = {"model": fresh.state_dict(), "optim": fresh_opt.state_dict()}
    assert target["optim"]["state"] == {}
    result = load(tmp_path, target)
    fresh.load_state_dict(target["model"])
    fresh_opt.load_state_dict(target["optim"])
    assert result.extra == {"pos": 1}
    for p, q in zip(fresh.parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q)
    want, got = opt.state_dict(), fresh_opt.state_dict()
    assert got["param_groups"] == want["param_groups"]  # lr 1e-2, betas (0.8, 0.95) restored
    assert set(got["state"]) == set(want["state"]) == {0, 1, 2, 3}
    for index, slots in want["state"].items():
        for key, value in slots.items():
            assert torch.equal(got["state"][index][key], value), (index, key)
    x = torch.randn(3, 4)  # the next step is the same step
    for m, o in ((model, opt), (fresh, fresh_opt)):
        o.zero_grad()
        m(x).sum().backward()
        o.step()
    assert all(
        torch.equal(p, q) for p, q in zip(fresh.parameters(), model.parameters(), strict=True)
    )


def test_a_plain_target_stays_untouched_when_a_piece_fails_its_crc(tmp_path):
    _saved_plain(tmp_path)
    rank_file = final_dir(tmp_path, 1) / "rank_0.bin"
    data = bytearray(rank_file.read_bytes())
    data[-1] ^= 0x01  # the pickled structure of the optimizer: the last piece rank 0 writes
    rank_file.write_bytes(bytes(data))
    fresh, fresh_opt = _model(7), torch.optim.AdamW(_model(7).parameters())
    target = {"model": fresh.state_dict(), "optim": fresh_opt.state_dict()}
    before = {k: v.clone() for k, v in target["model"].items()}
    with pytest.raises(CheckpointError, match=r"rank_0.bin is corrupted: tensor '__objects__'"):
        load(tmp_path, target)
    assert target["optim"]["state"] == {}
    assert all(torch.equal(v, before[k]) for k, v in target["model"].items())


def test_a_plain_model_missing_a_saved_parameter_is_refused(tmp_path):
    _saved_plain(tmp_path)
    smaller = torch.nn.Sequential(torch.nn.Linear(4, 3))
    with pytest.raises(CheckpointError, match=r"holds tensor 'model/1.weight' that the model"):
        load(tmp_path, {"model": smaller.state_dict()})


def test_async_save_returns_a_handle_that_blocks_until_the_checkpoint_is_committed(tmp_path):
    model, opt = _trained_plain()
    release = threading.Event()
    saver = AsyncCheckpointer(tmp_path)
    handle = saver.save(
        4, {"model": model.state_dict(), "optim": opt.state_dict()}, {"pos": 4}, release.wait
    )
    assert not handle.done() and saver.busy
    with pytest.raises(TimeoutError, match="step 4 is still being written"):
        handle.result(timeout=0.05)
    assert complete_checkpoints(tmp_path) == []
    release.set()
    assert handle.result() == final_dir(tmp_path, 4) == handle.wait()
    assert handle.done() and not saver.busy and complete_checkpoints(tmp_path) == [4]
    fresh = _model(9)
    assert load(tmp_path, {"model": fresh.state_dict()}).extra == {"pos": 4}
    assert all(
        torch.equal(p, q) for p, q in zip(fresh.parameters(), model.parameters(), strict=True)
    )


def test_a_failing_async_write_surfaces_through_the_handle_and_commits_nothing(tmp_path):
    def disk_full():
        raise OSError(28, "No space left on device")

    saver = AsyncCheckpointer(tmp_path)
    handle = saver.save(2, replicated_state(_model(0)), before_flag=disk_full)
    for _ in range(2):  # every call re-raises, as a future's result() does
        with pytest.raises(OSError, match="No space left"):
            handle.result()
    assert handle.done() and complete_checkpoints(tmp_path) == []
    with pytest.raises(OSError, match="No space left"):
        saver.wait()
    saver.wait()  # reported once by the checkpointer; the next save may go ahead
    assert saver.save(3, replicated_state(_model(0))).result() == final_dir(tmp_path, 3)
