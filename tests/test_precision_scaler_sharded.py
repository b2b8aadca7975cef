"""Dynamic loss scaling on real ranks: on 2 and 4 ranks under ZeRO-1/2, dtlab's FSDP and torch's
FSDP2 ``fully_shard`` an overflow in the last rank's gradient *shard* makes every rank skip (one
4-byte flag all-reduce, counted), each rank unscaling only the shard it holds; under DDP the
gradient all-reduce already carries one rank's inf to every rank. Sharded training with our
scaler equals one process with GradScaler, parameters and scale. ZeRO's FP16 gradient shards are
unscaled into FP32 (an FP16 division would flush them again); plain FP16 gradients are refused."""

from __future__ import annotations

import pytest
import torch

from dtlab.precision import DynamicLossScaler, ScalerConfig, gradients_of


def _wrap(model, wrapper: str, optimizer_class, **kw):
    """(callable model, optimizer, full-parameters getter) for ``wrapper``: dtlab's ZeRO-1/2
    (``zero1``/``zero2``), NaiveDDP, dtlab's FSDP (``fsdp``) or torch's ``fully_shard``."""
    from dtlab.parallel import FullyShardedDataParallel, NaiveDDP, ZeroOptimizer
    from dtlab.parallel.zero.full_state import gather_full_parameters

    if wrapper.startswith("zero"):
        opt = ZeroOptimizer(model.parameters(), optimizer_class, stage=int(wrapper[-1]), **kw)
        return model, opt, lambda: dict(model.named_parameters())
    if wrapper == "ddp":
        net = NaiveDDP(model)
        return net, optimizer_class(net.parameters(), **kw), lambda: dict(model.named_parameters())
    if wrapper == "fsdp":
        net = FullyShardedDataParallel(model, units=[model[0]])
        return net, optimizer_class(net.parameters(), **kw), lambda: gather_full_parameters(net)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)

    def full():
        return {n: p.full_tensor() for n, p in model.named_parameters()}

    return model, optimizer_class(model.parameters(), **kw), full


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _one_rank_overflows(wrapper: str) -> dict:
    import torch.distributed as dist

    from dtlab.comm import Communicator

    rank, last = dist.get_rank(), dist.get_world_size() - 1
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    total = sum(p.numel() for p in model.parameters())
    net, opt, _ = _wrap(model, wrapper, torch.optim.SGD, lr=0.1)
    comm = Communicator(None, collectives="dtlab", dim="dp")
    scaler = DynamicLossScaler(ScalerConfig(init_scale=2.0**8), comm=comm)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
    out = []
    for step in range(2):
        before = [_local(p).detach().clone() for p in model.parameters()]
        blow_up = float("inf") if (wrapper == "ddp" and step == 1 and rank == last) else 1.0
        scaler.scale(net(x).square().mean() * blow_up).backward()
        mine = [_local(g) for g in gradients_of(opt)]  # this rank's (reduced) gradient shards
        held = sum(g.numel() for g in mine)
        scaled = [g.clone() for g in mine]
        if wrapper != "ddp" and step == 1 and rank == last:
            mine[0].view(-1)[0] = float("inf")  # only the last rank's shard holds it
        comm.comm_stats.reset()
        stepped = scaler.step(opt)
        flag_calls, flag_bytes = comm.comm_stats.calls, comm.comm_stats.bytes_sent
        unscaled_here = all(
            torch.equal(g, s / 2.0**8) for g, s in zip(mine, scaled, strict=True) if step == 0
        )
        scaler.update()
        opt.zero_grad()
        after = [_local(p).detach() for p in model.parameters()]
        unchanged = all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
        out.append(
            {
                "stepped": stepped,
                "local_overflow": scaler.history[-1].local_overflow,
                "unchanged": unchanged,
                "flag_calls": flag_calls,
                "flag_bytes": flag_bytes,
                "unscaled_in_place": unscaled_here,
            }
        )
    return {"steps": out, "scale": scaler.get_scale(), "held": held, "total": total}


SHARDED = ["zero2", "fsdp", "fsdp2"]


