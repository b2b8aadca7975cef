"""Lab 07's graders: hand-written routing and splits pass; the library's answers (under any
name), token-major drop order, unordered experts, over-capacity experts, and splits that skip the
count exchange fail with a message that says what to fix."""

from __future__ import annotations

import torch
import torch.distributed as dist

from dtlab.models.moe_router import route_top_k as library_routing
from dtlab.parallel.expert import dispatch_splits as library_splits
from dtlab.quiz import check_exercise
from dtlab.quiz.graders.moe import active_fraction_key


def hand_routing(scores, top_k, capacity):
    weight, index = scores.topk(top_k, dim=-1)
    keep = torch.ones_like(index, dtype=torch.bool)
    if capacity is not None:
        used = [0] * scores.shape[1]
        for slot in range(top_k):
            for token in range(scores.shape[0]):
                e = int(index[token, slot])
                keep[token, slot] = used[e] < capacity
                used[e] += 1
    return index, weight, keep


def test_hand_written_routing_with_capacity_passes(cluster2):
    assert check_exercise("moe.top_k_routing", hand_routing, cluster2, record=False)


def test_the_library_routing_under_another_name_is_refused(cluster2):
    def wrapped(scores, top_k, capacity):
        return library_routing(scores, top_k, capacity)

    result = check_exercise("moe.top_k_routing", wrapped, cluster2, record=False)
    assert not result and "route_top_k" in result.message


def test_dropping_token_by_token_instead_of_first_choices_first_fails(cluster2):
    def token_major(scores, top_k, capacity):
        weight, index = scores.topk(top_k, dim=-1)
        keep = torch.ones_like(index, dtype=torch.bool)
        if capacity is not None:
            used = [0] * scores.shape[1]
            for token in range(scores.shape[0]):
                for slot in range(top_k):
                    e = int(index[token, slot])
                    keep[token, slot] = used[e] < capacity
                    used[e] += 1
        return index, weight, keep

    result = check_exercise("moe.top_k_routing", token_major, cluster2, record=False)
    assert not result and "first choices" in result.message


def test_ignoring_capacity_fails_naming_the_overflowing_expert(cluster2):
    def no_capacity(scores, top_k, capacity):
        return hand_routing(scores, top_k, None)

    result = check_exercise("moe.top_k_routing", no_capacity, cluster2, record=False)
    assert not result and "more than capacity" in result.message


def test_experts_in_ascending_id_order_are_not_best_first(cluster2):
    def sorted_ids(scores, top_k, capacity):
        index, weight, keep = hand_routing(scores, top_k, capacity)
        index, order = index.sort(-1)
        return index, weight.gather(1, order), keep

    result = check_exercise("moe.top_k_routing", sorted_ids, cluster2, record=False)
    assert not result and "best first" in result.message


def hand_splits(tokens_per_expert):
    ep = dist.get_world_size()
    received = torch.empty_like(tokens_per_expert)
    dist.all_to_all_single(received, tokens_per_expert)
    return (
        tokens_per_expert.view(ep, -1).sum(1).tolist(),
        received.view(ep, -1).sum(1).tolist(),
    )


def test_hand_written_splits_with_a_count_exchange_pass(cluster2):
    assert check_exercise("moe.dispatch_splits", hand_splits, cluster2, record=False)


def test_splits_that_skip_the_count_exchange_fail_with_the_hint(cluster2):
    def no_exchange(tokens_per_expert):
        send = tokens_per_expert.view(dist.get_world_size(), -1).sum(1).tolist()
        return send, send

    result = check_exercise("moe.dispatch_splits", no_exchange, cluster2, record=False)
    assert not result and "exchange the counts" in result.message


def test_per_expert_instead_of_per_rank_splits_fail(cluster2):
    def per_expert(tokens_per_expert):
        return tokens_per_expert.tolist(), tokens_per_expert.tolist()

    result = check_exercise("moe.dispatch_splits", per_expert, cluster2, record=False)
    assert not result and "one entry per rank" in result.message


def test_the_library_splits_are_refused(cluster2):
    def wrapped(tokens_per_expert):
        from dtlab.comm import Communicator

        send, recv, _ = library_splits(tokens_per_expert, Communicator(None, "dtlab", "ep"))
        return send, recv

    result = check_exercise("moe.dispatch_splits", wrapped, cluster2, record=False)
    assert not result and "dispatch_splits" in result.message


def test_active_fraction_of_top2_of_8_is_about_a_quarter():
    assert 0.25 < active_fraction_key(8, 2, 64, 256) < 0.26


def test_splits_from_an_all_gather_of_the_counts_pass_too(cluster2):
    def gathered(tokens_per_expert):
        ep, rank = dist.get_world_size(), dist.get_rank()
        every = [torch.empty_like(tokens_per_expert) for _ in range(ep)]
        dist.all_gather(every, tokens_per_expert)
        per = tokens_per_expert.numel() // ep
        recv = [int(c[rank * per : (rank + 1) * per].sum()) for c in every]
        return tokens_per_expert.view(ep, -1).sum(1).tolist(), recv

    assert check_exercise("moe.dispatch_splits", gathered, cluster2, record=False)


def test_splits_that_regenerate_the_other_ranks_counts_without_an_exchange_fail(cluster2):
    def regenerated(tokens_per_expert):
        # the counts a fixed-seed grader would draw for every rank: no exchange at all
        ep, rank, experts = dist.get_world_size(), dist.get_rank(), tokens_per_expert.numel()
        per = experts // ep
        recv = []
        for source in range(ep):
            g = torch.Generator().manual_seed(900 + 31 * source + experts)
            counts = torch.randint(0, 7, (experts,), generator=g)
            counts[source % experts] = 0
            counts[0] += 9
            recv.append(int(counts[rank * per : (rank + 1) * per].sum()))
        return tokens_per_expert.view(ep, -1).sum(1).tolist(), recv

    result = check_exercise("moe.dispatch_splits", regenerated, cluster2, record=False)
    assert not result and "recv_splits" in result.message


def test_splits_read_from_the_graders_generator_are_refused(cluster2):
    def peeking(tokens_per_expert):
        from dtlab.quiz.graders import moe

        ep = dist.get_world_size()
        moe._counts_of(0, tokens_per_expert.numel(), 0)
        return tokens_per_expert.view(ep, -1).sum(1).tolist(), [0] * ep

    result = check_exercise("moe.dispatch_splits", peeking, cluster2, record=False)
    assert not result and "count generator" in result.message


def test_splits_read_off_the_librarys_own_count_exchange_are_refused(cluster2):
    def library_counts(tokens_per_expert):
        from dtlab import collectives as C

        ep, rank = dist.get_world_size(), dist.get_rank()
        send = tokens_per_expert.view(ep, -1).sum(1).tolist()
        sender = torch.full((sum(send),), rank, dtype=torch.int64)
        arrived = C.all_to_all(sender, send)  # no recv_splits: the library exchanges the counts
        return send, torch.bincount(arrived, minlength=ep).tolist()

    result = check_exercise("moe.dispatch_splits", library_counts, cluster2, record=False)
    assert not result and "without recv_splits" in result.message


def test_splits_with_an_even_dtlab_all_to_all_of_the_counts_pass(cluster2):
    def even_counts(tokens_per_expert):
        from dtlab import collectives as C

        ep = dist.get_world_size()
        received = C.all_to_all(tokens_per_expert)  # E counts split evenly: an honest exchange
        return tokens_per_expert.view(ep, -1).sum(1).tolist(), received.view(ep, -1).sum(1).tolist()

    assert check_exercise("moe.dispatch_splits", even_counts, cluster2, record=False)
