"""bench precision at a tiny size: every variant is timed in one run, each says which GEMM path
it ran (on this CPU build: per-tensor and per-row on torch._scaled_mm, tiles simulated), and
bad sizes are refused. Times are never asserted."""

from __future__ import annotations

import json

import pytest
import torch

from dtlab.bench import precision as precision_bench


def test_bench_reports_ratios_and_the_path_each_variant_ran(tmp_path, capsys):
    out = tmp_path / "precision.json"
    argv = ["--m", "32", "--k", "32", "--n", "32", "--steps", "1", "--repeats", "1"]
    assert precision_bench.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["ratios"]["bf16_linear"]["median"] == 1.0
    assert set(result["ratios"]) >= {"bf16_linear", "fp8_tensor", "fp8_row", "fp8_tile"}
    assert {"mxfp8_cast_rowwise", "mxfp8_cast_both"} <= set(result["paths"])
    if not torch.cuda.is_available():
        assert result["paths"]["fp8_tile"] == ["forward:simulated"]
        assert "not an FP8 speed-up" in capsys.readouterr().out


def test_sizes_that_fp8_gemms_cannot_take_are_refused():
    with pytest.raises(SystemExit):
        precision_bench.main(["--m", "30"])
