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
    assert not result and "library" in result.message


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


def test_scale_key_follows_grad_scaler_rule():
    assert scale_after_key(2.0**16, "ccc", 3) == 2.0**17
    assert scale_after_key(2.0**16, "cccoo", 3) == 2.0**15
    assert scale_after_key(2.0**16, "ccocc", 3) == 2.0**15
