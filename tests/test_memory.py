"""dtlab.memory: the 16 bytes/param accounting, ZeRO tables, activation formulas and measurements."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from dtlab.memory import (
    RECIPES,
    ActivationMeter,
    MemoryReport,
    Recipe,
    activation_bytes,
    activation_bytes_per_layer,
    activation_checkpointing_bytes,
    cuda_memory_report,
    measure_model_state,
    model_state_bytes,
    zero_comm_bytes_per_rank,
)
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn


def test_7b_model_with_mixed_precision_adam_needs_112_gb_of_state():
    state = model_state_bytes(7_000_000_000)
    assert (state.params, state.grads, state.optimizer) == (14e9, 14e9, 84e9)
    assert state.total == 112_000_000_000


def test_70b_model_state_is_1_12_tb_not_the_280_gb_of_fp32_weights():
    assert model_state_bytes(70_000_000_000).total == 1_120_000_000_000


@pytest.mark.parametrize("n", [2, 4, 8])
def test_zero_stage_table_is_exact_when_n_divides_psi(n):
    psi = 1_000_000
    per_rank = {stage: model_state_bytes(psi, n, stage) for stage in range(4)}
    assert per_rank[0].total == 16 * psi
    assert per_rank[1].total == 4 * psi + 12 * psi // n
    assert per_rank[2].total == 2 * psi + 14 * psi // n
    assert per_rank[3].total == 16 * psi // n
    assert per_rank[2].by_category == {
        "parameters": 2 * psi,
        "gradients": 2 * psi // n,
        "optimizer_state": 12 * psi // n,
    }


def test_zero_shards_round_up_like_a_padded_flat_buffer():
    # 10 parameters over 4 ranks: a flat buffer padded to 12, 3 elements per rank.
    assert model_state_bytes(10, 4, 3).total == 3 * 16
    assert model_state_bytes(10, 4, 1).optimizer == 3 * 12


def test_recipes_hold_the_documented_bytes_per_parameter():
    assert {name: r.bytes_per_param for name, r in RECIPES.items()} == {
        "mixed_adam": 16,
        "fp32_adam": 16,
        "fp32_sgd": 8,
        "fp32_sgd_momentum": 12,
        "bf16_adam_no_master": 8,
    }
    assert model_state_bytes(100, recipe=Recipe(2, 2, 0)).total == 400
    with pytest.raises(KeyError, match="mixed_adam"):
        model_state_bytes(100, recipe="adam8bit")
    with pytest.raises(ValueError, match=r"\(0, 1, 2, 3\)"):
        model_state_bytes(100, 2, zero_stage=4)


def test_zero3_moves_one_and_a_half_times_the_bytes_of_ddp():
    psi, n = 8_000_000, 8
    ddp = zero_comm_bytes_per_rank(psi, n, 0)
    assert ddp == 2 * (n - 1) * psi // n * 2
    assert zero_comm_bytes_per_rank(psi, n, 1) == zero_comm_bytes_per_rank(psi, n, 2) == ddp
    assert zero_comm_bytes_per_rank(psi, n, 3) * 2 == ddp * 3
    assert zero_comm_bytes_per_rank(psi, 1, 3) == 0


def test_activation_bytes_per_layer_match_korthikanti_worked_numbers():
    # GPT-3-sized layer: s = 2048, b = 1, h = 12288, a = 96.
    s, b, h, a = 2048, 1, 12288, 96
    sbh = 25_165_824
    assert activation_bytes_per_layer(s, b, h, a) == 34 * sbh + 5 * a * s * s * b == 2_868_903_936
    t = 8
    tp = activation_bytes_per_layer(s, b, h, a, tensor_parallel=t)
    assert tp == 10 * sbh + 24 * sbh // t + 5 * a * s * s * b // t
    tp_sp = activation_bytes_per_layer(s, b, h, a, tensor_parallel=t, sequence_parallel=True)
    assert tp_sp * t == 2_868_903_936
    selective = activation_bytes_per_layer(
        s, b, h, a, tensor_parallel=t, sequence_parallel=True, recompute="selective"
    )
    assert selective == 34 * sbh // t
    assert activation_bytes_per_layer(s, b, h, a, recompute="full") == 2 * sbh
    assert activation_bytes(4, s, b, h, a) == 4 * 2_868_903_936


def test_activation_formula_refuses_tp_that_does_not_divide_heads():
    with pytest.raises(
        ValueError, match="TP degree 3 does not divide 8 attention heads; choose one of"
    ):
        activation_bytes_per_layer(128, 1, 512, 8, tensor_parallel=3)


def test_checkpointing_keeps_segment_inputs_plus_one_recomputed_segment():
    s, b, h, a, layers = 1024, 2, 1024, 16, 16
    per_layer = activation_bytes_per_layer(s, b, h, a)
    assert activation_checkpointing_bytes(layers, s, b, h, a) == layers * 2 * s * b * h + per_layer
    assert activation_checkpointing_bytes(layers, s, b, h, a, layers_per_checkpoint=4) == (
        4 * 2 * s * b * h + 4 * per_layer
    )
    assert activation_checkpointing_bytes(layers, s, b, h, a) < activation_bytes(layers, s, b, h, a)


def _tiny_gpt_after_one_adam_step():
    config = GPTConfig.tiny()
    model = GPT(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs, targets = SyntheticTokens(config, 1, 4)[0]
    loss_fn(model(inputs), targets).backward()
    optimizer.step()
    return config, model, optimizer


def test_measured_fp32_adam_state_of_tiny_gpt_is_4_4_8_bytes_per_param():
    config, model, optimizer = _tiny_gpt_after_one_adam_step()
    psi = config.num_params()  # the tied embedding / LM head counted once
    report = measure_model_state(model, optimizer)
    assert report.by_category["parameters"] == 4 * psi
    assert report.by_category["gradients"] == 4 * psi
    assert report.by_category["optimizer_state"] == 8 * psi
    n_param_tensors = len(list(model.parameters()))
    assert report.by_category["other"] == 4 * n_param_tensors  # Adam's 0-d fp32 `step` counters
    predicted = model_state_bytes(psi, recipe="fp32_adam")
    assert {k: report.by_category[k] for k in predicted.by_category} == predicted.by_category


def test_shared_storage_is_counted_once_in_the_first_category():
    model = nn.Linear(4, 4, bias=False)
    bucket = torch.zeros(16)
    model.weight.grad = bucket.view(4, 4)  # a gradient living in a DDP-style bucket
    report = measure_model_state(model, extra_buffers=[bucket, torch.zeros(8)])
    assert report.by_category["gradients"] == 64
    assert report.by_category["communication_buffers"] == 32
    assert report.total == 64 + 64 + 32
    custom = measure_model_state(model, extra_buffers={"activations": [torch.zeros(3)]})
    assert custom.by_category["activations"] == 12
    with pytest.raises(ValueError, match="communication_buffers"):
        measure_model_state(model, extra_buffers={"buffers": [torch.zeros(3)]})


def test_memory_report_fills_every_category_and_rejects_unknown_ones():
    report = MemoryReport(rank=1, by_category={"parameters": 10})
    assert report.by_category["activations"] == 0 and report.total == 10
    assert "parameters" in report.summary()
    with pytest.raises(ValueError, match="unknown memory categories"):
        MemoryReport(rank=0, by_category={"weights": 1})


def test_activation_meter_counts_linear_relu_saved_bytes_exactly():
    batch, d_in, d_out = 4, 8, 16
    layer = nn.Sequential(nn.Linear(d_in, d_out), nn.ReLU())
    x = torch.randn(batch, d_in, requires_grad=True)  # so Linear also saves its weight
    with ActivationMeter(layer) as meter:
        out = layer(x).sum()
    # Linear saves its input x, ReLU its output; the weight Linear saves is not an activation.
    assert meter.total_bytes == 4 * batch * (d_in + d_out)
    assert meter.by_module == {"0": 4 * batch * d_in, "1": 4 * batch * d_out}
    assert meter.num_saved == 3
    out.backward()
    assert meter.current_bytes == 0 and meter.peak_bytes == meter.total_bytes


def test_activation_meter_excludes_parameter_views_without_a_model():
    layer = nn.Linear(8, 16)
    x = torch.randn(4, 8, requires_grad=True)
    with ActivationMeter() as meter:
        layer(x)
    assert meter.total_bytes == 4 * 4 * 8


def test_activation_meter_on_gpt_attributes_every_byte_and_frees_after_backward():
    config = GPTConfig.tiny()
    model = GPT(config)
    inputs, targets = SyntheticTokens(config, 1, 2)[0]
    with ActivationMeter(model) as meter:
        loss = loss_fn(model(inputs), targets)
    assert meter.total_bytes > 0
    assert sum(meter.by_module.values()) == meter.total_bytes
    b, s, v = 2, config.seq_len, config.vocab_size
    assert meter.by_module["blocks.0.mlp.fc_out"] == 4 * b * s * config.d_ff  # GELU output
    assert meter.current_bytes == meter.total_bytes
    loss.backward()
    assert meter.current_bytes == 0
    assert meter.report().by_category["activations"] == meter.peak_bytes
    assert meter.by_module[""] >= 4 * b * s * v  # cross-entropy keeps its log-softmax


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_cuda_memory_report_explains_what_to_use_on_cpu():
    with pytest.raises(RuntimeError, match="measure_model_state"):
        cuda_memory_report()


def _measure_a_sharded_parameter():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2,))
    module = nn.Linear(8, 8, bias=False)
    module.weight = nn.Parameter(distribute_tensor(torch.ones(8, 8), mesh, [Shard(0)]))
    return measure_model_state(module).by_category["parameters"]


def test_a_sharded_dtensor_parameter_counts_only_its_local_shard(cluster2):
    local_shard_bytes = 4 * 8 * 4  # rows 4 of 8 per rank, fp32
    assert cluster2.run(_measure_a_sharded_parameter) == [local_shard_bytes] * 2
