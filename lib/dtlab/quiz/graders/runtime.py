"""Graders for lab 13 (the accelerator runtime): an op on the roofline, and a profile's syncs.

``runtime.intensity_and_bound`` — ``fn(op, dims, bytes_per_element, peak_flops, bandwidth) ->
(intensity, bound)``: the arithmetic intensity (FLOP per byte moved) of one op from its shapes
and whether the machine runs it ``"memory"``- or ``"compute"``-bound. Ops and their cost model
(:func:`dtlab.perf.roofline.op_cost`, each tensor read or written once): ``matmul`` ``{m, k,
n}``, ``add`` ``{n}``, ``gelu`` ``{n}``, ``bias_gelu`` ``{rows, cols}``. Graded on cases where
the answer turns on the skill: a matmul that is compute-bound on one machine and memory-bound on
another (a decode-time ``m = 1``), BF16 against FP32, elementwise ops at every size. Calling
``op_cost``/``intensity_and_bound``/``Roofline.bound`` is refused.

``runtime.find_host_syncs`` — ``fn(events) -> list[int]``: the indices of the ``cpu_op``
events of a GPU step's profiler trace inside which the host waited for the device. Graded on
traces from :func:`dtlab.perf.sample_trace.planted_profile` with different seeds and numbers of
planted syncs, each with decoys that do not block the host (a non-blocking copy to pinned
memory, ``cudaStreamWaitEvent``, host→device copies); the answer must be exactly the planted
set. Calling ``host_syncs_in_profile`` is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.watch import noticing_calls

CPU_LIKE = (2.0e11, 3.0e10)  # FLOP/s, bytes/s: a two-core AVX-512 host (ridge ≈ 6.7)
H100 = (9.894e14, 3.35e12)  # dense BF16, HBM3 (ridge ≈ 295)
BOUND_CASES = (
    ("matmul", {"m": 4096, "k": 4096, "n": 4096}, 2, *H100),
    ("matmul", {"m": 1, "k": 8192, "n": 8192}, 2, *H100),  # decode: a matrix-vector product
    ("matmul", {"m": 1, "k": 8192, "n": 8192}, 2, *CPU_LIKE),
    ("matmul", {"m": 64, "k": 4096, "n": 4096}, 2, *H100),
    ("matmul", {"m": 64, "k": 4096, "n": 4096}, 4, *CPU_LIKE),
    ("matmul", {"m": 512, "k": 64, "n": 512}, 4, *CPU_LIKE),
    ("add", {"n": 1 << 20}, 4, *CPU_LIKE),
    ("add", {"n": 1 << 24}, 2, *H100),
    ("gelu", {"n": 1 << 22}, 2, *H100),
    ("bias_gelu", {"rows": 8192, "cols": 4096}, 2, *H100),
)
SYNC_SEEDS = ((1, 4), (2, 5), (3, 3), (4, 6), (5, 4), (6, 2))  # (seed, planted syncs)


def _bound_answers() -> dict[Callable, str]:
    from dtlab.perf import roofline

    return {
        roofline.op_cost: "dtlab.perf.roofline.op_cost",
        roofline.intensity_and_bound: "dtlab.perf.roofline.intensity_and_bound",
        roofline.Roofline.bound: "dtlab.perf.roofline.Roofline.bound",
    }


def _describe(op: str, dims: dict, e: int, peak: float, bw: float) -> str:
    sizes = ", ".join(f"{k}={v}" for k, v in dims.items())
    return f"{op}({sizes}) at {e} B/element on {peak:.3g} FLOP/s, {bw:.3g} B/s"


@exercise("runtime.intensity_and_bound", title="An op on the roofline", world_size=1)
def grade_intensity_and_bound(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(op, dims, bytes_per_element, peak_flops, bandwidth) -> (intensity, bound)``."""
    from dtlab.perf.roofline import intensity_and_bound

    for case in BOUND_CASES:
        with noticing_calls(_bound_answers()) as noticed:
            got = fn(case[0], dict(case[1]), *case[2:])
        if noticed:
            raise NotTheSkill(
                f"your function calls {noticed[0]} — the library's answer. Count it: FLOPs from "
                "the shapes (2mkn for a matmul), bytes = every input read once + the output "
                "written once, times the bytes per element; compare FLOP/byte with peak/bandwidth"
            )
        want_i, want_b = intensity_and_bound(*case[:2], *case[2:])
        what = _describe(*case)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise AssertionError(f"{what}: return a pair (intensity, bound), got {got!r}")
        intensity, bound = got
        if not isinstance(intensity, (int, float)) or abs(intensity - want_i) > 1e-6 * want_i:
            raise AssertionError(
                f"{what}: intensity {intensity!r} FLOP/byte, want {want_i:.4g} — FLOPs over "
                "bytes read plus written"
            )
        if bound != want_b:
            raise AssertionError(
                f"{what}: said {bound!r}; the ridge point is {case[3] / case[4]:.3g} FLOP/byte "
                f"and the op does {want_i:.3g}, so it is {want_b!r}-bound"
            )
    return GradeResult(
        True,
        f"Right intensity and bound for {len(BOUND_CASES)} ops: the m = 1 matmul is "
        "memory-bound on an H100 yet compute-bound on a CPU, and every elementwise op is "
        "memory-bound everywhere.",
    )


