"""On NCCL the counted path has no background stream: an asynchronous counted collective runs
inside its launch, says so (``OverlapRefused``, ``overlapped=False``) and is still correct.

Skipped without CUDA; ``pytest -m gpu`` selects it on a GPU machine (a 1-rank NCCL cluster).
"""

from __future__ import annotations

import pytest
import torch

import dtlab

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _async_counted_on_nccl() -> dict:
    import warnings

    from dtlab.comm import Communicator, OverlapRefused

    comm = Communicator(collectives="dtlab", dim="dp")
    x = torch.arange(8.0, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = comm.all_reduce(x, name="a", async_op=True)
        second = comm.all_reduce(x, name="b", async_op=True)
    first.wait()
    second.wait()
    return {
        "overlaps": comm.overlaps,
        "overlapped": (first.overlapped, second.overlapped),
        "refused": sum(issubclass(w.category, OverlapRefused) for w in caught),
        "value": x.cpu().tolist(),
    }


def test_counted_async_on_nccl_runs_in_its_launch_and_warns_once():
    with dtlab.Cluster(1, device="cuda") as cluster:
        out = cluster.run(_async_counted_on_nccl)[0]
    assert out["overlaps"] is False and out["overlapped"] == (False, False)
    assert out["refused"] == 1  # once per communicator
    assert out["value"] == [float(i) for i in range(8)]
