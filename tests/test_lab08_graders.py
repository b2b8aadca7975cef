"""Lab 08's graders: a hand-written scaler update and per-tile quantiser pass; a rank-local
overflow flag, a flag per tensor, a rule that forgets to reset, a per-tensor quantiser and the
library's own answers fail with a message that says why."""

from __future__ import annotations

import torch
import torch.distributed as dist

from dtlab.precision import DynamicLossScaler, ScalerConfig, quantize_fp8
from dtlab.quiz import check_exercise
from dtlab.quiz.graders.precision import scale_after_key


def hand_update(grads, scale, clean_steps, growth_interval):
    flag = torch.zeros(1)
    for g in grads:
        g.div_(scale)
        flag = torch.maximum(flag, (~torch.isfinite(g)).any().float().reshape(1))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        return True, scale / 2, 0
    if clean_steps + 1 == growth_interval:
        return False, scale * 2, 0
    return False, scale, clean_steps + 1


def test_a_hand_written_scaler_update_passes(cluster2):
    assert check_exercise("precision.loss_scaler_update", hand_update, cluster2, record=False)


def test_a_rank_local_overflow_flag_fails_because_ranks_disagree(cluster2):
    def local_only(grads, scale, clean_steps, growth_interval):
        found = any(not torch.isfinite(g).all() for g in grads)
        for g in grads:
            g.div_(scale)
        dist.all_reduce(torch.zeros(1))  # an all-reduce, but not of the flag
        if found:
            return True, scale / 2, 0
        if clean_steps + 1 == growth_interval:
            return False, scale * 2, 0
        return False, scale, clean_steps + 1

    result = check_exercise("precision.loss_scaler_update", local_only, cluster2, record=False)
    assert not result and "every rank must skip together" in result.message


def test_one_all_reduce_per_gradient_is_refused(cluster2):
    def per_tensor(grads, scale, clean_steps, growth_interval):
        found = False
        for g in grads:
            g.div_(scale)
            flag = (~torch.isfinite(g)).any().float().reshape(1)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            found = found or bool(flag.item())
        if found:
            return True, scale / 2, 0
        return (
            (False, scale * 2, 0)
            if clean_steps + 1 == growth_interval
            else (False, scale, clean_steps + 1)
        )

    result = check_exercise("precision.loss_scaler_update", per_tensor, cluster2, record=False)
    assert not result and "exactly one" in result.message


def test_a_rule_that_never_resets_the_count_fails(cluster2):
    def no_reset(grads, scale, clean_steps, growth_interval):
        skip, new_scale, _ = hand_update(grads, scale, clean_steps, growth_interval)
        return skip, new_scale, clean_steps + 1

    result = check_exercise("precision.loss_scaler_update", no_reset, cluster2, record=False)
    assert not result and "clean steps" in result.message


def test_the_library_scaler_is_refused(cluster2):
    def library(grads, scale, clean_steps, growth_interval):
        scaler = DynamicLossScaler(ScalerConfig(init_scale=scale, growth_interval=growth_interval))
        skip = scaler.unscale_(grads)
        scaler.update()
        return skip, scaler.get_scale(), scaler.state.clean_steps

    result = check_exercise("precision.loss_scaler_update", library, cluster2, record=False)
    assert not result and "DynamicLossScaler" in result.message


def test_torch_grad_scaler_is_refused(cluster2):
    def grad_scaler(grads, scale, clean_steps, growth_interval):
        params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        opt = torch.optim.SGD(params, lr=0.0)
        scaler = torch.amp.GradScaler("cpu", init_scale=scale, growth_interval=growth_interval)
        scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
        scaler._growth_tracker.fill_(clean_steps)
        scaler.unscale_(opt)
        found = sum(
            v for v in scaler._per_optimizer_states[id(opt)]["found_inf_per_device"].values()
        )
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        scaler._per_optimizer_states[id(opt)]["found_inf_per_device"] = {"cpu": found}
        scaler.step(opt)
        scaler.update()
        return bool(found), scaler.get_scale(), int(scaler._growth_tracker)

    result = check_exercise("precision.loss_scaler_update", grad_scaler, cluster2, record=False)
    assert not result and "GradScaler" in result.message


def test_torch_amp_kernels_are_refused_by_any_path(cluster2):
    def kernels(grads, scale, clean_steps, growth_interval, update=torch._amp_update_scale_):
        found = torch.zeros(1)
        torch.ops.aten._amp_foreach_non_finite_check_and_unscale_(
            grads, found, torch.full((1,), 1.0 / scale)
        )
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        s, tracker = torch.tensor([scale]), torch.tensor([clean_steps], dtype=torch.int32)
        update(s, tracker, found, 2.0, 0.5, growth_interval)
        return bool(found), float(s), int(tracker)

    result = check_exercise("precision.loss_scaler_update", kernels, cluster2, record=False)
    assert not result and "kernel" in result.message


def test_the_graders_own_rule_is_refused(cluster2):
    from dtlab.quiz.graders.precision import expected_scaler_update as rule

    def graders_key(grads, scale, clean_steps, growth_interval):
        flag = torch.zeros(1)
        for g in grads:
            g.div_(scale)
            flag = torch.maximum(flag, (~torch.isfinite(g)).any().float().reshape(1))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return rule(bool(flag), scale, clean_steps, growth_interval)

    result = check_exercise("precision.loss_scaler_update", graders_key, cluster2, record=False)
    assert not result and "expected_scaler_update" in result.message


