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


# -- row-wise / column-wise copies, NVFP4's recipe, FP8 all-gather (issue 32) ----------------------


def test_rowwise_and_columnwise_mxfp8_copies_on_cuda_equal_the_cpu_ones_bit_for_bit():
    from dtlab.precision.directional import both_directions

    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(0))
    x[:, 5] *= 1e4
    for cpu_copy, cuda_copy in zip(both_directions(x), both_directions(x.cuda()), strict=True):
        assert torch.equal(cuda_copy.data.cpu().view(torch.uint8), cpu_copy.data.view(torch.uint8))
        assert torch.equal(cuda_copy.scale_codes.cpu(), cpu_copy.scale_codes)
        assert cuda_copy.nbytes == cpu_copy.nbytes


@pytest.mark.parametrize("block", [(1, 16), (16, 16)])
@pytest.mark.parametrize("stochastic", [False, True])
def test_nvfp4_quantisation_on_cuda_equals_the_cpu_simulation_bit_for_bit(block, stochastic):
    from dtlab.precision.microscaling import nvfp4_quantize

    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(1))
    want = nvfp4_quantize(x, block, stochastic, torch.Generator().manual_seed(2)).dequantize()
    got = nvfp4_quantize(x.cuda(), block, stochastic, torch.Generator().manual_seed(2))
    assert torch.equal(got.dequantize().cpu(), want)


def test_nvfp4_linear_on_cuda_matches_the_cpu_layer():
    from dtlab.precision.nvfp4_linear import NVFP4_RECIPE, Nvfp4Linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32)
    x = torch.randn(64, 64)
    grads = {}
    for device in ("cpu", "cuda"):
        lin = torch.nn.Linear(64, 32).to(device)
        lin.load_state_dict(linear.state_dict())
        xd = x.detach().to(device).requires_grad_()  # a leaf on each device
        Nvfp4Linear.from_linear(lin, NVFP4_RECIPE)(xd).square().sum().backward()
        grads[device] = (xd.grad.cpu(), lin.weight.grad.cpu())
    for cpu_grad, cuda_grad in zip(grads["cpu"], grads["cuda"], strict=True):
        assert torch.allclose(cpu_grad, cuda_grad, rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(300)
def test_fp8_all_gather_training_runs_on_nccl_and_equals_the_one_process_reference():
    from dtlab.precision.fp8_gather_training import train_one_process, train_with_gather

    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(train_with_gather, "fp8", 3, collectives="torch")[0]
    reference = train_one_process("fp8", 1, 3, device="cuda")  # same device, same sums
    assert r["losses"] == pytest.approx(reference, abs=1e-3)
    assert r["formula_per_step"]["fp8_weights"] == 0  # one rank sends nothing
