"""Mixed precision on CUDA tensors: FP8 linear through torch._scaled_mm (when this GPU and build
run it, else the simulation, and the test says which ran), the dynamic loss scaler under
DDP on NCCL (one rank) with a planted overflow, and its FP32 scale at the edges of FP32's range
equal to ``GradScaler("cuda")``'s bit for bit. Skipped without CUDA; ``pytest -m gpu``."""

from __future__ import annotations

import pytest
import torch

import dtlab
from test_precision_scaler_fp32 import run_scaler_steps  # the CPU parity test's driver

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("granularity", ["tensor", "row", "tile"])
def test_fp8_linear_on_cuda_matches_the_simulation(granularity):
    from dtlab.precision import GEMM_PATHS, Fp8Linear, Fp8Recipe, relative_error

    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 256).cuda()
    x = torch.randn(128, 256, device="cuda", requires_grad=True)
    outputs = {}
    for use in (True, False):
        GEMM_PATHS.clear()
        layer = Fp8Linear.from_linear(linear, Fp8Recipe(granularity, use_scaled_mm=use))
        outputs[use] = layer(x)
        outputs[use].sum().backward()
        print(granularity, "scaled_mm allowed" if use else "simulated", dict(GEMM_PATHS))
    assert relative_error(outputs[False], outputs[True]) < 1e-3
    assert relative_error(linear(x), outputs[True]) < 0.1


def _scaler_with_ddp_on_nccl() -> dict:
    from dtlab.parallel import NaiveDDP
    from dtlab.precision import DynamicLossScaler, ScalerConfig

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ddp = NaiveDDP(model.to(dtlab.device()))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    scaler = DynamicLossScaler(ScalerConfig(init_scale=2.0**8))
    x = torch.randn(4, 8, device=dtlab.device())
    stepped = []
    for step in range(3):
        loss = ddp(x).square().mean() * (float("inf") if step == 1 else 1.0)
        scaler.scale(loss).backward()
        stepped.append(scaler.step(opt))
        scaler.update()
        opt.zero_grad()
    return {"stepped": stepped, "scale": scaler.get_scale(), "device": str(x.device)}


@pytest.mark.timeout(300)
def test_loss_scaler_with_ddp_runs_on_nccl():
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_scaler_with_ddp_on_nccl)[0]
    assert r["device"].startswith("cuda")
    assert r["stepped"] == [True, False, True] and r["scale"] == 2.0**7


@pytest.mark.parametrize(
    ("start", "growth", "backoff", "interval"),
    [
        (2.0**127, 2.0, 0.5, 1),
        (3.0e38, 1.5, 0.3, 1),
        (27.0, 1.0001, 0.3, 2),
        (2.0**-149, 2.0, 0.5, 1),
    ],
)
def test_scale_at_the_fp32_edge_equals_grad_scaler_on_cuda(start, growth, backoff, interval):
    """The CUDA ``_amp_update_scale_`` kernel refuses a growth past FP32's range and rounds each
    product to FP32, as the CPU one does; dtlab's scaler, unscaling CUDA gradients, moves the
    same way bit for bit."""
    from dtlab.precision import DynamicLossScaler, ScalerConfig

    knobs = dict(growth_factor=growth, backoff_factor=backoff, growth_interval=interval)
    true_grad = torch.tensor([0.375, -0.0625, 0.75, 2.5e-4], device="cuda")
    events = "cccccoccccooccccccocc"
    ours = run_scaler_steps(
        DynamicLossScaler(ScalerConfig(init_scale=start, **knobs)), events, true_grad
    )
    theirs = run_scaler_steps(
        torch.amp.GradScaler("cuda", init_scale=start, **knobs), events, true_grad
    )
    assert ours == theirs
    if start == 2.0**127 and interval == 1:
        assert ours[0] == ((2.0**127).hex(), 0, True)  # the growth to 2**128 was refused
