"""Sharded checkpoints on real ranks: resharding across layouts, async saves and their handles,
plain state dicts, bad inputs, and side-by-side parity with torch.distributed.checkpoint from a
``fully_shard`` model."""

import threading

import pytest
import torch

import dtlab
from dtlab.checkpoint import (
    CheckpointError,
    fsdp_state,
    load,
    prepare_optimizer_state,
    read_metadata,
    replicated_state,
)
from dtlab.checkpoint.commit import final_dir
from dtlab.checkpoint.slices import flat_indices
from dtlab.models import GPT, GPTConfig

CONFIG = GPTConfig.tiny(d_model=32, n_layers=2)


@pytest.fixture
def cluster(cluster2):
    return cluster2


def _train_fsdp(units_default=True, steps=2, seed=0):
    from dtlab.models import SyntheticTokens, loss_fn, shard_for_rank
    from dtlab.parallel import FullyShardedDataParallel

    model = GPT(CONFIG, seed=seed)
    fsdp = FullyShardedDataParallel(model, units=None if units_default else [])
    opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-2)
    data = SyntheticTokens(CONFIG, steps, 4, seed=seed)
    for x, y in data:
        x, y = shard_for_rank((x, y), dtlab.rank(), dtlab.world_size())
        loss_fn(fsdp(x), y).backward()
        opt.step()
        opt.zero_grad()
    return fsdp, opt


def _full_fsdp(fsdp, opt) -> dict:
    from dtlab.parallel.zero.full_state import gather_full_tensors

    out = {f"model/{k}": v for k, v in gather_full_tensors(fsdp, lambda p: p.detach()).items()}
    for key in ("exp_avg", "exp_avg_sq"):
        full = gather_full_tensors(fsdp, lambda p, k=key: opt.state[p][k])
        out.update({f"optim/{n}/{key}": v for n, v in full.items()})
    return out


def _save_then_reshard(root):
    """Save from FSDP (one unit per block), load into FSDP (one root unit) and into TP=2."""
    from dtlab.checkpoint import save, tensor_parallel_state
    from dtlab.mesh import Mesh
    from dtlab.parallel import FullyShardedDataParallel, parallelize_gpt

    fsdp, opt = _train_fsdp()
    saved = _full_fsdp(fsdp, opt)
    save(root, 2, fsdp_state(fsdp, opt), {"rank": dtlab.rank()})
    meta = read_metadata(final_dir(root, 2))

    other = FullyShardedDataParallel(GPT(CONFIG, seed=7), units=[])
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-2)
    state = prepare_optimizer_state(fsdp_state(other, other_opt), other.module, other_opt, meta)
    result = load(root, state)
    fsdp_equal = all(torch.equal(v, saved[k]) for k, v in _full_fsdp(other, other_opt).items())

    model = GPT(CONFIG, seed=7)
    parallelize_gpt(model, Mesh(tp=2))
    tp_opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tp_state = prepare_optimizer_state(tensor_parallel_state(model, tp_opt), model, tp_opt, meta)
    load(root, tp_state)
    tp_mismatch = []
    for name, local in tp_state.items():
        if name in saved:
            want = saved[name].reshape(-1)[flat_indices(local.box)]
            if not torch.equal(local.tensor.reshape(-1), want):
                tp_mismatch.append(name)
    sharded_tp = sum(1 for v in tp_state.values() if not v.replicated)
    return {
        "fsdp_equal": fsdp_equal,
        "tp_mismatch": tp_mismatch,
        "tp_sharded_pieces": sharded_tp,
        "extra": result.extra,
        "read": result.bytes_read,
        "total": result.bytes_in_checkpoint,
        "saved": saved if dtlab.rank() == 0 else None,
    }


