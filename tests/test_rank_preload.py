"""Ranks start with torch's optimizer machinery already imported (the forkserver preloads it).

Every ``torch.optim`` step imports ``torch._dynamo`` the first time it runs (about 0.9 s of CPU);
without the preload each rank of each new Cluster paid it on its first step, which made a
16-rank lab cell on 2 cores spend most of its time importing.
"""

import sys

import dtlab


def _already_imported() -> bool:
    return "torch._dynamo" in sys.modules


def test_a_fresh_rank_has_torch_dynamo_imported_before_any_user_code():
    with dtlab.Cluster(1, device="cpu") as cluster:
        assert cluster.run(_already_imported) == [True]
