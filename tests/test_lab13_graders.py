"""Lab 13's graders: hand-written answers pass; the library's answers under another name, a
wrong byte count, a wrong bound and syncs found by name alone fail."""

from __future__ import annotations

import pytest

from dtlab.perf.roofline import intensity_and_bound as library_bound
from dtlab.perf.syncs import host_syncs_in_profile as library_syncs
from dtlab.quiz import check_exercise


def _cost(op, dims, e):
    if op == "matmul":
        m, k, n = dims["m"], dims["k"], dims["n"]
        return 2 * m * k * n, (m * k + k * n + m * n) * e
    if op == "add":
        return dims["n"], 3 * dims["n"] * e
    if op == "gelu":
        return dims["n"], 2 * dims["n"] * e
    rows, cols = dims["rows"], dims["cols"]
    return 2 * rows * cols, (2 * rows * cols + cols) * e


def hand_bound(op, dims, e, peak, bandwidth):
    flops, nbytes = _cost(op, dims, e)
    intensity = flops / nbytes
    return intensity, "memory" if intensity < peak / bandwidth else "compute"


def test_a_hand_written_intensity_and_bound_passes():
    assert check_exercise("runtime.intensity_and_bound", hand_bound, cluster=object(), record=False)


def test_the_library_bound_under_another_name_is_refused():
    def wrapped(*args):
        return library_bound(*args)

    result = check_exercise("runtime.intensity_and_bound", wrapped, cluster=object(), record=False)
    assert not result and "intensity_and_bound" in result.message


def test_forgetting_the_output_write_gets_the_intensity_wrong():
    def reads_only(op, dims, e, peak, bandwidth):
        if op != "matmul":
            return hand_bound(op, dims, e, peak, bandwidth)
        m, k, n = dims["m"], dims["k"], dims["n"]
        intensity = 2 * m * k * n / ((m * k + k * n) * e)
        return intensity, "memory" if intensity < peak / bandwidth else "compute"

    result = check_exercise(
        "runtime.intensity_and_bound", reads_only, cluster=object(), record=False
    )
    assert not result and "intensity" in result.message


def test_calling_every_matmul_compute_bound_fails_on_decode():
    def matmuls_compute(op, dims, e, peak, bandwidth):
        intensity, bound = hand_bound(op, dims, e, peak, bandwidth)
        return intensity, "compute" if op == "matmul" else bound

    result = check_exercise(
        "runtime.intensity_and_bound", matmuls_compute, cluster=object(), record=False
    )
    assert not result and "memory" in result.message


BLOCKING = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}


def hand_syncs(events):
    found = []
    for i, op in enumerate(events):
        if op["cat"] != "cpu_op":
            continue
        end = op["ts"] + op["dur"]
        for call in events:
            inside = call["cat"] == "cuda_runtime" and op["ts"] <= call["ts"] <= end
            pageable = call["name"] == "cudaMemcpyAsync" and "Pageable" in call["args"].get(
                "kind", ""
            )
            if inside and (call["name"] in BLOCKING or pageable):
                found.append(i)
                break
    return found


def test_hand_written_sync_finding_passes():
    assert check_exercise("runtime.find_host_syncs", hand_syncs, cluster=object(), record=False)


def test_the_library_sync_finder_is_refused():
    def wrapped(events):
        return library_syncs(events)

    result = check_exercise("runtime.find_host_syncs", wrapped, cluster=object(), record=False)
    assert not result and "host_syncs_in_profile" in result.message


def test_flagging_every_memcpy_catches_the_non_blocking_copy_decoy():
    def every_copy(events):
        found = set(hand_syncs(events))
        for i, op in enumerate(events):
            if op["cat"] == "cpu_op" and "copy_" in op["name"]:
                found.add(i)
        return sorted(found)

    result = check_exercise("runtime.find_host_syncs", every_copy, cluster=object(), record=False)
    assert not result and "does not make the host wait" in result.message


def test_missing_the_explicit_synchronize_is_reported():
    def no_device_sync(events):
        return [i for i in hand_syncs(events) if events[i]["name"] != "torch.cuda.synchronize"]

    result = check_exercise(
        "runtime.find_host_syncs", no_device_sync, cluster=object(), record=False
    )
    assert not result and "missed event" in result.message


def test_the_bank_keys_come_from_the_library_and_match_their_explanations():
    from dtlab.quiz.graders import runtime as keys

    assert keys.ridge_point_key(989.4e12, 3.35e12) == pytest.approx(295.3, rel=1e-3)
    assert keys.ridge_point_key(989.4e12, 4.8e12) == pytest.approx(206.1, rel=1e-3)  # H200
    assert keys.launch_bound_step_ms_key(2000, 10, 8) == pytest.approx(20.0)
    assert keys.launch_bound_step_ms_key(100, 10, 8) == pytest.approx(8.0)  # device-bound
    assert keys.compile_break_even_steps_key(90, 1.2, 0.95) == pytest.approx(360)
    assert keys.sync_idle_ms_key(4, 150) == pytest.approx(0.6)
    assert keys.fused_speedup_key(8192, 4096, 2) == pytest.approx(3.5, rel=1e-3)
    assert keys.fragmentation_overhead_mib_key([1024, 768, 1280, 512, 1536], 4096, 4) == 36


def test_compiling_never_pays_off_when_the_compiled_step_is_not_faster():
    import math

    from dtlab.perf.fusion import compile_break_even_steps

    assert compile_break_even_steps(10.0, 1.0, 1.0) == math.inf
    assert compile_break_even_steps(10.0, 1.0, 0.5) == pytest.approx(20.0)