def test_fsdp_checkpoint_loads_into_other_fsdp_units_tensor_parallel_and_one_process(
    cluster, tmp_path
):
    out = cluster.run(_save_then_reshard, str(tmp_path))
    for r, o in enumerate(out):
        assert o["fsdp_equal"], f"rank {r}: FSDP with other units loaded different values"
        assert o["tp_mismatch"] == [], f"rank {r}: TP pieces differ: {o['tp_mismatch']}"
        assert o["tp_sharded_pieces"] > 0
        assert o["extra"] == {"rank": r}
        assert o["read"] < o["total"]  # each rank read only the slices it needed
    saved = out[0]["saved"]
    model = GPT(CONFIG, seed=9)
    opt = torch.optim.AdamW(model.parameters())
    meta = read_metadata(final_dir(tmp_path, 2))
    state = prepare_optimizer_state(replicated_state(model, opt), model, opt, meta)
    result = load(tmp_path, state)
    assert result.bytes_read == result.bytes_in_checkpoint  # one process needs every piece
    for name, local in state.items():
        if name in saved:
            assert torch.equal(local.tensor, saved[name]), name


def _save_fsdp(root):
    from dtlab.checkpoint import save

    fsdp, opt = _train_fsdp()
    save(root, 2, fsdp_state(fsdp, opt), {"rank": dtlab.rank()})
    full = _full_fsdp(fsdp, opt)
    return full if dtlab.rank() == 0 else None


def _bytes_opened(fn):
    """Run ``fn()``, counting the bytes actually read from checkpoint files (by the reader's own
    ``open``, not by the library's counter)."""
    import builtins

    import dtlab.checkpoint.storage as storage

    count = [0]

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def seek(self, *a):
            return self.f.seek(*a)

        def read(self, *a):
            data = self.f.read(*a)
            count[0] += len(data)
            return data

    storage.open = lambda *a, **k: Counting(builtins.open(*a, **k))  # noqa: SIM115
    try:
        out = fn()
    finally:
        del storage.open
    return out, count[0]


def _needed_bytes(meta: dict, state) -> int:
    """Bytes of the stored pieces that overlap what ``state`` wants, by hand: flat ranges
    intersect when each starts before the other ends; a whole tensor needs every piece."""
    needed = {}
    for name, local in state.items():
        for e in meta["tensors"][name]["pieces"]:
            if not e["box"]["flat"]:  # a replicated piece: the whole tensor
                hit = local.box.numel > 0
            elif local.box.flat:
                a, b = e["box"]["offsets"][0], e["box"]["offsets"][0] + e["box"]["lengths"][0]
                c, d = local.box.offsets[0], local.box.offsets[0] + local.box.lengths[0]
                hit = a < d and c < b
            else:
                hit = e["box"]["lengths"][0] > 0
            if hit:
                needed[(e["file"], e["offset"])] = e["nbytes"]
    return sum(needed.values())


def _load_fsdp(root):
    """Load the 4-rank FSDP checkpoint into FSDP on this cluster's ranks and into TP."""
    from dtlab.checkpoint import tensor_parallel_state
    from dtlab.mesh import Mesh
    from dtlab.parallel import FullyShardedDataParallel, parallelize_gpt

    fsdp = FullyShardedDataParallel(GPT(CONFIG, seed=3))
    opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-2)
    meta = read_metadata(final_dir(root, 2))
    state = prepare_optimizer_state(fsdp_state(fsdp, opt), fsdp.module, opt, meta)
    result, opened = _bytes_opened(lambda: load(root, state))
    extra_bytes = meta["extras"][str(dtlab.rank())]["nbytes"]
    model = GPT(CONFIG, seed=8)
    parallelize_gpt(model, Mesh(tp=dtlab.world_size()))
    tp_opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tp_state = prepare_optimizer_state(tensor_parallel_state(model, tp_opt), model, tp_opt, meta)
    load(root, tp_state)
    tp = {k: (v.tensor.clone(), flat_indices(v.box), v.replicated) for k, v in tp_state.items()}
    return {
        "full": _full_fsdp(fsdp, opt),
        "extra": result.extra,
        "opened": opened,
        "needed": _needed_bytes(meta, state) + extra_bytes,
        "counted": result.bytes_read + extra_bytes,
        "total": result.bytes_in_checkpoint,
        "tp": tp,
    }