def test_other_honest_scaler_updates_pass(cluster2):
    def honest(grads, scale, clean_steps, growth_interval):
        inv = 1.0 / scale  # a power of two: multiplying is as exact as dividing
        found = 0.0
        for g in grads:
            g.mul_(inv)
            found += float(torch.isinf(g).sum() + torch.isnan(g).sum())
        flag = torch.tensor([found])
        dist.all_reduce(flag)  # a SUM of counts answers "did any rank overflow?" too
        if flag.item() > 0:
            return True, scale * 0.5, 0
        clean_steps += 1
        if clean_steps >= growth_interval:
            return False, scale * 2.0, 0
        return False, scale, clean_steps

    assert check_exercise("precision.loss_scaler_update", honest, cluster2, record=False)


def hand_tiles(x, tile):
    tr, tc = tile
    rows, cols = x.shape
    blocks = x.reshape(rows // tr, tr, cols // tc, tc)
    amax = blocks.abs().amax(dim=(1, 3))
    scales = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    scaled = blocks / scales[:, None, :, None]
    q = scaled.clamp(-448, 448).reshape(rows, cols).to(torch.float8_e4m3fn)
    return q, scales


def test_a_hand_written_tile_quantiser_passes(cluster2):
    assert check_exercise("precision.quantize_tiles", hand_tiles, cluster2, record=False)


def loop_tiles(x, tile):
    tr, tc = tile
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn)
    scales = torch.ones(x.shape[0] // tr, x.shape[1] // tc)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            block = x[i * tr : (i + 1) * tr, j * tc : (j + 1) * tc]
            amax = block.abs().max()
            if amax > 0:
                scales[i, j] = amax / 448.0
            q[i * tr : (i + 1) * tr, j * tc : (j + 1) * tc] = (
                (block / scales[i, j]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
            )
    return q, scales


def test_a_tile_by_tile_loop_passes_too(cluster2):
    assert check_exercise("precision.quantize_tiles", loop_tiles, cluster2, record=False)


def test_a_cast_without_clamping_or_without_scaling_fails(cluster2):
    def no_scale(x, tile):
        _, scales = hand_tiles(x, tile)
        return x.clamp(-448, 448).to(torch.float8_e4m3fn), scales

    result = check_exercise("precision.quantize_tiles", no_scale, cluster2, record=False)
    assert not result and "relative error" in result.message


def test_the_library_fp8_layer_is_refused_as_a_quantiser(cluster2):
    from dtlab.precision import Fp8Linear, Fp8Recipe

    def via_layer(x, tile):
        layer = Fp8Linear(x.shape[1], 1, bias=False, recipe=Fp8Recipe("tile"))
        q = layer.quantize("x", x, "e4m3", "tile", tile)
        return q.data, q.scales

    result = check_exercise("precision.quantize_tiles", via_layer, cluster2, record=False)
    assert not result and "quantize_fp8" in result.message


def test_one_scale_for_the_whole_tensor_is_not_per_tile(cluster2):
    def per_tensor(x, tile):
        q, scales = hand_tiles(x, x.shape)
        shape = (x.shape[0] // tile[0], x.shape[1] // tile[1])
        return q, scales.expand(shape).contiguous()

    result = check_exercise("precision.quantize_tiles", per_tensor, cluster2, record=False)
    assert not result and "amax / 448" in result.message


def test_the_library_quantiser_is_refused(cluster2):
    def library(x, tile):
        q = quantize_fp8(x, "e4m3", "tile", tile)
        return q.data, q.scales

    result = check_exercise("precision.quantize_tiles", library, cluster2, record=False)
    assert not result and "quantize_fp8" in result.message


def test_the_graders_rule_keeps_the_scale_in_fp32_as_grad_scaler():
    from dtlab.quiz.graders.precision import expected_scaler_update

    # the graded cases are exact in FP32; at its ceiling the grader's rule is GradScaler's too
    for found_inf, scale, clean in [(True, 2.0**10, 1), (False, 2.0**10, 2), (False, 2.0**127, 0)]:
        kernel_scale, tracker = torch.full((), scale), torch.full((), clean, dtype=torch.int32)
        found = torch.full((), float(found_inf))
        torch._amp_update_scale_(kernel_scale, tracker, found, 2.0, 0.5, clean + 1)
        got = expected_scaler_update(found_inf, scale, clean, clean + 1)
        assert got == (found_inf, kernel_scale.item(), int(tracker))


def test_scale_key_follows_grad_scaler_rule():
    assert scale_after_key(2.0**16, "ccc", 3) == 2.0**17
    assert scale_after_key(2.0**16, "cccoo", 3) == 2.0**15
    assert scale_after_key(2.0**16, "ccocc", 3) == 2.0**15
    # hysteresis 2: the first overflow only skips, the second halves; growth refills it
    assert scale_after_key(2.0**16, "o", 3, hysteresis=2) == 2.0**16
    assert scale_after_key(2.0**16, "oo", 3, hysteresis=2) == 2.0**15
    assert scale_after_key(2.0**16, "ooccco", 3, hysteresis=2) == 2.0**16
