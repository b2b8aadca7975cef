"""MXFP8 and NVFP4 beside per-tensor, per-row and per-tile FP8 on the same tensors with an
outlier (errors measured on the ordinary values): block scales keep MXFP8 at its own rounding
whatever the outlier; NVFP4's 16-element E4M3 scales absorb a moderate outlier, but its per-tensor
scale ties every block scale to the outlier, so a huge one pushes them below E4M3's range. The
encodings themselves: E8M0 scales put each block's amax in [256, 512), NVFP4 blocks are E2M1
values times an E4M3 scale times one fp32 scale."""

from __future__ import annotations

import torch

from dtlab.precision import mxfp8_roundtrip, nvfp4_roundtrip, quantize_fp8, relative_error
from dtlab.precision.formats import E2M1_MAX, E4M3_MAX
from dtlab.precision.fp8 import block_amax
from dtlab.precision.microscaling import E2M1_GRID, mxfp8_scales


def _errors(outlier: float | None) -> dict[str, float]:
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(0))
    if outlier is not None:
        x[3, 7] = outlier
    ordinary = x.abs() < 100
    errors = {
        g: relative_error(x, quantize_fp8(x, "e4m3", g).dequantize(), ordinary)
        for g in ("tensor", "row", "tile")
    }
    errors["mxfp8"] = relative_error(x, mxfp8_roundtrip(x), ordinary)
    errors["nvfp4"] = relative_error(x, nvfp4_roundtrip(x), ordinary)
    return errors


def test_errors_of_every_granularity_and_microscaling_format_next_to_an_outlier():
    clean, moderate, huge = _errors(None), _errors(1e5), _errors(1e6)
    # measured, no outlier: tensor 0.0265, row 0.0263, tile 0.0257, mxfp8 0.0292, nvfp4 0.0958
    assert clean["tile"] <= clean["mxfp8"] < 0.035 < 0.07 < clean["nvfp4"] < 0.12
    # outlier 1e5: per-tensor 0.126; the block formats barely notice (mxfp8 0.0293, nvfp4 0.100)
    assert moderate["tensor"] > 4 * moderate["tile"]
    for name in ("row", "tile", "mxfp8", "nvfp4"):
        assert moderate[name] < 1.1 * clean[name]
    # outlier 1e6: per-tensor 0.95; mxfp8 0.0325 keeps; nvfp4 0.72 — its block scales
    # amax_block·448/amax fall under E4M3's smallest normal (2^-6) and lose their digits
    assert huge["tensor"] > 0.5 and huge["mxfp8"] < 1.2 * clean["mxfp8"]
    assert huge["nvfp4"] > 4 * clean["nvfp4"]


def test_mxfp8_scale_puts_each_blocks_amax_between_256_and_512():
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(1)) * 1e-3
    x[0, :32] *= 1e4  # one loud block
    ratio = block_amax(x, (1, 32)) / mxfp8_scales(x)
    assert ((ratio >= 256) & (ratio < 512)).all()
    roundtrip = mxfp8_roundtrip(x)
    assert roundtrip.abs().max() <= x.abs().max()  # values above 448·scale saturate, none grow


def test_nvfp4_values_are_e2m1_times_an_e4m3_block_scale_times_one_tensor_scale():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    tensor_scale = x.abs().max() / (E4M3_MAX * E2M1_MAX)
    block_scale = (block_amax(x, (1, 16)) / E2M1_MAX / tensor_scale).to(torch.float8_e4m3fn)
    per_element = (block_scale.float() * tensor_scale).repeat_interleave(16, 1)
    codes = nvfp4_roundtrip(x) / per_element
    assert torch.isin(codes.abs().round(decimals=5), E2M1_GRID).all()
    assert codes.abs().max() <= E2M1_MAX
