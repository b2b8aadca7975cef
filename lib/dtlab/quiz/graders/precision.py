"""Graders for lab 08 (mixed precision): the loss scaler's update rule and per-tile FP8.

``precision.loss_scaler_update`` — ``fn(grads, scale, clean_steps, growth_interval) ->
(skip, new_scale, new_clean_steps)``, called on every rank after a backward of ``scale × loss``
with the gradients *this rank* holds (a ZeRO shard). It must unscale ``grads`` in place
(divide by ``scale``), decide whether **any rank** holds an inf/NaN with **one all-reduce** of a
flag, and apply the rule: overflow → skip, halve the scale, reset the count; else count the
clean step and double the scale (count back to 0) when it reaches ``growth_interval``. Graded on
every rank of the cluster over cases where only rank 1 (or only rank 0) overflows, a step that
reaches the growth interval, and huge-but-finite gradients; any other collective, more than one
all-reduce per call, and calling someone else's rule are refused: the library's
(:func:`~dtlab.precision.next_scale_state`, :class:`~dtlab.precision.DynamicLossScaler`), this
grader's own key, ``torch.amp.GradScaler``, and the ATen kernels GradScaler runs
(``_amp_foreach_non_finite_check_and_unscale_``, ``_amp_update_scale_``) — the last are seen by
a ``TorchDispatchMode``, so reaching them through ``torch.ops.aten`` is noticed too.

``precision.quantize_tiles`` (per-tile FP8) is graded in :mod:`.precision_tiles`; its names
are importable from here too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.precision_tiles import TILE_CASES as TILE_CASES
from dtlab.quiz.graders.precision_tiles import grade_quantize_tiles as grade_quantize_tiles
from dtlab.quiz.graders.watch import noticing_calls, watching

ONE_FLAG = (
    "combine the ranks' overflow flags with one dist.all_reduce (op=MAX) of a small tensor; "
    "nothing else needs to move"
)
SCALE = 2.0**10
INTERVAL = 3
# (name, rank whose gradient overflows: None/0/1, value planted, clean_steps before)
SCALER_CASES = (
    ("clean step", None, None, 0),
    ("clean step that completes the growth interval", None, None, INTERVAL - 1),
    ("inf only on rank 1", 1, float("inf"), 1),
    ("nan only on rank 0", 0, float("nan"), 2),
    ("huge but finite gradients", None, 6.0e4, 0),
)


# ATen kernels that *are* GradScaler's answer (unscale + inf check; the update rule).
AMP_KERNELS = {
    "aten._amp_foreach_non_finite_check_and_unscale_": "torch's GradScaler unscale kernel",
    "aten._amp_update_scale_": "torch's GradScaler update kernel (torch._amp_update_scale_)",
}


def _scaler_answers() -> dict[Callable, str]:
    import torch

    from dtlab.precision import loss_scaler

    answers = {
        loss_scaler.next_scale_state: "dtlab.precision.next_scale_state",
        loss_scaler.DynamicLossScaler.unscale_: "DynamicLossScaler.unscale_",
        loss_scaler.DynamicLossScaler.update: "DynamicLossScaler.update",
        expected_scaler_update: "the grader's own expected_scaler_update",
    }
    scaler = torch.amp.GradScaler
    for method in ("unscale_", "_unscale_grads_", "update", "step"):
        answers[getattr(scaler, method)] = f"torch.amp.GradScaler.{method}"
    return answers


@contextmanager
def noticing_amp_kernels() -> Iterator[list[str]]:
    """The names of GradScaler's ATen kernels (:data:`AMP_KERNELS`) run inside the block, by
    whatever Python path they were reached (``torch._amp_update_scale_``, ``torch.ops.aten``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    noticed: list[str] = []

    class Notice(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = AMP_KERNELS.get(str(func.overloadpacket))
            if name is not None and name not in noticed:
                noticed.append(name)
            return func(*args, **(kwargs or {}))

    with Notice():
        yield noticed


def expected_scaler_update(found_inf: bool, scale: float, clean: int, interval: int):
    """The rule a correct answer follows: (skip, new_scale, new_clean_steps), in FP32 as
    GradScaler's (:func:`~dtlab.precision.next_scale_state`: a growth past FP32's range is
    refused). Halving and doubling the graded ``SCALE`` are exact, so Python floats pass."""
    from dtlab.precision.loss_scaler import to_fp32

    if found_inf:
        return True, to_fp32(scale * 0.5), 0
    if clean + 1 == interval:
        grown = to_fp32(scale * 2.0)
        return False, grown if grown != float("inf") else scale, 0
    return False, scale, clean + 1


def _scaler_on_rank(fn: Callable) -> dict:
    import torch
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    out, used = [], []
    for name, bad_rank, value, clean in SCALER_CASES:
        g = torch.Generator().manual_seed(10 + rank)
        grads = [torch.randn(6, 4, generator=g) * SCALE, torch.randn(5, generator=g) * SCALE]
        if bad_rank == rank:
            grads[1][2] = value  # only this rank's shard overflowed
        elif bad_rank is None and value is not None:
            grads[0][0, 0] = value  # large, finite
        originals = [t.clone() for t in grads]
        with (
            noticing_calls(_scaler_answers()) as noticed,
            noticing_amp_kernels() as kernels,
            watching({"all_reduce"}, ONE_FLAG, dtlab_collectives=False) as wire,
        ):
            try:
                got = fn(grads, SCALE, clean, INTERVAL)
            except NotImplementedError:
                raise
            except Exception as error:  # noqa: BLE001 - reported to the learner
                out.append({"case": name, "error": repr(error)})
                break
        used += noticed + kernels
        reduces = [c for c in wire.collectives if c.kind == "all_reduce"]
        finite = all(torch.isfinite(t).all() for t in originals)
        unscaled = finite and all(
            torch.allclose(t, o / SCALE, rtol=1e-6, atol=0)
            for t, o in zip(grads, originals, strict=False)
        )
        out.append(
            {
                "case": name,
                "got": tuple(got) if isinstance(got, tuple | list) else got,
                "all_reduces": len(reduces),
                "unscaled": unscaled or not finite,
                "overflow_somewhere": bad_rank is not None,
                "clean": clean,
            }
        )
    return {"rank": rank, "cases": out, "used": used}


@exercise("precision.loss_scaler_update", title="The dynamic loss scaler's update", world_size=2)
def grade_loss_scaler_update(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(grads, scale, clean_steps, growth_interval) -> (skip, new_scale, new_clean_steps)``."""
    results = cluster.run(_scaler_on_rank, fn)
    for r in results:
        if r["used"]:
            raise NotTheSkill(
                f"your update calls {r['used'][0]} — a ready-made answer. Write the rule: "
                "unscale, one all-reduce of an overflow flag, then halve or count (and double)"
            )
    for r in results:
        for case in r["cases"]:
            where = f"on rank {r['rank']}, {case['case']}"
            if "error" in case:
                raise AssertionError(f"{where}: your function raised {case['error']}")
            got = case["got"]
            if not isinstance(got, tuple) or len(got) != 3:
                raise AssertionError(f"{where}: return (skip, new_scale, new_clean_steps)")
            if case["all_reduces"] != 1:
                raise AssertionError(
                    f"{where}: {case['all_reduces']} all-reduces; use exactly one per step — "
                    "a rank sees only its own shard, so the flag must travel, and one flag is "
                    "enough"
                )
            want = expected_scaler_update(
                case["overflow_somewhere"], SCALE, case["clean"], INTERVAL
            )
            if bool(got[0]) != want[0]:
                raise AssertionError(
                    f"{where}: skip={bool(got[0])}, want {want[0]}"
                    + (
                        " — another rank's gradient overflowed; every rank must skip together"
                        if want[0]
                        else ""
                    )
                )
            if float(got[1]) != want[1] or int(got[2]) != want[2]:
                raise AssertionError(
                    f"{where}: returned scale {float(got[1])}, clean steps {int(got[2])}; want "
                    f"{want[1]} and {want[2]} (halve and reset on overflow; double and reset "
                    f"when the clean count reaches growth_interval={INTERVAL})"
                )
            if not case["unscaled"]:
                raise AssertionError(f"{where}: divide every gradient by the scale, in place")
    return GradeResult(
        True,
        f"On {cluster.world_size} ranks your scaler unscales in place, agrees on overflow with "
        f"one all-reduce when only one rank's shard holds inf or nan, halves the scale and skips, "
        f"and doubles it after {INTERVAL} clean steps.",
    )


# -- quiz keys, from the library -----------------------------------------------------------------
def scale_after_key(
    init_scale: float, events: str, growth_interval: int, hysteresis: int = 1
) -> float:
    """The loss scale after ``events`` (a string of ``c`` clean and ``o`` overflow steps) under
    GradScaler's rule, with DeepSpeed's ``hysteresis`` (:func:`~dtlab.precision.next_scale_state`)."""
    from dtlab.precision.loss_scaler import ScalerConfig, ScalerState, next_scale_state

    config = ScalerConfig(
        init_scale=init_scale, growth_interval=growth_interval, hysteresis=hysteresis
    )
    state = ScalerState.start(config)
    for event in events:
        if event not in "co":
            raise ValueError(f"events are 'c' (clean) and 'o' (overflow), not {event!r}")
        state = next_scale_state(state, event == "o", config)
    return state.scale
