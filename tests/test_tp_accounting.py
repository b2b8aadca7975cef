"""What tensor parallelism moves and holds per rank, counted, equals the formulas.

Bytes moved are counted from real messages on dtlab's rings (``collectives="dtlab"``), not
computed: one block's forward and backward must run exactly Megatron's two all-reduces of
``b·s·h`` elements each way (sequence parallel: two all-gathers and two reduce-scatters of the
same total). Bytes held come from the tensors themselves: parameters per rank, and the
activations one block saves for backward (saved-tensor hooks), against
:mod:`dtlab.parallel.tensor.accounting` — whose relation to Korthikanti et al.'s formula is
checked without processes in ``test_tp_config``.
"""

from __future__ import annotations

import pytest
import torch

from dtlab.models import GPT, GPTConfig, SyntheticTokens
from dtlab.parallel.tensor.accounting import (
    activation_bytes_per_layer,
    comm_bytes_per_layer,
    params_per_rank,
)

CONFIG = GPTConfig.tiny(seq_len=16, d_model=32, n_layers=2)
BATCH = 2


def _counted_on_rank(sequence_parallel: bool) -> dict:
    from dtlab.memory import ActivationMeter
    from dtlab.mesh import Mesh
    from dtlab.parallel.tensor import parallelize_gpt

    t = torch.distributed.get_world_size()
    tp = parallelize_gpt(GPT(CONFIG, seed=0), Mesh(tp=t), sequence_parallel, "dtlab")
    stats = tp.comm.comm_stats
    local_seq = CONFIG.seq_len // (t if sequence_parallel else 1)

    # One layer: a block's forward, then its backward.
    block = tp.model.blocks[0]
    x = torch.randn(BATCH, local_seq, CONFIG.d_model, requires_grad=True)
    stats.reset()
    with ActivationMeter(block) as meter:
        y = block(x, torch.arange(CONFIG.seq_len))
    forward = stats.snapshot()
    y.backward(torch.randn_like(y))
    backward = stats - forward

    # The whole model: embedding, blocks, head, vocabulary-parallel loss, SP gradient sums.
    tokens, targets = SyntheticTokens(CONFIG, n_batches=1, batch_size=BATCH, seed=0)[0]
    stats.reset()
    logits = tp.model(tokens)
    after_model = stats.snapshot()
    loss = tp.loss(logits, targets)
    after_loss = stats.snapshot()
    loss.backward()
    after_backward = stats.snapshot()
    tp.finish_gradients()
    return {
        "counted": stats.counted,
        "layer": [(s.calls, s.bytes_by_op) for s in (forward, backward)],
        "model_calls": [
            after_model.calls,
            after_backward.calls - after_loss.calls,
            stats.calls - after_backward.calls,
        ],  # fmt: skip
        "loss": (after_loss - after_model).bytes_by_op,
        "logit_bytes": logits.numel() * logits.element_size(),
        "param_bytes": tp.parameter_bytes(),
        "tied_once": tp.model.lm_head.weight is tp.model.embed.weight,
        "activation_bytes": meter.total_bytes,
    }


_RESULTS: dict[tuple[int, bool], list[dict]] = {}


def _results(request, world: int, sp: bool) -> list[dict]:
    """Every rank's counts for (world, sp), measured once per test session."""
    if (world, sp) not in _RESULTS:
        cluster = request.getfixturevalue(f"cluster{world}")
        _RESULTS[world, sp] = list(cluster.run(_counted_on_rank, sp))
    return _RESULTS[world, sp]


@pytest.mark.parametrize("world", [2, 4])
def test_tp_moves_two_all_reduces_per_layer_each_way_and_sp_the_same_bytes_as_gathers(
    world, request
):
    t, b, s, h, L = world, BATCH, CONFIG.seq_len, CONFIG.d_model, CONFIG.n_layers
    for sp in (False, True):
        per_layer = comm_bytes_per_layer(b, s, h, t, sp)  # the same forward and backward
        assert sum(per_layer.values()) == 2 * 2 * (t - 1) * b * s * h * 4 // t
        for r in _results(request, world, sp):
            assert r["counted"]
            for calls, by_op in r["layer"]:
                assert calls == (4 if sp else 2)
                assert by_op == per_layer, (sp, by_op, per_layer)
            # forward: 2 per layer + the embedding's exit + (SP) the head's entry;
            # backward: 2 per layer + the head's entry (f's all-reduce, or SP's pair);
            # then one all-reduce of the SP-partial gradients, none without SP.
            entries_and_exits = 2 if sp else 1
            assert r["model_calls"] == [
                2 * L * (2 if sp else 1) + entries_and_exits,
                2 * L * (2 if sp else 1) + entries_and_exits,
                1 if sp else 0,
            ], (sp, r["model_calls"])


@pytest.mark.parametrize("world", [2, 4])
def test_vocab_parallel_loss_moves_three_numbers_per_token_never_the_logits(world, request):
    t, tokens = world, BATCH * CONFIG.seq_len
    for r in _results(request, world, False):
        # max (op=MAX), sum of exp, target logit: three all-reduces of b·s floats
        assert r["loss"] == {"all_reduce": 3 * 2 * (t - 1) * tokens * 4 // t}
        assert sum(r["loss"].values()) < r["logit_bytes"] / 2


@pytest.mark.parametrize("world", [2, 4])
def test_parameter_and_activation_bytes_per_rank_match_the_formulas(world, request):
    measured = {}
    for sp in (False, True):
        for r in _results(request, world, sp):
            assert r["tied_once"]
            assert r["param_bytes"] == 4 * params_per_rank(CONFIG, world)
            expected = activation_bytes_per_layer(CONFIG, BATCH, CONFIG.seq_len, world, sp)
            assert r["activation_bytes"] == expected, (sp, r["activation_bytes"], expected)
            measured[sp] = r["activation_bytes"]
    assert measured[True] < measured[False]  # SP divides what lies outside the regions
