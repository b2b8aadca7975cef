"""Deduplicated checkpoint writes: every replica, rank 0, or balanced by planned size (DCP's)."""

from __future__ import annotations

import pytest
import torch

from dtlab.checkpoint.dedup import balanced_slowest_bytes, plan_writers, write_seconds

SIZES = [400, 40, 300, 120, 120, 8, 200]  # bytes of seven replicated tensors, in state order


def _replicated_items():
    return [(f"t{i}", b) for i, b in enumerate(SIZES)]


def test_balanced_gives_each_duplicate_to_the_smallest_plan_so_far():
    plan = plan_writers([_replicated_items()] * 2, "balanced")
    # planned so far: t0→0 (tie, lowest) [400, 0]; t1→1 [400, 40]; t2→1 [400, 340];
    # t3→1 [400, 460]; t4→0 [520, 460]; t5→1 [520, 468]; t6→1 [520, 668]
    assert plan.keys == [["t0", "t4"], ["t1", "t2", "t3", "t5", "t6"]]
    assert plan.bytes_per_rank == [520, 668]
    assert plan.total_bytes == sum(SIZES)


def test_lowest_puts_every_replicated_byte_on_rank_0_and_every_writes_n_copies():
    lowest = plan_writers([_replicated_items()] * 4, "lowest")
    every = plan_writers([_replicated_items()] * 4, "every")
    assert lowest.bytes_per_rank == [sum(SIZES), 0, 0, 0]
    assert every.bytes_per_rank == [sum(SIZES)] * 4
    balanced = plan_writers([_replicated_items()] * 4, "balanced")
    assert balanced.slowest_rank_bytes < lowest.slowest_rank_bytes
    assert balanced.total_bytes == lowest.total_bytes == every.total_bytes / 4


def test_sharded_items_count_towards_the_plan_that_holds_them():
    plans = [[("big@0", 1000), ("r", 10)], [("r", 10), ("small@1", 1)]]
    assert plan_writers(plans, "balanced").keys == [["big@0"], ["r", "small@1"]]


def test_write_time_formula_caps_at_the_shared_file_system():
    assert balanced_slowest_bytes(8e9, 8, 1e9) == 2e9
    assert write_seconds("lowest", 8e9, 8, 1e9) == 8.0
    assert write_seconds("balanced", 8e9, 8, 1e9) == 1.0
    assert write_seconds("every", 8e9, 8, 1e9, shared_storage_bytes_per_s=4e9) == 16.0
    with pytest.raises(ValueError, match="choose one of"):
        plan_writers([], "rank0")


def _dcp_writer_of_each_key(root: str) -> dict:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    state = {f"t{i}": torch.zeros(b // 4, dtype=torch.float32) for i, b in enumerate(SIZES)}
    dcp.save(state, checkpoint_id=root)
    dist.barrier()
    storage = dcp.FileSystemReader(root).read_metadata().storage_data
    return {index.fqn: int(info.relative_path.split("_")[2]) for index, info in storage.items()}


def test_balanced_plan_is_the_plan_torch_distributed_checkpoint_writes(cluster2, tmp_path):
    """DCP's default planner (torch 2.11–2.14) writes each replicated tensor where our plan
    does: read back from the files its metadata names (``__<rank>_<n>.distcp``)."""
    writer_of = cluster2.run(_dcp_writer_of_each_key, str(tmp_path / "dcp"))[0]
    plan = plan_writers([_replicated_items()] * 2, "balanced")
    ours = {key: rank for rank, keys in enumerate(plan.keys) for key in keys}
    assert writer_of == ours


def _save_and_reload(root: str, writers: str) -> dict:
    import dtlab
    from dtlab.checkpoint import load, replicated_state
    from dtlab.checkpoint.write_balance import measured_save

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.Linear(24, 8))
    out = measured_save(root, 1, replicated_state(model), writers)
    fresh = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.Linear(24, 8))
    load(root, replicated_state(fresh))
    same = all(
        torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(), strict=True)
    )
    items = [(f"model/{n}", p.nbytes) for n, p in model.named_parameters()]
    return {**out, "same": same, "items": items, "rank": dtlab.rank()}


@pytest.mark.parametrize("writers", ["every", "lowest", "balanced"])
def test_each_rank_writes_the_counted_bytes_its_plan_gives_it_and_loads_back(
    cluster2, tmp_path, writers
):
    results = cluster2.run(_save_and_reload, str(tmp_path / writers), writers)
    plan = plan_writers([results[0]["items"]] * 2, writers)
    assert [r["bytes"] for r in results] == plan.bytes_per_rank
    assert all(r["same"] for r in results)
