"""FSDP's gather_cast hook: the default gathers exactly what it did (the shard cast to the compute
dtype), and an FP8 cast through the hook halves the counted all-gather bytes of BF16 while every
rank decodes the same weights — bit-equal to quantising each whole unit in one process."""

from __future__ import annotations

import pytest
import torch

from dtlab.parallel.zero import FullyShardedDataParallel, fp8_e4m3_gather_cast
from dtlab.parallel.zero.prefetch import _stack
from dtlab.precision.formats import E4M3_MAX
from dtlab.precision.mixed_precision import MixedPrecision

UNITS, WIDTH = 2, 32


def _plain_bf16(shard, _comm):
    """Today's cast written as a hook: the shard in BF16, gathered as it is."""
    return shard.to(torch.bfloat16), lambda gathered: gathered


CASTS = {"default": None, "plain_hook": _plain_bf16, "fp8": fp8_e4m3_gather_cast}


def _gathered_on_rank(cast: str, depth: int) -> dict:
    model = _stack(UNITS, WIDTH)
    fsdp = FullyShardedDataParallel(
        model, units=list(model), mixed_precision=MixedPrecision(torch.bfloat16),
        collectives="dtlab", prefetch=depth > 0, forward_prefetch=depth,
        backward_prefetch=depth, gather_cast=CASTS[cast],
    )  # fmt: skip
    seen = {}
    for i, block in enumerate(model):  # runs after FSDP's pre-hook: the unit is gathered
        block.register_forward_pre_hook(
            lambda m, a, i=i: seen.update(
                {(i, n): p.detach().clone() for n, p in m.named_parameters()}
            )  # fmt: skip
        )
    before = fsdp.comm_stats.bytes_by_op.get("all_gather", 0)
    torch.manual_seed(4)
    fsdp(torch.randn(8, WIDTH)).float().square().mean().backward()
    return {
        "gathered": seen,
        "all_gather_bytes": fsdp.comm_stats.bytes_by_op["all_gather"] - before,
        "grads": {n: p.grad.clone() for n, p in fsdp.named_parameters()},
    }


def _original_parameters() -> list[dict[str, torch.Tensor]]:
    return [dict(block.named_parameters()) for block in _stack(UNITS, WIDTH)]


@pytest.mark.parametrize("depth", [0, 1])
def test_default_gather_is_the_shard_cast_to_the_compute_dtype_bit_for_bit(cluster2, depth):
    default = cluster2.run(_gathered_on_rank, "default", depth)
    hooked = cluster2.run(_gathered_on_rank, "plain_hook", depth)
    originals = _original_parameters()
    for ours, theirs in zip(default, hooked, strict=True):
        assert ours["all_gather_bytes"] == theirs["all_gather_bytes"] > 0
        for (i, name), value in ours["gathered"].items():
            assert value.dtype == torch.bfloat16
            assert torch.equal(value, originals[i][name].detach().to(torch.bfloat16))
            assert torch.equal(value, theirs["gathered"][i, name])
        for name, grad in ours["grads"].items():
            assert torch.equal(grad, theirs["grads"][name]), name


def _whole_unit_in_e4m3(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The one-process reference: one scale, amax/448 of the whole unit."""
    amax = max(float(p.detach().abs().max()) for p in params.values())
    scale = amax / E4M3_MAX
    return {
        n: ((p.detach() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()
            * scale).to(torch.bfloat16)
        for n, p in params.items()
    }  # fmt: skip


@pytest.mark.parametrize("depth", [0, 1])
def test_fp8_gather_cast_halves_counted_bytes_and_every_rank_decodes_the_same_weights(
    cluster2, depth
):
    bf16 = cluster2.run(_gathered_on_rank, "default", depth)
    fp8 = cluster2.run(_gathered_on_rank, "fp8", depth)
    for ours, base in zip(fp8, bf16, strict=True):  # counted from the ring's messages
        assert 2 * ours["all_gather_bytes"] == base["all_gather_bytes"] > 0
    references = [_whole_unit_in_e4m3(params) for params in _original_parameters()]
    first = fp8[0]["gathered"]
    assert len(first) == 4 * UNITS  # two Linear weights and biases per block, forward
    for (i, name), value in first.items():
        assert torch.equal(value, fp8[1]["gathered"][i, name])  # the same bits on every rank
        assert torch.equal(value, references[i][name])
        assert not torch.equal(value, bf16[0]["gathered"][i, name])  # FP8 really travelled
    for rank_out in fp8:
        assert all(torch.isfinite(g).all() for g in rank_out["grads"].values())


def _refused_on_rank() -> str:
    model = _stack(1, 8)
    fsdp = FullyShardedDataParallel(
        model, units=list(model), gather_cast=lambda s, c: (s.reshape(1, -1), lambda g: g)
    )
    try:
        fsdp(torch.randn(2, 8))
    except ValueError as error:
        return str(error)
    return ""


def test_a_gather_cast_whose_payload_is_not_one_element_per_shard_element_is_refused(cluster2):
    for message in cluster2.run(_refused_on_rank):
        assert "1-D tensor with one element per shard element" in message
