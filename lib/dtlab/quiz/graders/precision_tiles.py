"""Grader for lab 08's per-tile FP8 quantisation.

``precision.quantize_tiles`` — ``fn(x, tile) -> (q, scales)``: ``x`` (R, C) quantised to
``torch.float8_e4m3fn`` with one fp32 scale per ``tile = (tr, tc)`` block (R, C divisible),
``scales[i, j] = amax(block) / 448`` (1 for an all-zero block), ``x ≈ q · scale``, values clamped
to ±448 before the cast. Graded on the cluster's ranks for 1×128 and 128×128 tiles, with an
outlier and with an all-zero tile: scales equal amax/448, the dequantised tensor is as close to
``x`` as the library's, and the outlier spoils only its own tile. Calling the library's
quantiser is refused.

It stands alone because it shares nothing with the loss scaler's grader in
:mod:`.precision` (which re-exports its names): another exercise, its own cases, its own
refused answers, no collective to watch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.watch import noticing_calls

TILE_CASES = (((4, 256), (1, 128), None), ((256, 256), (128, 128), 5.0e4), ((2, 256), (1, 128), 0))


def _tile_answers() -> dict[Callable, str]:
    from dtlab.precision import fp8

    return {
        fp8.quantize_fp8: "dtlab.precision.quantize_fp8",
        fp8.block_amax: "dtlab.precision.fp8.block_amax",
        fp8.fake_quantize: "dtlab.precision.fake_quantize",
        fp8.scale_from_amax: "dtlab.precision.fp8.scale_from_amax",
    }


def _tiles_on_rank(fn: Callable) -> dict:
    import torch
    import torch.distributed as dist

    from dtlab.precision.fp8 import block_amax, quantize_fp8, relative_error

    rank = dist.get_rank() if dist.is_initialized() else 0
    problems, used = [], []
    for shape, tile, special in TILE_CASES:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(20 + rank))
        if special == 0:
            x[:, :128] = 0.0  # an all-zero tile
        elif special is not None:
            x[5, 9] = special  # an outlier in tile (0, 0)
        label = f"x of shape {shape}, tile {tile}" + (
            " with an all-zero tile" if special == 0 else " with an outlier" if special else ""
        )
        with noticing_calls(_tile_answers()) as noticed:
            try:
                q, scales = fn(x.clone(), tile)
            except NotImplementedError:
                raise
            except Exception as error:  # noqa: BLE001 - reported to the learner
                problems.append(f"{label}: your function raised {error!r}")
                continue
        used += noticed
        if not isinstance(q, torch.Tensor) or q.dtype != torch.float8_e4m3fn:
            problems.append(f"{label}: q must be a torch.float8_e4m3fn tensor")
            continue
        want_scales = torch.where((a := block_amax(x, tile)) > 0, a / 448.0, torch.ones_like(a))
        if not isinstance(scales, torch.Tensor) or scales.shape != want_scales.shape:
            problems.append(
                f"{label}: scales must have one entry per tile, shape {tuple(want_scales.shape)}"
            )
            continue
        nonzero = want_scales != 1.0
        if not torch.allclose(scales.float()[nonzero], want_scales[nonzero], rtol=1e-5):
            problems.append(f"{label}: each scale is its tile's amax / 448")
            continue
        deq = q.float() * scales.float().repeat_interleave(tile[0], 0).repeat_interleave(tile[1], 1)
        if not torch.isfinite(deq).all():
            problems.append(f"{label}: nan/inf after dequantising — clamp to ±448 before the cast")
            continue
        mine, library = (
            relative_error(x, deq),
            relative_error(x, quantize_fp8(x, "e4m3", "tile", tile).dequantize()),
        )
        if mine > library * 1.01 + 1e-9:
            problems.append(
                f"{label}: relative error {mine:.4f}, the per-tile quantiser reaches {library:.4f}"
            )
    return {"rank": rank, "problems": problems, "used": used}


@exercise("precision.quantize_tiles", title="Per-tile FP8 quantisation", world_size=2)
def grade_quantize_tiles(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(x, tile) -> (q, scales)``: per-tile E4M3 quantisation (module doc)."""
    results = cluster.run(_tiles_on_rank, fn)
    for r in results:
        if r["used"]:
            raise NotTheSkill(
                f"your quantiser calls {r['used'][0]} — the library's answer. Write it: view x "
                "as tiles, take each tile's amax, scale = amax / 448, clamp, cast"
            )
    for r in results:
        if r["problems"]:
            raise AssertionError(f"on rank {r['rank']}: {r['problems'][0]}")
    return GradeResult(
        True,
        "Per-tile E4M3 on every rank: scales = amax/448 per 1×128 and 128×128 tile, error as "
        "low as the library's, an outlier confined to its tile and an all-zero tile exact.",
    )
