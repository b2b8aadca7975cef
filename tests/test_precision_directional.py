"""Row-wise vs column-wise MXFP8 copies: which GEMM each serves, their bytes, and the cost of
making the backward copy from the forward one (dtlab.precision.directional)."""

import pytest
import torch

from dtlab.precision.directional import (
    both_directions,
    columnwise_from_rowwise,
    quantize_columnwise,
    quantize_rowwise,
    requantize_error,
    saved_bytes_per_element,
)
from dtlab.precision.microscaling import mxfp8_roundtrip


def _x(rows=128, cols=256, seed=0):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def test_rowwise_copy_is_mxfp8_along_the_reduction_dimension():
    x = _x()
    assert torch.equal(quantize_rowwise(x).dequantize(), mxfp8_roundtrip(x))


def test_columnwise_copy_is_stored_transposed_with_blocks_down_the_columns():
    x = _x()
    col = quantize_columnwise(x)
    assert col.data.shape == (256, 128) and col.scale_codes.shape == (256, 128 // 32)
    assert torch.equal(col.dequantize(), mxfp8_roundtrip(x.t().contiguous()).t())


def test_a_column_outlier_spoils_rowwise_blocks_but_only_its_own_columnwise_blocks():
    x = _x()
    x[:, 5] *= 1e5
    row, col = both_directions(x)
    others = torch.ones_like(x, dtype=torch.bool)
    others[:, 5] = False
    row_err = (row.dequantize() - x)[others].norm() / x[others].norm()
    col_err = (col.dequantize() - x)[others].norm() / x[others].norm()
    assert col_err < 0.05 < row_err


def test_both_copies_hold_twice_the_bytes_of_one_counted_from_the_tensors():
    x = _x()
    row, col = both_directions(x)
    per_element = (row.nbytes + col.nbytes) / x.numel()
    assert per_element == saved_bytes_per_element("both") == 2 * (1 + 1 / 32)
    assert row.nbytes / x.numel() == saved_bytes_per_element("rowwise_only")


def test_reusing_the_forward_copy_rounds_twice_and_loses_accuracy_with_an_outlier_channel():
    x, dy = _x(), _x(128, 64, seed=1)
    x[:, 5] *= 50
    report = requantize_error(x, dy)
    assert report["x_from_forward"] > 1.1 * report["x_fresh"]
    assert report["wgrad_from_forward"] > report["wgrad_fresh"]
    assert 0 < report["changed"] < 1


def test_requantising_leaves_a_fresh_copy_of_exact_values_unchanged():
    """Values already on the column-wise grid survive a second column-wise rounding: the loss of
    re-using the forward copy comes from the grids differing, not from rounding twice as such."""
    col = quantize_columnwise(_x())
    again = quantize_columnwise(col.dequantize())
    assert torch.equal(again.dequantize(), col.dequantize())


def test_columnwise_from_rowwise_quantises_the_forward_copys_values_not_x():
    x = _x()
    x[:, 5] *= 50
    row = quantize_rowwise(x)
    assert torch.equal(
        columnwise_from_rowwise(row).dequantize(),
        quantize_columnwise(row.dequantize()).dequantize(),
    )
    assert not torch.equal(
        columnwise_from_rowwise(row).dequantize(), quantize_columnwise(x).dequantize()
    )


def test_a_dimension_that_does_not_split_into_blocks_says_how_to_pad():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_rowwise(torch.randn(4, 40))
    with pytest.raises(ValueError, match="choose one of"):
        saved_bytes_per_element("fp8")