@pytest.mark.parametrize(
    "world, wrapper",
    [(2, w) for w in ["zero1", *SHARDED, "ddp"]] + [(4, w) for w in [*SHARDED, "ddp"]],
)
def test_an_overflow_in_one_ranks_shard_makes_every_rank_skip(request, world, wrapper):
    results = request.getfixturevalue(f"cluster{world}").run(_one_rank_overflows, wrapper)
    for rank, r in enumerate(results):
        clean, overflow = r["steps"]
        assert clean["stepped"] and not clean["unchanged"]  # stepped, parameters moved
        assert not overflow["stepped"] and overflow["unchanged"]  # skipped, parameters kept
        # sharded: only the last rank saw it locally; DDP: the gradient all-reduce already
        # spread its inf to every rank's whole gradient
        assert overflow["local_overflow"] is (rank == world - 1 or wrapper == "ddp")
        for step in (clean, overflow):  # one 4-byte flag all-reduce per step, nothing else
            assert step["flag_calls"] == 1 and 0 < step["flag_bytes"] <= 2 * 4
        assert clean["unscaled_in_place"]  # each rank unscaled exactly the shard it holds
        assert r["scale"] == 2.0**7
        if wrapper in SHARDED:  # the verdict came from shards, not whole gradients
            assert r["held"] < r["total"]


def _sharded_with_scaler_vs_one_process(wrapper: str) -> dict:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    config = dict(init_scale=2.0**10, growth_interval=2)
    model, reference = make(), make()
    net, opt, full = _wrap(model, wrapper, torch.optim.Adam, lr=0.01)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    scaler = DynamicLossScaler(ScalerConfig(**config))
    ref_scaler = torch.amp.GradScaler("cpu", **config)
    g = torch.Generator().manual_seed(5)
    for step in range(8):
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 1, generator=g)
        blow_up = float("inf") if step in (3, 4) else 1.0
        mine = slice(rank * 8 // world, (rank + 1) * 8 // world)
        scaler.scale(((net(x[mine]) - y[mine]) ** 2).mean() * blow_up).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        ref_scaler.scale(((reference(x) - y) ** 2).mean() * blow_up).backward()
        ref_scaler.step(ref_opt)
        ref_scaler.update()
        ref_opt.zero_grad()
    ours = full()
    gap = max(
        (ours[n].detach() - p.detach()).abs().max().item() for n, p in reference.named_parameters()
    )
    return {
        "gap": gap,
        "scale": scaler.get_scale(),
        "ref_scale": ref_scaler.get_scale(),
        "skipped": scaler.skipped_steps,
    }


@pytest.mark.parametrize("wrapper", ["zero1", *SHARDED])
def test_sharded_training_with_our_scaler_equals_one_process_with_grad_scaler(cluster2, wrapper):
    for r in cluster2.run(_sharded_with_scaler_vs_one_process, wrapper):
        assert r["scale"] == r["ref_scale"] and r["skipped"] == [3, 4]
        assert r["gap"] < 1e-6


def _zero2_fp16_unscale() -> dict:
    from dtlab.parallel import MixedPrecision, ZeroOptimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = ZeroOptimizer(
        model.parameters(),
        torch.optim.SGD,
        stage=2,
        lr=1.0,
        mixed_precision=MixedPrecision(torch.float16),
    )
    model.to(torch.float16)
    scale = 2.0**20
    scaler = DynamicLossScaler(ScalerConfig(init_scale=scale))
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(3)).half()
    scaler.scale(model(x).float().sum() * 2.0**-22).backward()  # true gradients ~1e-7 and below
    scaled = [g.clone() for g in gradients_of(opt)]
    scaler.unscale_(opt)
    unscaled = [g.clone() for g in opt.grad_shards if g is not None]
    before = [m.detach().clone() for m in opt.masters]
    stepped = scaler.step(opt)  # unscaled already: it steps with the fp32 shards
    moved = sum(int((m != b).sum()) for m, b in zip(opt.masters, before, strict=True))
    return {
        "stepped": stepped,
        "moved": moved,
        "dtypes": {str(g.dtype) for g in scaled},
        "unscaled_dtypes": {str(g.dtype) for g in unscaled},
        "exact": all(
            torch.equal(u, s.float() / scale) for u, s in zip(unscaled, scaled, strict=True)
        ),
        "kept": sum(int((u != 0).sum()) for u in unscaled),
        "would_flush_in_fp16": sum(int(((s / scale) == 0).sum() - (s == 0).sum()) for s in scaled),
    }


def test_zero_fp16_gradient_shards_are_unscaled_into_fp32_not_flushed_again(cluster2):
    for r in cluster2.run(_zero2_fp16_unscale):
        assert r["dtypes"] == {"torch.float16"} and r["unscaled_dtypes"] == {"torch.float32"}
        assert r["exact"] and r["stepped"] and r["moved"] > 0
        assert r["would_flush_in_fp16"] > 0  # an fp16 unscale would lose these gradients


def test_plain_fp16_gradients_are_refused_as_grad_scaler_refuses_them():
    model = torch.nn.Linear(4, 1).half()
    model(torch.ones(1, 4).half()).sum().backward()
    with pytest.raises(ValueError, match="fp16"):
        DynamicLossScaler().unscale_(model)