def test_fsdp_on_four_ranks_reloads_on_two_with_weights_and_adam_state_equal(
    cluster4, cluster2, tmp_path
):
    """dp=4 -> dp=2 and dp=4 -> tp=2: weights and both Adam moments equal the saved ones,
    and each rank reads exactly the bytes of the stored pieces its slices overlap."""
    saved = cluster4.run(_save_fsdp, str(tmp_path))[0]
    for rank, out in enumerate(cluster2.run(_load_fsdp, str(tmp_path))):
        assert out["extra"] == {
            "rank": rank
        }  # new rank r gets saved rank r's extra (RNG, position)
        assert out["opened"] == out["needed"] == out["counted"] < out["total"], rank
        assert set(out["full"]) == set(saved)
        for name, value in out["full"].items():
            assert torch.equal(value, saved[name]), f"rank {rank}: {name}"
        sharded = [k for k, (_, _, replicated) in out["tp"].items() if not replicated]
        assert any(k.startswith("optim/") for k in sharded) and any(
            k.startswith("model/") for k in sharded
        )
        for name, (tensor, index, _) in out["tp"].items():
            if name in saved:
                assert torch.equal(tensor.reshape(-1), saved[name].reshape(-1)[index]), name


def _async_save_while_training(root):
    """Each background write is held until training has stepped (mutating the live weights and
    the ``extra`` dict); the second save is called while the first write is still held, so it
    must wait for it before refilling the reused snapshot buffers. Each checkpoint must still
    hold the values at its own snapshot."""
    import dtlab.checkpoint.async_save as background
    from dtlab.checkpoint import AsyncCheckpointer
    from dtlab.trace import span

    fsdp, opt = _train_fsdp()
    before = _full_fsdp(fsdp, opt)
    release = [threading.Event(), threading.Event()]
    entered = [threading.Event(), threading.Event()]
    calls = iter(range(2))
    real_write = background.write_rank

    def held_write(*args, **kwargs):  # the writer thread, before it touches any byte
        k = next(calls)
        entered[k].set()
        release[k].wait(30)
        return real_write(*args, **kwargs)

    def train_step():
        with span("train_step", kind="compute"):
            for p in fsdp.parameters():
                p.grad = torch.ones_like(p)
            opt.step()

    background.write_rank = held_write
    saver = AsyncCheckpointer(root)
    state = fsdp_state(fsdp, opt)
    extra = {"next_batch": 2}
    try:
        saver.save(2, state, extra)
        entered[0].wait(30)  # the write has started (its span is open) ...
        train_step()  # ... and training goes on: weights and extra change under it
        extra["next_batch"] = 3
        changed = not torch.equal(
            _full_fsdp(fsdp, opt)["model/embed.weight"], before["model/embed.weight"]
        )
        middle = _full_fsdp(fsdp, opt)
        buffers = {k: t.data_ptr() for k, t in saver._buffers.items()}
        threading.Timer(0.2, release[0].set).start()  # the first write ends only later
        saver.save(3, state, extra)  # must wait for write 2 before refilling the buffers
        reused = buffers == {k: t.data_ptr() for k, t in saver._buffers.items()}
        entered[1].wait(30)
        train_step()
        release[1].set()
        saver.wait()
    finally:
        background.write_rank = real_write
    torch.distributed.barrier()
    return {
        "before": before if dtlab.rank() == 0 else None,
        "middle": middle if dtlab.rank() == 0 else None,
        "changed": changed,
        "reused": reused,
    }


def test_async_save_writes_the_snapshot_not_the_tensors_training_mutates(cluster, tmp_path):
    out = cluster.run(_async_save_while_training, str(tmp_path))
    assert all(o["changed"] and o["reused"] for o in out)  # weights moved during each write
    for rank, spans in out.trace.by_rank().items():
        snaps = [s for s in spans if s.name == "checkpoint_snapshot"]
        writes = [s for s in spans if s.name == "checkpoint_write"]
        steps = [s for s in spans if s.name == "train_step"]
        assert len(snaps) == len(writes) == len(steps) == 2, rank
        for snap, write, step in zip(snaps, writes, steps, strict=True):
            assert snap.end_ns <= step.start_ns  # the snapshot blocks: done before training
            assert write.start_ns < step.end_ns and step.end_ns < write.end_ns  # overlapped
    for step, key in ((2, "before"), (3, "middle")):
        model = GPT(CONFIG, seed=3)
        opt = torch.optim.AdamW(model.parameters())
        meta = read_metadata(final_dir(tmp_path, step))
        state = prepare_optimizer_state(replicated_state(model, opt), model, opt, meta)
        result = load(tmp_path, state, step)
        assert result.extra == {"next_batch": step}  # extra as of the snapshot, not the write
        want = out[0][key]
        for name, local in state.items():
            if name in want:
                assert torch.equal(local.tensor, want[name]), f"step {step}: {name}"


