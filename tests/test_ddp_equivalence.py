"""Every DDP variant trains exactly like one process (and like torch's DDP) on awkward models."""

from __future__ import annotations

import torch

import dtlab
from dtlab.parallel import BucketedDDP, NaiveDDP, OverlappedDDP
from dtlab.parallel.data.equivalence import (
    FP32_STEP_TOLERANCE,
    TiedToyModel,
    lm_loss,
    max_abs_difference,
    parameters_by_name,
    rank_slice,
    toy_batches,
    train_single_process,
)

BRANCH_ON = [True, False, True]  # the branch's parameters get no gradient in step 1


def _variants():
    from torch.nn.parallel import DistributedDataParallel

    return {
        "naive": lambda m, **kw: NaiveDDP(m, find_unused_parameters=True, **kw),
        "overlapped": lambda m, **kw: OverlappedDDP(m, find_unused_parameters=True, **kw),
        "bucketed": lambda m, **kw: BucketedDDP(
            m, find_unused_parameters=True, bucket_cap_mb=0.001, first_bucket_mb=0.0005, **kw
        ),
        "bucket_views": lambda m, **kw: BucketedDDP(
            m,
            find_unused_parameters=True,
            bucket_cap_mb=0.001,
            first_bucket_mb=0.0005,
            gradient_as_bucket_view=True,
            **kw,
        ),
        "torch_ddp": lambda m: DistributedDataParallel(m, find_unused_parameters=True),
    }


OURS = ("naive", "overlapped", "bucketed", "bucket_views")


def _train_every_variant_on_the_tied_toy_model() -> dict:
    rank, world = dtlab.rank(), dtlab.world_size()
    batches = toy_batches(len(BRANCH_ON))
    reference = TiedToyModel(seed=100)  # rank 0's initial weights
    ref = train_single_process(
        reference,
        torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1),
        batches,
        before_step=lambda s: setattr(reference, "use_branch", BRANCH_ON[s]),
    )
    out = {}
    for name, wrap in _variants().items():
        model = TiedToyModel(seed=100 + rank)  # every rank starts different: broadcast must fix it
        ddp = wrap(model)
        assert ddp.module is model
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2, weight_decay=0.1)
        for step, (tokens, targets) in enumerate(batches):
            model.use_branch = BRANCH_ON[step]
            opt.zero_grad(set_to_none=True)
            logits = ddp(rank_slice(tokens, rank, world))
            lm_loss(logits, rank_slice(targets, rank, world)).backward()
            if step == 1:
                out[f"{name}.unused_grad_is_none"] = model.branch.weight.grad is None
            opt.step()
        out[f"{name}.max_diff"] = max_abs_difference(parameters_by_name(model), ref)
        out[f"{name}.frozen_matches_rank0"] = torch.equal(
            model.frozen.weight, reference.frozen.weight
        )
        out[f"{name}.still_tied"] = model.head.weight is model.embed.weight
    return out


def test_ddp_variants_match_single_process_and_torch_ddp_on_tied_frozen_unused(cluster2):
    for rank_result in cluster2.run(_train_every_variant_on_the_tied_toy_model):
        for name in _variants():
            assert rank_result[f"{name}.max_diff"] < FP32_STEP_TOLERANCE, (name, rank_result)
            assert rank_result[f"{name}.unused_grad_is_none"], name
            assert rank_result[f"{name}.frozen_matches_rank0"], name
            assert rank_result[f"{name}.still_tied"], name


def _accumulate_with_no_sync_and_count_bytes() -> dict:
    rank, world = dtlab.rank(), dtlab.world_size()
    ((tokens, targets),) = toy_batches(1, global_batch=8)
    reference = TiedToyModel(seed=0)
    lm_loss(reference(tokens), targets).backward()
    expected = {n: p.grad.clone() for n, p in reference.named_parameters() if p.grad is not None}
    out = {}
    for name, wrap in [(n, w) for n, w in _variants().items() if n in OURS]:
        model = TiedToyModel(seed=0)
        ddp = wrap(model, collectives="dtlab")  # our rings: the bytes below are counted
        ddp.find_unused_parameters = False
        ddp.comm_stats.reset()
        local_x, local_y = rank_slice(tokens, rank, world), rank_slice(targets, rank, world)
        # two micro-batches per rank; the first accumulates locally without any communication
        with ddp.no_sync():
            lm_loss(ddp(local_x[:1]), local_y[:1]).div(2).backward()
        out[f"{name}.calls_after_no_sync"] = ddp.comm_stats.calls
        lm_loss(ddp(local_x[1:]), local_y[1:]).div(2).backward()
        ddp.finish_gradient_synchronization()  # already done at end of backward: a no-op
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        out[f"{name}.max_grad_diff"] = max_abs_difference(grads, expected)
        out[f"{name}.bytes_sent"] = ddp.comm_stats.bytes_sent
        out[f"{name}.counted"] = ddp.comm_stats.counted
        out[f"{name}.calls"] = ddp.comm_stats.calls
        out[f"{name}.grad_numel"] = sum(p.numel() for p in ddp.params)
        out[f"{name}.buckets"] = len(getattr(ddp, "buckets", ()))
        storages = {b.buffer.untyped_storage().data_ptr() for b in getattr(ddp, "buckets", ())}
        out[f"{name}.grads_in_buckets"] = all(
            p.grad.untyped_storage().data_ptr() in storages for p in ddp.params
        )
        # a second step without set_to_none accumulates into whatever .grad is (views included)
        for p in ddp.params:
            p.grad.zero_()
        lm_loss(ddp(local_x), local_y).backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        out[f"{name}.second_step_diff"] = max_abs_difference(grads, expected)
    return out


