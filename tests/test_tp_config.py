"""Bad tensor-parallel configurations fail before any process starts, saying what to choose;
the closed-form accounting agrees with the model and with Korthikanti et al.'s formula."""

from __future__ import annotations

import pytest

from dtlab.memory import activation_bytes_per_layer as korthikanti
from dtlab.mesh import Layout
from dtlab.models import GPTConfig
from dtlab.parallel.tensor import (
    check_heads,
    check_tensor_parallel,
    padded_vocab_size,
    tensor_parallel_check,
)
from dtlab.parallel.tensor.accounting import (
    activation_bytes_per_layer,
    comm_bytes_per_layer,
    korthikanti_without_dropout,
    params_per_rank,
)

TINY = GPTConfig.tiny()  # 4 heads, vocab 128, seq 32, d_ff 256


def _refused(config: GPTConfig, tp: int, sequence_parallel: bool = False) -> str:
    with pytest.raises(ValueError) as error:
        Layout(tp=tp).check(tp, model_check=tensor_parallel_check(config, sequence_parallel))
    return str(error.value)


def test_tp_that_does_not_divide_the_heads_is_refused_with_the_choices():
    assert "tp=3 does not divide 4 attention heads; choose 1, 2 or 4" in _refused(TINY, 3)


def test_tp_beyond_the_kv_heads_is_refused_naming_tp_and_n_kv_heads_choices():
    gqa = GPTConfig.tiny(n_heads=8, n_kv_heads=2)
    message = _refused(gqa, 4)
    assert "tp=4 exceeds 2 KV heads" in message
    assert "choose tp = 1 or 2, or n_kv_heads = 4 or 8" in message
    with pytest.raises(ValueError, match="exceeds 2 KV heads"):
        check_heads(8, 2, 4)  # the same rule for a lone attention module
    check_heads(8, 2, 2)


def test_tp_that_does_not_divide_the_vocabulary_is_accepted_because_it_is_padded():
    check_tensor_parallel(GPTConfig.tiny(vocab_size=100, n_heads=8), tp=8)
    assert [padded_vocab_size(v, t) for v, t in ((100, 8), (128, 8), (65, 2), (5, 4))] == [
        104, 128, 66, 8,
    ]  # fmt: skip


def test_sequence_parallel_needs_tp_to_divide_the_sequence_and_plain_tp_does_not():
    odd_sequence = GPTConfig.tiny(seq_len=30)
    assert "cuts seq_len=30 into tp=4 chunks" in _refused(odd_sequence, 4, sequence_parallel=True)
    Layout(tp=4).check(4, model_check=tensor_parallel_check(odd_sequence))


def test_every_problem_is_listed_at_once():
    message = _refused(GPTConfig.tiny(vocab_size=100, seq_len=31), 3, sequence_parallel=True)
    assert message.startswith("tensor parallelism tp=3 does not fit the model:")
    for part in ("4 attention heads", "d_ff=256", "seq_len=31"):
        assert part in message
    assert "vocab_size" not in message  # padded, not refused


def test_the_layout_itself_is_checked_first_and_keyword_degrees_work():
    with pytest.raises(ValueError, match="uses 2 ranks, not 4"):
        Layout(tp=2).check(4, model_check=tensor_parallel_check(TINY))
    check_tensor_parallel(TINY, tp=4, sequence_parallel=True)


def test_params_per_rank_is_the_model_size_at_tp_1_and_shrinks_by_about_t():
    odd = GPTConfig.tiny(vocab_size=65, tie_embeddings=False)
    for config in (TINY, GPTConfig.tiny(n_kv_heads=2, tie_embeddings=False, bias=False), odd):
        assert params_per_rank(config, 1) == config.num_params()
        assert config.num_params() / 4 < params_per_rank(config, 4) < config.num_params() / 2


def test_tp_and_sp_move_the_same_bytes_per_layer():
    for t in (2, 4, 8):
        tp = comm_bytes_per_layer(8, 1024, 4096, t, sequence_parallel=False, bytes_per_element=2)
        sp = comm_bytes_per_layer(8, 1024, 4096, t, sequence_parallel=True, bytes_per_element=2)
        assert sum(tp.values()) == sum(sp.values())
        assert sp["all_gather"] == sp["reduce_scatter"] == tp["all_reduce"] // 2


@pytest.mark.parametrize("t", [1, 2, 4])
def test_our_activation_count_is_korthikanti_without_dropout_in_fp32_plus_small_terms(t):
    """The lab GPT (fp32, dropout 0) saves twice Korthikanti's 16-bit bytes once his dropout
    masks and dropout output are taken out, plus LayerNorm statistics and the causal mask —
    except under SP, where it also keeps the regions' gathered inputs (2·sbh·(1 − 1/t))."""
    b, s = 2, 16
    config = GPTConfig.tiny(seq_len=s, d_model=32)
    h, a = config.d_model, config.n_heads
    for sp in (False, True):
        u = t if sp else 1
        small = 4 * (4 * s * b // u) + s * s  # mean and rstd of 2 LayerNorms; the bool mask
        gathered = 4 * 2 * s * b * h * (t - 1) // t if sp else 0
        ours = activation_bytes_per_layer(config, b, s, t, sp)
        assert ours == 2 * korthikanti_without_dropout(b, s, h, a, t, sp) + small + gathered
    # the subtraction removes exactly the dropout terms Korthikanti lists
    assert korthikanti(s, b, h, a) - korthikanti_without_dropout(b, s, h, a, 1, False) == (
        2 * s * b * h + 3 * a * s * s * b
    )


def test_the_exact_activation_count_refuses_what_it_does_not_cover():
    with pytest.raises(ValueError, match="multi-head attention without dropout"):
        activation_bytes_per_layer(GPTConfig.tiny(dropout=0.1), 2, 32, 2, False)