def _save_twice(root):
    from dtlab.checkpoint import save

    fsdp, opt = _train_fsdp(steps=1)
    save(root, 1, fsdp_state(fsdp, opt))
    first = _full_fsdp(fsdp, opt)
    fsdp2, opt2 = _train_fsdp(steps=2)
    save(root, 2, fsdp_state(fsdp2, opt2))
    return first if dtlab.rank() == 0 else None


def _plain_target():
    model = GPT(CONFIG, seed=5)
    opt = torch.optim.AdamW(model.parameters())
    return model, opt


def test_bad_inputs_each_give_a_clear_error_and_the_previous_checkpoint_still_loads(
    cluster, tmp_path
):
    first = cluster.run(_save_twice, str(tmp_path))[0]
    newest = final_dir(tmp_path, 2)
    meta = read_metadata(newest)

    def attempt(step=None):
        model, opt = _plain_target()
        state = prepare_optimizer_state(replicated_state(model, opt), model, opt, meta)
        return load(tmp_path, state, step), state

    good = (newest / "rank_1.bin").read_bytes()
    (newest / "rank_1.bin").write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    with pytest.raises(CheckpointError, match=r"rank_1.bin is corrupted: tensor '"):
        attempt()
    (newest / "rank_1.bin").write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match=r"rank_1.bin is truncated: tensor '"):
        attempt()
    (newest / "rank_1.bin").unlink()
    with pytest.raises(CheckpointError, match=r"rank_1.bin is missing: it holds '"):
        attempt()
    wrong = GPT(GPTConfig.tiny(d_model=48, n_layers=2), seed=0)
    with pytest.raises(CheckpointError, match=r"shape mismatch for tensor 'model/"):
        load(tmp_path, replicated_state(wrong), step=1)
    result, state = attempt(step=1)  # the previous complete checkpoint is untouched
    assert result.step == 1
    for name, local in state.items():
        if name in first:
            assert torch.equal(local.tensor, first[name]), name


