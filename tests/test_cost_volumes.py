"""Bytes-on-the-wire formulas of dtlab.cost.volumes, checked against numbers worked by hand."""

from __future__ import annotations

import pytest

from dtlab.cost import volumes as v


def test_dp_allreduce_sends_two_times_n_minus_one_over_n_of_the_gradients():
    # 1e9 bf16 grads = 2 GB; 8 ranks: 2 * 7/8 * 2 GB = 3.5 GB.
    assert v.dp_allreduce_bytes_per_rank(1e9, 8) == pytest.approx(3.5e9)
    assert v.dp_allreduce_bytes_per_rank(1e9, 1) == 0


def test_no_sync_cuts_accumulation_traffic_by_the_number_of_micro_batches():
    with_no_sync = v.dp_bytes_per_optimizer_step(1e9, 8, accumulation_steps=4)
    without = v.dp_bytes_per_optimizer_step(1e9, 8, accumulation_steps=4, no_sync=False)
    assert with_no_sync == pytest.approx(3.5e9)
    assert without == pytest.approx(4 * 3.5e9)


def test_accumulation_steps_reach_a_4m_token_batch():
    # 4 Mi tokens, 2,048 tokens per micro-batch, DP 8: 4,194,304 / 16,384 = 256.
    assert v.accumulation_steps_for_batch(4 * 2**20, 2048, 8) == 256
    assert v.accumulation_steps_for_batch(1000, 16, 8) == 8  # 1000/128 = 7.8 -> 8


def test_tp_layer_does_four_allreduces_of_sbh():
    vol = v.tp_allreduce_volume_per_layer(seq_len=4096, micro_batch=1, hidden=8192, tp=8)
    payload = 4096 * 8192 * 2  # 64 MiB
    assert vol.collectives == 4
    assert vol.payload_bytes == payload
    assert vol.bytes_sent_per_rank == pytest.approx(4 * 2 * 7 / 8 * payload)
    forward = v.tp_allreduce_volume_per_layer(4096, 1, 8192, 8, backward=False)
    assert forward.collectives == 2
    assert forward.bytes_sent_per_rank == pytest.approx(vol.bytes_sent_per_rank / 2)


def test_sequence_parallel_moves_the_same_bytes_as_tensor_parallel():
    tp = v.tp_allreduce_volume_per_layer(2048, 2, 4096, 4)
    sp = v.sp_collective_volume_per_layer(2048, 2, 4096, 4)
    assert sp.collectives == 8
    assert sp.bytes_sent_per_rank == pytest.approx(tp.bytes_sent_per_rank)


def test_pipeline_sends_one_activation_per_micro_batch_per_boundary():
    assert v.pipeline_p2p_bytes_per_microbatch(4096, 1, 8192) == 4096 * 8192 * 2
    assert v.pipeline_p2p_bytes_per_microbatch(4096, 1, 8192, tp=8, scatter_gather=True) == (
        4096 * 8192 * 2 / 8
    )
    # 8 micro-batches, fwd + bwd, 2 interleaved chunks: 2 * 2 * 8 = 32 activations.
    assert v.pipeline_p2p_bytes_per_step(4096, 1, 8192, 8, virtual_stages=2) == 32 * 4096 * 8192 * 2


def test_ring_attention_passes_k_and_v_blocks_cp_minus_one_times():
    vol = v.ring_attention_kv_bytes(seq_len=131072, micro_batch=1, kv_hidden=1024, cp=8)
    block = 131072 // 8 * 1024 * 2  # one of K or V: 32 MiB
    assert vol.steps == 7
    assert vol.bytes_per_step == 2 * block
    assert vol.bytes_sent_per_rank == 7 * 2 * block
    with pytest.raises(ValueError, match="does not divide"):
        v.ring_attention_kv_bytes(1000, 1, 64, 3)


def test_ulysses_sends_four_tensors_minus_the_local_share():
    # s=8192, c=4: 2048 local tokens; h=4096, no GQA: 4 tensors of 2048*4096*2 B, 3/4 leaves.
    expected = 3 / 4 * 2048 * 4 * 4096 * 2
    assert v.ulysses_all_to_all_bytes(8192, 1, 4096, 4) == pytest.approx(expected)


def test_moe_dispatch_and_combine_scale_with_top_k_and_capacity():
    vol = v.moe_all_to_all_bytes_per_layer(
        tokens_per_rank=4096, hidden=7168, top_k=8, ep=64, capacity_factor=1.0
    )
    per = 8 * 4096 * 7168 * 2 * 63 / 64
    assert vol.all_to_alls == 4
    assert vol.bytes_per_all_to_all == pytest.approx(per)
    assert vol.bytes_sent_per_rank == pytest.approx(4 * per)
    padded = v.moe_all_to_all_bytes_per_layer(4096, 7168, 8, 64, capacity_factor=1.25)
    assert padded.bytes_per_all_to_all == pytest.approx(1.25 * per)
    with pytest.raises(ValueError, match="capacity_factor"):
        v.moe_all_to_all_bytes_per_layer(4096, 7168, 8, 64, capacity_factor=0)


def test_checkpoint_of_70b_sharded_over_8_ranks_is_105_gb_each():
    assert v.checkpoint_bytes_per_rank(70e9, 8) == pytest.approx(105e9)
    # 105 GB at 5 GB/s per rank: 21 s of blocking write.
    assert v.checkpoint_write_seconds(70e9, 8, 5e9) == pytest.approx(21.0)


def test_bad_degrees_name_the_argument():
    with pytest.raises(ValueError, match="tp=0"):
        v.tp_allreduce_volume_per_layer(1, 1, 1, 0)
