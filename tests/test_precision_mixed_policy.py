"""``MixedPrecision`` follows torch FSDP2's ``MixedPrecisionPolicy``: the same fields in the same
order with the same defaults (nothing cast), positional arguments meaning the same thing, and
the default policy training exactly as no policy under our FSDP and ZeRO-2, computing in fp32
as ``fully_shard`` does under ``MixedPrecisionPolicy()``; dtlab's one extra field,
``master_dtype``, is keyword-only."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

import dtlab
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank
from dtlab.parallel import FullyShardedDataParallel, MixedPrecision, ZeroOptimizer
from dtlab.parallel.data.equivalence import parameters_by_name
from dtlab.parallel.zero.full_state import gather_full_parameters

CONFIG = GPTConfig.tiny(seq_len=8, d_model=32, n_layers=2)


def test_defaults_equal_fsdp2_mixed_precision_policy_field_by_field():
    theirs = [f.name for f in dataclasses.fields(MixedPrecisionPolicy)]
    ours = [f.name for f in dataclasses.fields(MixedPrecision)]
    assert ours[: len(theirs)] == theirs and ours[len(theirs) :] == ["master_dtype"]
    for name in theirs:
        assert getattr(MixedPrecision(), name) == getattr(MixedPrecisionPolicy(), name), name
    assert MixedPrecision().gradient_dtype is None  # reduce in the parameters' own dtype


def test_positional_arguments_mean_what_they_mean_in_fsdp2():
    ours = MixedPrecision(torch.bfloat16, torch.float32, torch.bfloat16, False)
    theirs = MixedPrecisionPolicy(torch.bfloat16, torch.float32, torch.bfloat16, False)
    for f in dataclasses.fields(MixedPrecisionPolicy):
        assert getattr(ours, f.name) == getattr(theirs, f.name), f.name
    with pytest.raises(TypeError):
        MixedPrecision(torch.bfloat16, None, None, True, torch.float32)  # master_dtype: by keyword
    assert MixedPrecision(torch.float16, master_dtype=torch.float64).master_dtype == torch.float64


def test_bad_dtypes_say_what_to_change():
    with pytest.raises(ValueError, match="floating point"):
        MixedPrecision(reduce_dtype=torch.int32)
    with pytest.raises(ValueError, match="narrower"):
        MixedPrecision(torch.float32, master_dtype=torch.bfloat16)


def _seen_dtypes(model) -> dict:
    """Record (weight dtype, input dtype) of the first MLP layer, read inside its forward."""
    seen = {}
    model.blocks[0].mlp.fc_in.register_forward_pre_hook(
        lambda m, a: seen.update(fc_in=(m.weight.dtype, a[0].dtype))
    )
    return seen


def _train(forward, params, batches) -> None:
    rank, world = dtlab.rank(), dtlab.world_size()
    opt = params if isinstance(params, torch.optim.Optimizer) else torch.optim.SGD(params, lr=0.1)
    for batch in batches:
        x, y = shard_for_rank(batch, rank, world)
        opt.zero_grad()
        loss_fn(forward(x), y).backward()
        opt.step()


def _default_policy_runs() -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    batches = list(SyntheticTokens(CONFIG, n_batches=2, batch_size=4, seed=0))
    out = {}
    for name, policy in (("default", MixedPrecision()), ("none", None)):
        model = GPT(CONFIG, seed=0)
        seen = _seen_dtypes(model)
        fsdp = FullyShardedDataParallel(model, mixed_precision=policy)
        _train(fsdp, fsdp.parameters(), batches)
        out[f"fsdp_{name}"] = gather_full_parameters(fsdp)
        out[f"fsdp_{name}_seen"] = seen["fc_in"]

        model = GPT(CONFIG, seed=0)
        seen = _seen_dtypes(model)
        opt = ZeroOptimizer(
            model.parameters(), torch.optim.SGD, stage=2, mixed_precision=policy, lr=0.1
        )
        _train(model, opt, batches)
        out[f"zero2_{name}"] = parameters_by_name(model)
        out[f"zero2_{name}_seen"] = seen["fc_in"]

    model = GPT(CONFIG, seed=0)
    seen = _seen_dtypes(model)
    mesh = init_device_mesh("cpu", (dtlab.world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=MixedPrecisionPolicy())
    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy())
    _train(model, model.parameters(), batches[:1])
    out["fsdp2_default_seen"] = seen["fc_in"]
    return out


def test_the_default_policy_casts_nothing_like_fsdp2(cluster2):
    for r in cluster2.run(_default_policy_runs):
        fp32 = (torch.float32, torch.float32)
        assert r["fsdp2_default_seen"] == fp32  # torch's own default: weights and inputs fp32
        for wrapper in ("fsdp", "zero2"):
            assert r[f"{wrapper}_default_seen"] == fp32, wrapper
            default, none = r[f"{wrapper}_default"], r[f"{wrapper}_none"]
            assert default.keys() == none.keys()
            for name in default:  # the default policy trains exactly as no policy at all
                assert torch.equal(default[name], none[name]), (wrapper, name)