def _torch_fully_shard_trained(steps=2):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from dtlab.models import SyntheticTokens, loss_fn, shard_for_rank

    model = GPT(CONFIG, seed=0)
    mesh = init_device_mesh("cpu", (dtlab.world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in SyntheticTokens(CONFIG, steps, 4, seed=0):
        x, y = shard_for_rank((x, y), dtlab.rank(), dtlab.world_size())
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _full_torch(model, opt) -> dict:
    out = {f"model/{n}": p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        for key in ("exp_avg", "exp_avg_sq"):
            out[f"optim/{n}/{key}"] = opt.state[p][key].full_tensor().clone()
    return out


def _dcp_parity(dcp_dir, ours_dir, converted):
    """torch's fully_shard + DCP saves; the same state reaches our FSDP through our format."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from dtlab.checkpoint import Local, save, whole
    from dtlab.parallel import FullyShardedDataParallel

    model, opt = _torch_fully_shard_trained()
    theirs = _full_torch(model, opt)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=dcp_dir)
    # DCP round trip into a fresh fully_shard model (their load, their layout).
    fresh, fresh_opt = _torch_fully_shard_trained(steps=1)
    msd2, osd2 = get_state_dict(fresh, fresh_opt)
    state = {"model": msd2, "optim": osd2}
    dcp.load(state, checkpoint_id=dcp_dir)
    set_state_dict(
        fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    dcp_roundtrip = all(torch.equal(v, theirs[k]) for k, v in _full_torch(fresh, fresh_opt).items())
    # Their checkpoint → whole tensors → our format (rank 0 writes them) → our FSDP on 2 ranks.
    if dist.get_rank() == 0:
        dcp_to_torch_save(dcp_dir, converted)
    dist.barrier()
    full = torch.load(converted, weights_only=False)
    pieces = {f"model/{n}": t for n, t in full["model"].items()}
    for fqn, slots in full["optim"]["state"].items():
        pieces.update({f"optim/{fqn}/{k}": v for k, v in slots.items() if torch.is_tensor(v)})
    ours = FullyShardedDataParallel(GPT(CONFIG, seed=11))
    ours_opt = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    names = {f"model/{n}" for n, _ in ours.module.named_parameters()}
    keep = {k: v for k, v in pieces.items() if k in names or k.startswith("optim/")}
    save(ours_dir, 2, {k: Local(v, whole(v.shape), True) for k, v in keep.items()})
    meta = read_metadata(final_dir(ours_dir, 2))
    target = prepare_optimizer_state(fsdp_state(ours, ours_opt), ours.module, ours_opt, meta)
    load(ours_dir, target)
    loaded = _full_fsdp(ours, ours_opt)
    mismatched = [k for k, v in loaded.items() if not torch.equal(v, theirs[k])]
    step_equal = all(
        float(ours_opt.state[p]["step"]) == 2.0 for p in ours.parameters() if p in ours_opt.state
    )
    return {
        "dcp_roundtrip": dcp_roundtrip,
        "mismatched": mismatched,
        "n": len(loaded),
        "step": step_equal,
    }


def test_torch_dcp_checkpoint_of_fully_shard_loads_into_our_fsdp_side_by_side(cluster, tmp_path):
    out = cluster.run(
        _dcp_parity, str(tmp_path / "dcp"), str(tmp_path / "ours"), str(tmp_path / "full.pt")
    )
    for r, o in enumerate(out):
        assert o["dcp_roundtrip"], f"rank {r}: torch's own DCP round trip differs"
        assert o["n"] > 0 and o["mismatched"] == [], f"rank {r}: {o['mismatched']}"
        assert o["step"]


def test_checkpoint_bench_reports_the_three_ratios_at_tiny_size(cluster):
    from dtlab.bench.checkpoint import OPS, run

    out = run(cluster, 2, "tiny", 1, 1)
    assert set(out["median_s"]) == set(OPS)
    assert set(out["ratios"]) == {
        "async_block / sync_save",
        "sync_save / dcp_save",
        "ours_load / dcp_load",
    }
    assert all(r.median > 0 for r in out["ratios"].values())
    assert all(b > 0 for b in out["bytes_written_per_rank"])


def _ours_into_theirs(root):
    """Our FSDP saves; the checkpoint loads whole into one process's tensors, which torch's
    ``set_model_state_dict``/``set_optimizer_state_dict`` shard into a ``fully_shard`` model."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from dtlab.checkpoint import save

    fsdp, opt = _train_fsdp()
    ours = _full_fsdp(fsdp, opt)
    save(root, 2, fsdp_state(fsdp, opt))
    plain = GPT(CONFIG, seed=5)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    meta = read_metadata(final_dir(root, 2))
    load(root, prepare_optimizer_state(replicated_state(plain, plain_opt), plain, plain_opt, meta))
    theirs, theirs_opt = _torch_fully_shard_trained(steps=1)
    full = StateDictOptions(full_state_dict=True)
    set_model_state_dict(theirs, {n: p.detach() for n, p in plain.named_parameters()}, options=full)
    osd = get_optimizer_state_dict(theirs, theirs_opt, options=full)
    osd["state"] = {n: dict(plain_opt.state[p]) for n, p in plain.named_parameters()}
    set_optimizer_state_dict(theirs, theirs_opt, osd, options=full)
    got = _full_torch(theirs, theirs_opt)
    steps = {float(theirs_opt.state[p]["step"]) for p in theirs.parameters()}
    return {"mismatched": [k for k in ours if not torch.equal(ours[k], got[k])], "steps": steps}


def test_our_checkpoint_loads_into_a_torch_fully_shard_model(cluster, tmp_path):
    for rank, out in enumerate(cluster.run(_ours_into_theirs, str(tmp_path))):
        assert out["mismatched"] == [], f"rank {rank}: {out['mismatched']}"
        assert out["steps"] == {2.0}


def _ddp_replica(seed=0, steps=2):
    """A data-parallel replica: same model, optimizer and gradient on every rank (the gradient
    all-reduced, as DDP does), so its plain state dicts are identical across ranks."""
    import torch.distributed as dist

    from dtlab.models import SyntheticTokens, loss_fn, shard_for_rank

    model = GPT(CONFIG, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in SyntheticTokens(CONFIG, steps, 4, seed=seed):
        x, y = shard_for_rank((x, y), dtlab.rank(), dtlab.world_size())
        loss_fn(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dtlab.world_size()
        opt.step()
        opt.zero_grad()
    return model, opt


def _plain_round_trip(root):
    from dtlab.checkpoint import save

    model, opt = _ddp_replica()
    save(root, 2, {"model": model.state_dict(), "optim": opt.state_dict()})
    meta = read_metadata(final_dir(root, 2))
    fresh = GPT(CONFIG, seed=9)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.5)
    target = {"model": fresh.state_dict(), "optim": fresh_opt.state_dict()}
    load(root, target)
    fresh.load_state_dict(target["model"])
    fresh_opt.load_state_dict(target["optim"])
    want, got = opt.state_dict(), fresh_opt.state_dict()
    return {
        "writers": {e["file"] for t in meta["tensors"].values() for e in t["pieces"]},
        "model": all(
            torch.equal(got_p, p)
            for got_p, p in zip(fresh.parameters(), model.parameters(), strict=True)
        ),
        "groups": got["param_groups"] == want["param_groups"],
        "optim": all(
            torch.equal(got["state"][i][k], v)
            for i, s in want["state"].items()
            for k, v in s.items()
        ),
        "slots": len(got["state"]),
    }


def test_plain_state_dicts_on_two_ranks_are_written_once_and_load_bit_for_bit_on_each(
    cluster, tmp_path
):
    out = cluster.run(_plain_round_trip, str(tmp_path))
    n_params = len(list(GPT(CONFIG, seed=0).parameters()))
    for r, o in enumerate(out):
        assert o["writers"] == {"rank_0.bin"}, "a plain tensor is replicated: rank 0 writes it"
        assert o["model"] and o["groups"] and o["optim"] and o["slots"] == n_params, (r, o)


def _plain_copies_differ(root):
    """The documented rule: a plain tensor is replicated, so rank 0's copy is the saved one."""
    from dtlab.checkpoint import save

    mine = torch.full((3,), float(dtlab.rank()))
    save(root, 1, {"t": mine})
    target = {"t": torch.empty(3)}
    load(root, target)
    return target["t"].tolist()


def test_a_plain_tensor_that_differs_across_ranks_loads_as_rank_0s_copy(cluster, tmp_path):
    assert cluster.run(_plain_copies_differ, str(tmp_path)) == [[0.0] * 3, [0.0] * 3]


def _async_handle(root, fail_rank):
    from dtlab.checkpoint import AsyncCheckpointer, complete_checkpoints

    fsdp, opt = _train_fsdp(steps=1)
    saver = AsyncCheckpointer(root, commit_timeout_s=3.0)
    handle = saver.save(1, fsdp_state(fsdp, opt), {"rank": dtlab.rank()})
    path = handle.result()  # no barrier: the handle alone says the commit is on disk
    seen = complete_checkpoints(root)
    target = prepare_optimizer_state(fsdp_state(fsdp, opt), fsdp.module, opt, read_metadata(path))
    loaded = load(root, target, 1).extra

    def refuse():
        if dtlab.rank() == fail_rank:
            raise OSError(28, "No space left on device")

    failed = saver.save(2, fsdp_state(fsdp, opt), before_flag=refuse)
    try:
        failed.result()
        error = None
    except (OSError, CheckpointError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {"path": str(path), "seen": seen, "loaded": loaded, "error": error}


def test_every_rank_s_async_handle_returns_only_once_the_checkpoint_is_committed(cluster, tmp_path):
    out = cluster.run(_async_handle, str(tmp_path), 1)
    for r, o in enumerate(out):
        assert o["path"] == str(final_dir(tmp_path, 1)) and o["seen"] == [1]
        assert o["loaded"] == {"rank": r}
    assert out[1]["error"] == "OSError: [Errno 28] No space left on device"
    assert "CheckpointError: ranks [1] did not finish writing" in out[0]["error"]
