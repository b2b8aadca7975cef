"""The BF16 reduction-precision measurement on CUDA tensors over NCCL: the GPU's BF16 adds round
like the CPU's, so the ring's result equals the one-process replay bit for bit."""

from __future__ import annotations

import pytest
import torch

import dtlab
from dtlab.collectives.reduction_precision import measure_reduction_errors

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_measured_errors_on_nccl_match_the_replay():
    world = torch.cuda.device_count()
    with dtlab.Cluster(world, device="cuda") as cluster:
        for result in cluster.run(measure_reduction_errors, 1001, 2):
            assert result["ring_matches_simulation"] == 1.0
            assert result["ring_fp32"] == pytest.approx(result["rounding_floor"], rel=1e-9)
            if world > 2:
                assert result["ring_bf16"] > result["ring_fp32"]
