"""Checkpoints of CUDA tensors over NCCL (one GPU: a 1-rank cluster). Skipped without CUDA;
``pytest -m gpu`` selects it. Proves that a sharded FSDP state on the GPU saves (sync and async,
the async snapshot in *pinned* host memory), loads back into CUDA tensors bit for bit, and loads
into a plain CPU model; the CPU suite covers resharding across ranks."""

from __future__ import annotations

import pytest
import torch

import dtlab

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _save_and_load_on_cuda(root: str) -> dict:
    from dtlab.checkpoint import (
        AsyncCheckpointer,
        fsdp_state,
        load,
        prepare_optimizer_state,
        read_metadata,
        save,
        snapshot,
    )
    from dtlab.checkpoint.commit import final_dir
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.parallel import FullyShardedDataParallel, gather_full_parameters

    device = dtlab.device()
    config = GPTConfig.tiny()
    fsdp = FullyShardedDataParallel(GPT(config, seed=0).to(device))
    opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-2)
    x, y = (t.to(device) for t in SyntheticTokens(config, 1, 4)[0])
    loss_fn(fsdp(x), y).backward()
    opt.step()
    state = fsdp_state(fsdp, opt)
    on_cuda = all(v.tensor.is_cuda for k, v in state.items() if k.startswith("model/"))
    copies = snapshot([(k, v.tensor) for k, v in state.items()])
    pinned = all(t.is_pinned() for (k, t) in copies if state[k].tensor.is_cuda)
    save(root, 1, state)
    saver = AsyncCheckpointer(root)
    saver.save(2, state)
    saver.wait()
    before = gather_full_parameters(fsdp)
    fresh = FullyShardedDataParallel(GPT(config, seed=9).to(device))
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    meta = read_metadata(final_dir(root, 2))
    target = prepare_optimizer_state(fsdp_state(fresh, fresh_opt), fresh.module, fresh_opt, meta)
    load(root, target)
    after = gather_full_parameters(fresh)
    return {
        "on_cuda": on_cuda,
        "pinned": pinned,
        "equal": all(torch.equal(before[k], after[k]) for k in before),
        "loaded_on_cuda": all(
            v.tensor.is_cuda for k, v in target.items() if k.startswith("model/")
        ),
        "params": before,
    }


@pytest.mark.timeout(300)
def test_sharded_cuda_state_saves_sync_and_async_with_pinned_snapshots(tmp_path):
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_save_and_load_on_cuda, str(tmp_path))[0]
    assert r["on_cuda"] and r["pinned"] and r["equal"] and r["loaded_on_cuda"]
    from dtlab.checkpoint import load, replicated_state
    from dtlab.models import GPT, GPTConfig

    model = GPT(GPTConfig.tiny(), seed=3)
    load(tmp_path, {k: v for k, v in replicated_state(model).items()}, step=1)
    for name, p in model.named_parameters():
        assert torch.equal(p, r["params"][name].cpu()), name


@pytest.mark.timeout(300)
def test_the_fault_tolerant_job_resumes_on_cuda_tensors(tmp_path):
    from dtlab.faults import Fault, JobSpec, run_with_recovery, train_with_checkpoints

    spec = JobSpec(steps=4, save_every=2, dropout=0.0)
    with dtlab.Cluster(1, device="cuda") as cluster:
        reference = cluster.run(train_with_checkpoints, str(tmp_path / "ref"), spec)[0]
        recovery = run_with_recovery(
            cluster,
            train_with_checkpoints,
            tmp_path / "run",
            spec,
            faults=[Fault("raise", rank=0, step=3)],
        )
    assert [a.outcome for a in recovery.attempts] == ["RankError", "finished"]
    resumed = recovery.result[0]
    assert resumed["resumed_from"] == 2
    # CUDA's embedding backward accumulates with atomics: equal up to rounding, not bitwise.
    for name, value in reference["params"].items():
        torch.testing.assert_close(resumed["params"][name], value, rtol=1e-4, atol=1e-5)


def _plain_cuda_state_dicts_async(root: str) -> dict:
    """A CUDA model and AdamW saved as plain ``state_dict()`` s through the async handle; loaded
    into a fresh CUDA model and optimizer right after ``handle.result()``."""
    from dtlab.checkpoint import AsyncCheckpointer, complete_checkpoints, load
    from dtlab.checkpoint.commit import final_dir
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn

    device = dtlab.device()
    config = GPTConfig.tiny()
    model = GPT(config, seed=0).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = (t.to(device) for t in SyntheticTokens(config, 1, 4)[0])
    loss_fn(model(x), y).backward()
    opt.step()
    handle = AsyncCheckpointer(root).save(
        1, {"model": model.state_dict(), "optim": opt.state_dict()}
    )
    path = handle.result()
    committed = path == final_dir(root, 1) and complete_checkpoints(root) == [1] and handle.done()
    fresh = GPT(config, seed=9).to(device)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.5)
    target = {"model": fresh.state_dict(), "optim": fresh_opt.state_dict()}
    load(root, target)
    fresh.load_state_dict(target["model"])
    fresh_opt.load_state_dict(target["optim"])
    want, got = opt.state_dict(), fresh_opt.state_dict()
    return {
        "committed": committed,
        "model": all(
            torch.equal(p, q) for p, q in zip(fresh.parameters(), model.parameters(), strict=True)
        ),
        "model_on_cuda": all(p.is_cuda for p in fresh.parameters()),
        "groups": got["param_groups"] == want["param_groups"],
        "optim": all(
            torch.equal(got["state"][i][k].cpu(), v.cpu())
            for i, slots in want["state"].items()
            for k, v in slots.items()
        ),
        "moments_on_cuda": all(s["exp_avg"].is_cuda for s in got["state"].values()),
    }


@pytest.mark.timeout(300)
def test_plain_cuda_state_dicts_save_async_and_load_bit_for_bit_once_the_handle_returns(tmp_path):
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_plain_cuda_state_dicts_async, str(tmp_path))[0]
    assert r == {k: True for k in r}, r