@exercise("runtime.find_host_syncs", title="Find the host syncs in a profile", world_size=1)
def grade_find_host_syncs(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(events) -> list[int]``: exactly the planted syncs of several profiles."""
    from dtlab.perf import syncs
    from dtlab.perf.sample_trace import planted_profile

    answers = {syncs.host_syncs_in_profile: "dtlab.perf.syncs.host_syncs_in_profile"}
    for seed, planted in SYNC_SEEDS:
        events, want = planted_profile(seed, n_syncs=planted)
        with noticing_calls(answers) as noticed:
            got = fn([dict(e, args=dict(e["args"])) for e in events])
        if noticed:
            raise NotTheSkill(
                f"your function calls {noticed[0]} — the library's answer. Read the trace: "
                "which runtime calls inside an op make the CPU thread wait for the GPU's queue?"
            )
        try:
            got_set = {int(i) for i in got}
        except (TypeError, ValueError):
            raise AssertionError(f"return a list of event indices, got {got!r}") from None
        missed = sorted(set(want) - got_set)
        extra = sorted(got_set - set(want))
        if missed:
            e = events[missed[0]]
            raise AssertionError(
                f"trace {seed}: missed event {missed[0]} ({e['name']}) — look at the runtime "
                "calls inside it and how long the last one lasts"
            )
        if extra:
            name = events[extra[0]]["name"] if 0 <= extra[0] < len(events) else "no such event"
            raise AssertionError(
                f"trace {seed}: event {extra[0]} ({name}) does not make the host wait"
                " — which of its runtime calls would block, and until when?"
            )
    return GradeResult(
        True,
        f"Exactly the planted syncs in {len(SYNC_SEEDS)} traces, and none of the decoys: a "
        "non-blocking copy to pinned memory and cudaStreamWaitEvent do not stop the host.",
    )


# -- quiz keys, from the library -----------------------------------------------------------------
def ridge_point_key(peak_flops: float, bandwidth: float) -> float:
    """FLOP per byte where the roofs meet."""
    from dtlab.perf.roofline import Roofline

    return Roofline("given", peak_flops, bandwidth).ridge


def matmul_intensity_key(m: int, k: int, n: int, bytes_per_element: int) -> float:
    """FLOP per byte of an ``m × k`` by ``k × n`` matmul, each operand moved once."""
    from dtlab.perf.roofline import op_cost

    flops, nbytes = op_cost("matmul", {"m": m, "k": k, "n": n}, bytes_per_element)
    return flops / nbytes


def elementwise_time_us_key(n: int, bytes_per_element: int, op: str, bandwidth: float) -> float:
    """The roofline's time of a memory-bound elementwise op, in microseconds."""
    from dtlab.perf.roofline import op_cost

    return op_cost(op, {"n": n}, bytes_per_element)[1] / bandwidth * 1e6


def launch_bound_step_ms_key(ops: int, per_op_us: float, device_ms: float) -> float:
    """A step whose host issues ``ops`` ops at ``per_op_us`` each while the device needs
    ``device_ms``: the longer of the two, in ms (the host runs ahead until it cannot)."""
    from dtlab.perf.launch import launch_bound_step_seconds

    return launch_bound_step_seconds(ops, per_op_us * 1e-6, device_ms * 1e-3) * 1e3


def fused_speedup_key(rows: int, cols: int, bytes_per_element: int) -> float:
    """Eager RMSNorm's bytes over a fused kernel's: the roofline's predicted speed-up."""
    from dtlab.perf.fusion import rmsnorm_fused_bytes, rmsnorm_unfused_bytes

    return rmsnorm_unfused_bytes(rows, cols, bytes_per_element) / rmsnorm_fused_bytes(
        rows, cols, bytes_per_element
    )


def fragmentation_overhead_mib_key(
    token_counts: list[int], width: int, bytes_per_element: int
) -> float:
    """Reserved beyond the peak in use (MiB) when one buffer of ``tokens × width`` is
    allocated, used and freed per step, in order, by the caching allocator model."""
    from dtlab.cost.caching_allocator import MiB, replay

    events: list[tuple] = []
    for i, tokens in enumerate(token_counts):
        events += [("alloc", i, tokens * width * bytes_per_element), ("free", i)]
    _, peaks = replay(events, 1 << 40)
    return peaks["overhead"] / MiB


def mfu_key(tokens_per_s: float, n_params: float, n_layers: int, seq_len: int, d_model: int,
            peak_flops: float, attention: bool) -> float:  # fmt: skip
    """MFU in percent, with (``6N + 6·L·s·d``) or without (``6N``) causal attention FLOPs."""
    from dtlab.cost.mfu import mfu_report

    report = mfu_report(tokens_per_s, 1, peak_flops, n_params, n_layers, seq_len, d_model)
    return 100 * report["mfu_causal_attention" if attention else "mfu_6n"]


def compile_break_even_steps_key(
    cold_start_s: float, eager_step_s: float, compiled_step_s: float
) -> float:
    """Steps after which compiling has paid for its cold start: ``cold / (eager − compiled)``."""
    from dtlab.perf.fusion import compile_break_even_steps

    if eager_step_s <= compiled_step_s:
        raise ValueError("the compiled step must be faster than the eager one to ever pay off")
    return compile_break_even_steps(cold_start_s, eager_step_s, compiled_step_s)


def sync_idle_ms_key(syncs_per_step: int, refill_us: float) -> float:
    """Device idle per step from host syncs, in ms: after each sync the queue is empty and the
    device waits while the host issues the next kernel (``refill_us``)."""
    from dtlab.perf.syncs import sync_idle_seconds

    return sync_idle_seconds(syncs_per_step, refill_us * 1e-6) * 1e3
