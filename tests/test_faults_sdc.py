"""What the silent-data-corruption checks see on real replicas: a replica's own copy flipped
after the last collective is caught by the cross-replica parameter checksum; a compute error on
one rank is averaged into every replica by the gradient all-reduce, so that checksum misses it,
and only comparing the gradients of a shared batch before the all-reduce catches it. With two
replicas a mismatch cannot say which one is wrong."""

import pytest
import torch
import torch.distributed as dist

import dtlab
from dtlab.faults import compare_gradients, compare_replicas, flip_bit, wrong_output
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank

CONFIG = GPTConfig.tiny(d_model=32)


def _data_parallel_step(bad_rank, same_batch: bool) -> dict:
    """One data-parallel SGD step; ``bad_rank``'s first MLP computes a wrong number. Returns what
    each check said and the weights after the step."""
    model = GPT(CONFIG, seed=0)  # identical on every replica
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if dtlab.rank() == bad_rank:
        wrong_output(model.blocks[0].mlp.fc_in, index=7, bit=22)
    batch = SyntheticTokens(CONFIG, 1, 4 * dtlab.world_size(), seed=0)[0]
    x, y = batch if same_batch else shard_for_rank(batch, dtlab.rank(), dtlab.world_size())
    loss_fn(model(x), y).backward()
    before_allreduce = [(d.parameter, d.suspects, str(d)) for d in compare_gradients(model)]
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dtlab.world_size()
    opt.step()
    after_step = [(d.parameter, d.suspects) for d in compare_replicas(model)]
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    n_params = len(list(model.parameters()))
    return {"gradients": before_allreduce, "replicas": after_step, "params": params, "n": n_params}


def _max_change(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_a_compute_error_on_one_rank_reaches_every_replica_and_the_checksum_misses_it(cluster3):
    clean = cluster3.run(_data_parallel_step, None, False)
    wrong = cluster3.run(_data_parallel_step, 1, False)
    assert [r["replicas"] for r in wrong] == [[], [], []]  # the replicas agree bit for bit...
    for r in range(3):
        assert _max_change(wrong[r]["params"], wrong[0]["params"]) == 0.0
        assert _max_change(wrong[r]["params"], clean[r]["params"]) > 0.0  # ...on wrong weights
    assert [r["replicas"] for r in clean] == [[], [], []]


def test_comparing_gradients_of_a_shared_batch_before_the_all_reduce_names_the_rank(cluster3):
    clean = cluster3.run(_data_parallel_step, None, True)
    assert [r["gradients"] for r in clean] == [[], [], []]  # same batch: bit-identical
    wrong = cluster3.run(_data_parallel_step, 1, True)[0]
    assert wrong["gradients"], "the planted compute error changed no gradient"
    assert {tuple(suspects) for _, suspects, _ in wrong["gradients"]} == {(1,)}
    assert "rank(s) [1] disagree with the majority" in wrong["gradients"][0][2]
    assert wrong["replicas"] == []  # while the parameter checksum, after the step, sees nothing


def test_gradients_of_different_data_differ_by_design_so_that_check_needs_a_shared_batch(
    cluster3,
):
    ordinary = cluster3.run(_data_parallel_step, None, False)[0]
    assert len(ordinary["gradients"]) == ordinary["n"]  # every gradient "differs"


def _flip_own_copy(bad_rank) -> list[tuple]:
    model = GPT(CONFIG, seed=0)
    if dtlab.rank() == bad_rank:
        flip_bit(model.blocks[1].mlp.fc_in.weight.data, index=5, bit=3)
    return [(d.parameter, d.suspects, str(d)) for d in compare_replicas(model)]


def test_with_two_replicas_a_flipped_copy_is_caught_but_no_rank_can_be_named(cluster2):
    ((name, suspects, message),) = cluster2.run(_flip_own_copy, 1)[0]
    assert name == "blocks.1.mlp.fc_in.weight" and suspects == [0, 1]
    assert "no majority agrees" in message and "any of ranks [0, 1] may be wrong" in message


def test_with_two_replicas_a_shared_batch_gradient_check_cannot_name_the_rank_either(cluster2):
    wrong = cluster2.run(_data_parallel_step, 0, True)[1]
    assert wrong["gradients"] and all(s == [0, 1] for _, s, _ in wrong["gradients"])


def test_a_wrong_output_hook_flips_one_bit_and_heals_on_remove():
    layer = torch.nn.Linear(3, 4)
    x = torch.randn(2, 3)
    good = layer(x)
    handle = wrong_output(layer, index=5, bit=31)
    bad = layer(x)
    assert torch.equal(bad.view(-1)[5], -good.view(-1)[5])
    assert int((bad != good).sum()) == 1
    handle.remove()
    assert torch.equal(layer(x), good)
    with pytest.raises(ValueError, match="outside"):
        flip_bit(torch.zeros(2), 0, 32)
