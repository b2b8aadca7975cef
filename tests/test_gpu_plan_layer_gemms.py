"""The planner's per-pass GEMM pricing (:func:`dtlab.plan.compute.pass_gemms`: forward ``X·W``,
dgrad ``dY·Wᵀ``, wgrad ``Xᵀ·dY``, each at its own shape) held against this GPU's measured
BF16 matmuls for GPT-3 175B's layer at TP 4 and TP 8, one 2,048-token micro-batch.

Skipped without CUDA; ``pytest -m gpu tests/test_gpu_plan_layer_gemms.py -s`` prints the record
(per pass: measured and model efficiency, share of the dense peak). Each GEMM runs with the
operands a training step gives it — dgrad multiplies by the transposed weight, wgrad by the
transposed input — ten in one CUDA graph, CUDA-event timing, median of 5, as in
``tests/test_gpu_plan_gemm_curve.py``.

Tolerance: each pass's layer efficiency within :data:`dtlab.plan.constants.H200_GEMM_MODEL_FACTOR`
of the measurement, the model's stated worst residual on square GEMMs. These are the shapes the
planner's A100 and Hopper rows are priced at (``K`` 1,536–12,288, outputs of 192–9,216 tiles), so
a GPU outside it says the wave model misprices training-shaped GEMMs, which the 2021 GPT-3 175B
ranks (TP 4 against TP 8) lean on."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from matmul_timing import seconds_per_matmul

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PRESETS = {"A100": "a100_80gb", "H100": "h100_sxm", "H800": "h800_sxm", "H200": "h200_sxm"}


def _operands(m: int, k: int, n: int, which: str):
    """The two operands of pass ``which`` of a forward GEMM ``(m × k) @ (k × n)``, laid out as
    autograd hands them to cuBLAS (a transposed view where the pass multiplies by one)."""

    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    if which == "forward":
        return rand(m, k), rand(k, n)
    if which == "input_grad":  # dY (m × n) @ Wᵀ, W stored (k × n)
        return rand(m, n), rand(k, n).t()
    return rand(m, k).t(), rand(m, n)  # wgrad: Xᵀ @ dY


@pytest.mark.parametrize("tp", [4, 8])
def test_each_pass_of_a_gpt3_layer_runs_near_its_modelled_efficiency(tp):
    from dtlab.cost import gpu
    from dtlab.plan.compute import PASSES, layer_efficiency, layer_gemms
    from dtlab.plan.constants import H200_GEMM_MODEL_FACTOR
    from dtlab.plan.megatron_jobs import GPT3_175B
    from dtlab.plan.parallel_plan import ParallelPlan

    name = torch.cuda.get_device_name()
    preset = next((p for key, p in PRESETS.items() if key in name), None)
    if preset is None:
        pytest.skip(f"no preset for {name}")
    if torch.cuda.get_device_properties(0).multi_processor_count != gpu(preset).sm_count:
        pytest.skip(f"{name}'s SM count is not preset {preset}'s: a different part")
    job = replace(GPT3_175B, gpu=preset, n_gpus=384)
    plan = ParallelPlan(384 // (tp * 12), tp, 12, 0, 1, recompute="full", sequence_parallel=False)
    forward = [tuple(int(x) for x in g) for g in layer_gemms(job, plan)]
    flops = sum(2 * m * k * n for m, k, n in forward)  # the same in every pass
    peak = gpu(preset).bf16_dense_flops
    record = {}
    for which in PASSES:
        seconds = sum(seconds_per_matmul(*_operands(*g, which), repeats=5) for g in forward)
        record[which] = (
            round(flops / seconds / peak, 3),
            round(layer_efficiency(job, plan, which), 3),
        )
    print(name, f"TP {tp}: pass → (measured, model)", record)  # fmt: skip
    for which, (measured, model) in record.items():
        assert model / H200_GEMM_MODEL_FACTOR <= measured <= model * H200_GEMM_MODEL_FACTOR, (
            which,
            measured,
            model,
        )