def test_no_sync_accumulates_locally_and_counted_bytes_match_ring_formula(cluster4):
    world = 4
    for r in cluster4.run(_accumulate_with_no_sync_and_count_bytes):
        for name in OURS:
            assert r[f"{name}.calls_after_no_sync"] == 0
            assert r[f"{name}.max_grad_diff"] < 1e-6, (name, r)
            assert r[f"{name}.second_step_diff"] < 1e-6, (name, r)
            fp32_grad_bytes = 4 * r[f"{name}.grad_numel"]
            assert r[f"{name}.counted"]
            assert r[f"{name}.bytes_sent"] == 2 * (world - 1) / world * fp32_grad_bytes
        params = r["naive.grad_numel"] and r["naive.calls"]
        assert r["overlapped.calls"] == params  # one collective per parameter
        assert r["bucketed.calls"] == r["bucketed.buckets"] < params  # one per bucket
        assert r["bucket_views.grads_in_buckets"]  # gradients are the buckets: no copy back
        assert not r["bucketed.grads_in_buckets"]  # torch's default: separate memory


def test_buckets_follow_reverse_registration_order_with_a_smaller_first_bucket():
    import torch.nn as nn

    from dtlab.parallel import assign_buckets

    params = [nn.Parameter(torch.zeros(64)) for _ in range(6)]  # 256 bytes each
    params.insert(3, nn.Parameter(torch.zeros(32, dtype=torch.float64)))
    byte = 1 / 2**20  # caps are in MB
    buckets = assign_buckets(params, bucket_cap_mb=512 * byte, first_bucket_mb=256 * byte)
    fp32 = [b for b in buckets if b[0].dtype == torch.float32]
    assert [len(b) for b in fp32] == [1, 2, 2, 1]  # first bucket holds one 256-byte gradient
    assert [p for b in fp32 for p in b] == [p for p in reversed(params) if p.dtype == torch.float32]
    assert [b for b in buckets if b[0].dtype == torch.float64] == [[params[3]]]  # one dtype each


class _TwoLinears(torch.nn.Module):
    """``a(x) + b(x)``, or ``a(x)`` alone when ``use_b`` is off."""

    def __init__(self):
        super().__init__()
        self.m = torch.nn.ModuleDict({"a": torch.nn.Linear(3, 1), "b": torch.nn.Linear(3, 1)})
        self.use_b = True

    def forward(self, x):
        y = self.m["a"](x)
        return y + self.m["b"](x) if self.use_b else y


def _a_gradient_the_synced_backward_does_not_touch() -> dict:
    """Two cases where a parameter holds a gradient its synced backward never reaches: kept at
    zero by ``zero_grad(set_to_none=False)`` while unused, and accumulated only under
    ``no_sync``. Each must be averaged like any other (one process would hold 0 and the
    accumulated value)."""
    rank, world = dtlab.rank(), dtlab.world_size()
    out = {}
    for name, wrap in [(n, w) for n, w in _variants().items() if n in OURS]:
        torch.manual_seed(0)
        net = _TwoLinears()
        ddp = wrap(net)
        ddp.find_unused_parameters = False
        x = torch.full((2, 3), float(rank + 1))
        ddp(x).sum().backward()  # step 1: both used
        for p in net.parameters():
            p.grad.zero_()  # zero_grad(set_to_none=False)
        net.use_b = False
        ddp(x).sum().backward()  # step 2: b unused, its zero gradient kept
        out[f"{name}.kept_zero"] = net.m["b"].weight.grad.abs().max().item()
        for p in net.parameters():
            p.grad = None
        net.use_b = True
        with ddp.no_sync():
            ddp(x).sum().backward()  # b's only gradient
        net.use_b = False
        ddp(x).sum().backward()
        expected_b = (
            sum(2.0 * (r + 1) for r in range(world)) / world
        )  # d(sum)/dW per rank, averaged
        out[f"{name}.accumulated_b_error"] = (
            (net.m["b"].weight.grad - expected_b).abs().max().item()
        )
    return out


def test_a_gradient_no_backward_touched_is_averaged_not_replaced(cluster2):
    for r in cluster2.run(_a_gradient_the_synced_backward_does_not_touch):
        for name in OURS:
            assert r[f"{name}.kept_zero"] == 0.0, (name, r)
            assert r[f"{name}.accumulated_b_error"] < 1e-6, (name, r)
