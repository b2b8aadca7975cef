"""Dynamic loss scaling: the same trajectory, skipped steps and parameters as torch.amp.GradScaler
on one process with planted overflows; hysteresis as DeepSpeed's; on 2 real ranks under ZeRO-1/2
and FSDP an overflow in one rank's gradient *shard* makes both ranks skip (one 4-byte flag
all-reduce, counted); under DDP the gradient all-reduce already carries one rank's inf to every
rank. ZeRO-2 + our scaler equals one process + GradScaler."""

from __future__ import annotations

import pytest
import torch

from dtlab.precision import (
    DynamicLossScaler,
    ScalerConfig,
    ScalerState,
    gradients_of,
    next_scale_state,
)

PLANTED = (2, 3, 9)  # steps whose loss is multiplied by inf


def _toy_run(scaler, steps: int = 20, planted=PLANTED):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    scales, skipped = [], []
    for step in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        loss = ((model(x) - y) ** 2).mean()
        if step in planted:
            loss = loss * float("inf")
        opt.zero_grad()
        scales.append(scaler.get_scale())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if scaler.get_scale() < scales[-1]:
            skipped.append(step)
    return scales, skipped, [p.detach().clone() for p in model.parameters()]


def test_scale_trajectory_skips_and_parameters_equal_torch_grad_scaler():
    ours = _toy_run(DynamicLossScaler(ScalerConfig(init_scale=2.0**10, growth_interval=3)))
    torch_amp = _toy_run(torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3))
    assert ours[0] == torch_amp[0]
    assert ours[1] == torch_amp[1] == list(PLANTED)
    assert all(torch.equal(a, b) for a, b in zip(ours[2], torch_amp[2], strict=True))
    assert max(ours[0]) > 2.0**10  # it grew after clean windows, not only backed off


def test_a_scaler_that_never_backs_off_differs_from_grad_scaler():
    never = ScalerConfig(init_scale=2.0**10, growth_interval=3, backoff_factor=0.999)
    ours = _toy_run(DynamicLossScaler(never))
    torch_amp = _toy_run(torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3))
    assert ours[0] != torch_amp[0]


def test_hysteresis_skips_without_backing_off_until_the_allowance_is_spent():
    config = ScalerConfig(init_scale=8.0, growth_interval=2, hysteresis=2)
    state = ScalerState.start(config)
    state = next_scale_state(state, True, config)  # first overflow: skip, keep the scale
    assert (state.scale, state.hysteresis_left) == (8.0, 1)
    state = next_scale_state(state, True, config)  # second: back off
    assert state.scale == 4.0
    state = next_scale_state(next_scale_state(state, False, config), False, config)
    assert (state.scale, state.hysteresis_left) == (8.0, 2)  # grew, allowance refilled


def test_bad_scaler_settings_say_what_to_change():
    with pytest.raises(ValueError, match="backoff_factor"):
        ScalerConfig(backoff_factor=2.0)
    with pytest.raises(RuntimeError, match="before update"):
        DynamicLossScaler().update()


def _one_rank_overflows(wrapper: str) -> dict:
    import torch.distributed as dist

    from dtlab.comm import Communicator
    from dtlab.parallel import FullyShardedDataParallel, NaiveDDP, ZeroOptimizer

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    if wrapper.startswith("zero"):
        stage = int(wrapper[-1])
        net = model
        opt = ZeroOptimizer(model.parameters(), torch.optim.SGD, stage=stage, lr=0.1)
    elif wrapper == "ddp":
        net = NaiveDDP(model)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
    else:
        net = FullyShardedDataParallel(model, units=[model[0]])
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
    comm = Communicator(None, collectives="dtlab", dim="dp")
    scaler = DynamicLossScaler(ScalerConfig(init_scale=2.0**8), comm=comm)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
    out = []
    for step in range(2):
        before = [p.detach().clone() for p in model.parameters()]
        blow_up = float("inf") if (wrapper == "ddp" and step == 1 and rank == 1) else 1.0
        scaler.scale(net(x).square().mean() * blow_up).backward()
        if wrapper != "ddp" and step == 1 and rank == 1:
            shard = gradients_of(opt)[0]  # this rank's reduced shard
            shard.view(-1)[0] = float("inf")  # only rank 1's shard holds it
        comm.stats.reset()
        stepped = scaler.step(opt)
        flag_calls = comm.stats.calls
        scaler.update()
        opt.zero_grad()
        after = [p.detach() for p in model.parameters()]
        unchanged = all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
        out.append((stepped, scaler.history[-1].local_overflow, unchanged, flag_calls))
    return {"steps": out, "scale": scaler.get_scale()}


@pytest.mark.parametrize("wrapper", ["zero1", "zero2", "fsdp", "ddp"])
def test_an_overflow_in_one_ranks_shard_makes_every_rank_skip(cluster2, wrapper):
    results = cluster2.run(_one_rank_overflows, wrapper)
    for rank, r in enumerate(results):
        clean, overflow = r["steps"]
        assert clean[0] is True and clean[2] is False  # stepped, parameters moved
        assert overflow[0] is False and overflow[2] is True  # skipped, parameters unchanged
        # sharded: only rank 1 saw it locally; DDP: the gradient all-reduce already spread
        # rank 1's inf to rank 0's whole gradient
        assert overflow[1] is (rank == 1 or wrapper == "ddp")
        assert clean[3] == overflow[3] == 1  # one flag all-reduce per step
        assert r["scale"] == 2.0**7


def _zero2_with_scaler_vs_one_process() -> dict:
    import torch.distributed as dist

    from dtlab.parallel import ZeroOptimizer

    rank, world = dist.get_rank(), dist.get_world_size()

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    config = dict(init_scale=2.0**10, growth_interval=2)
    model, reference = make(), make()
    opt = ZeroOptimizer(model.parameters(), torch.optim.Adam, stage=2, lr=0.01)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    scaler = DynamicLossScaler(ScalerConfig(**config))
    ref_scaler = torch.amp.GradScaler("cpu", **config)
    g = torch.Generator().manual_seed(5)
    for step in range(6):
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 1, generator=g)
        blow_up = float("inf") if step == 3 else 1.0
        mine = slice(rank * 8 // world, (rank + 1) * 8 // world)
        scaler.scale(((model(x[mine]) - y[mine]) ** 2).mean() * blow_up).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        ref_scaler.scale(((reference(x) - y) ** 2).mean() * blow_up).backward()
        ref_scaler.step(ref_opt)
        ref_scaler.update()
        ref_opt.zero_grad()
    gap = max(
        (a - b).abs().max().item()
        for a, b in zip(model.parameters(), reference.parameters(), strict=False)
    )
    return {"gap": gap, "scale": scaler.get_scale(), "ref_scale": ref_scaler.get_scale()}


def test_zero2_with_our_scaler_equals_one_process_with_grad_scaler(cluster2):
    for r in cluster2.run(_zero2_with_scaler_vs_one_process):
        assert r["scale"] == r["ref_scale"]
        assert r["gap"] < 1e-6
