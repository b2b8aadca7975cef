"""Attention activation memory per rank under ring attention is 1/N of the ring's total, and
carries no s×s term — measured with the saved-tensor-hook :class:`~dtlab.memory.ActivationMeter`.

What ring attention keeps for backward (``ctx.save_for_backward`` in
:mod:`dtlab.parallel.context.ring`) is, per rank with ``s = S/N`` local tokens::

    q, k, v, out   4 · B·H·s·Dh · e      (e = bytes per element; Hkv = H here)
    lse            B·H·s · e
    positions      s · 8                 (int64; q and k share one positions tensor)

— no (s, S) score block: every block's scores are recomputed in backward. Summed over ranks that
is ``B·H·S·(4·Dh + 1)·e + 8·S`` whatever N is, so each rank holds exactly 1/N of it. Full
attention in one process (:func:`math_attention`) keeps q, k, v (``3·B·H·S·Dh·e``), the causal
mask (``S²`` bools) and the softmax output (``B·H·S²·e``): the s² part ring attention never stores.
Asserted exactly: the per-rank bytes, and ``N · per-rank`` equal for N = 2 and 4 and below full.
"""

from __future__ import annotations

import pytest
import torch

B, H, S, DH = 1, 2, 64, 8
DTYPE = torch.float32
E = torch.finfo(DTYPE).bits // 8


def _full_inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, S, DH, generator=g, dtype=DTYPE) for _ in range(4)]


def _ring_saved_on_rank(style: str) -> dict:
    from dtlab.comm import Communicator
    from dtlab.memory.activations import ActivationMeter
    from dtlab.parallel.context import ring_attention, shard_sequence

    comm = Communicator(None, collectives="dtlab", dim="cp")
    q, k, v, d_out = _full_inputs()
    shards = [shard_sequence(t, comm.world_size, comm.rank, style, dim=2) for t in (q, k, v, d_out)]
    pos = shards[0][1]
    local = [t.requires_grad_() for t, _ in shards[:3]]
    with ActivationMeter() as meter:
        out = ring_attention(*local, pos, pos, comm, causal=True)
    saved, num_saved = meter.total_bytes, meter.num_saved
    out.backward(shards[3][0])
    return {"saved": saved, "num_saved": num_saved, "after_backward": meter.current_bytes}


def _full_saved() -> int:
    from dtlab.memory.activations import ActivationMeter
    from dtlab.models.attention import math_attention

    q, k, v, d_out = (t.requires_grad_() for t in _full_inputs())
    with ActivationMeter() as meter:
        out = math_attention(q, k, v, torch.arange(S), torch.arange(S), causal=True)
    out.backward(d_out)
    return meter.total_bytes


def ring_saved_expected(world: int) -> int:
    s = S // world
    return 4 * B * H * s * DH * E + B * H * s * E + 8 * s


def full_saved_expected() -> int:
    return 3 * B * H * S * DH * E + S * S + B * H * S * S * E


def test_full_attention_saves_the_s_squared_softmax():
    assert _full_saved() == full_saved_expected()


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("style", ["contiguous", "zigzag"])
def test_ring_attention_saves_one_nth_and_no_score_block(world, style, request):
    cluster = request.getfixturevalue(f"cluster{world}")
    results = cluster.run(_ring_saved_on_rank, style)
    expected = ring_saved_expected(world)
    for rank, r in enumerate(results):
        assert r["saved"] == expected, (rank, r, expected)
        assert r["num_saved"] == 7  # q, k, v, positions_q, positions_k, out, lse
        assert r["after_backward"] == 0  # backward freed everything it kept
    total = sum(r["saved"] for r in results)
    # N · per-rank is the same for every N: each rank keeps exactly 1/N of the ring's total ...
    assert total == world * expected == B * H * S * (4 * DH + 1) * E + 8 * S
    # ... and that total has no s² term, so per rank it is under 1/N of full attention's bytes.
    full = full_saved_expected()
    assert world * results[0]["saved"] < full


def test_bench_cp_reports_saved_bytes_ratio_below_one_over_n(cluster2):
    from dtlab.bench import cp

    r = cp.run(cluster2, seq=64, heads=H, dim=DH, steps=1, repeats=1)
    assert r.world_size == 2 and set(r.vs_full) == set(cp.VARIANTS)
    # bytes saved for backward are exact: per rank (zig-zag) ÷ full, as derived above
    assert r.saved_per_rank_vs_full == ring_saved_expected(2) / full_saved_expected()
    assert r.saved_per_rank_vs_full < 1 / 2
    assert all(0.0 <= f <= 1.0 for f in r.hidden_fraction.values())
