"""The planner's activation memory per rank is within 5 % of what the ranks hold.

Each rank of ``dtlab.Cluster`` composes the same fp32 tiny GPT (dropout 0) over a mesh with
:func:`~dtlab.parallel.compose.compose_gpt` and runs one training step under the saved-tensor-hook
meter (:func:`dtlab.memory.peak_saved.measure_step_activations`): its peak of bytes saved for
backward — for a pipeline, the micro-batches in flight at once — is compared with
:func:`dtlab.plan.predict_activations.predicted_activation_bytes`, computed from the config and
the layout alone; so is each category's bytes per micro-batch. A negative control: the same
prediction with every micro-batch counted once (in-flight micro-batches ignored) misses the
pipeline's measured peak by far more than 5 %.
"""

from __future__ import annotations

import pytest

import dtlab

GLOBAL_BATCH, N_MICRO = 8, 4
LAYOUTS = [  # (degrees, sequence_parallel, schedule, recompute)
    ({"dp": 2, "tp": 2}, True, None, "none"),
    ({"cp": 2, "dp": 2}, False, None, "none"),
    ({"pp": 2, "tp": 2}, False, "1f1b", "none"),
    ({"pp": 4}, False, "gpipe", "none"),
    ({"pp": 2, "dp": 2}, False, "gpipe", "selective"),
    ({"pp": 2, "cp": 2, "tp": 2}, False, "1f1b", "none"),
]


def _config():
    from dtlab.models import GPTConfig

    return GPTConfig.tiny(seq_len=24, d_model=32, n_heads=4, n_layers=4, vocab_size=96, dropout=0.0)


def measured_and_predicted(degrees: dict, sp: bool, schedule: str | None, recompute: str) -> dict:
    """On one rank: the measured peak and categories of one composed step, and the prediction."""
    from dtlab.memory.peak_saved import measure_step_activations
    from dtlab.mesh import Layout, Mesh
    from dtlab.models import GPT, SyntheticTokens
    from dtlab.parallel.activations.recomputation import recompute_attention_core
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.pipeline import SCHEDULES
    from dtlab.plan.predict_activations import (
        micro_batches_in_flight,
        per_micro_batch_bytes,
        predicted_activation_bytes,
    )

    config, mesh = _config(), Mesh(**degrees)
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=GLOBAL_BATCH, seed=3)[0]
    pipe = SCHEDULES[schedule](mesh.pp_size, N_MICRO) if schedule else None
    model = GPT(config, seed=0)
    if recompute == "selective":
        recompute_attention_core(model)
    composed = compose_gpt(model, mesh, sequence_parallel=sp, schedule=pipe, collectives="dtlab")
    measured = measure_step_activations(composed, tokens, targets)
    kwargs = dict(
        global_batch=GLOBAL_BATCH,
        pp_rank=mesh.pp_rank,
        n_micro=N_MICRO,
        sequence_parallel=sp,
        recompute=recompute,
    )
    layout = Layout(**degrees)
    predicted = predicted_activation_bytes(config, layout, schedule=schedule or "1f1b", **kwargs)
    one = per_micro_batch_bytes(config, layout, **kwargs)
    m = N_MICRO if schedule else 1
    step_total = {k: m * v for k, v in one.items()}  # every micro-batch's, over the step
    if layout.cp > 1:
        # One positions tensor serves the whole step; the meter's total counts it again each
        # time it is saved after backward freed it, so only the peak tests it.
        del step_total["positions"]
    return {
        "pp_rank": mesh.pp_rank,
        "measured_peak": measured["peak"],
        "predicted_peak": sum(predicted.values()),
        "measured_by_category": measured["by_category"],
        "predicted_by_category": step_total,
        "in_flight": micro_batches_in_flight(schedule or "1f1b", mesh.pp_size, mesh.pp_rank, m),
        "after_backward": measured["after_backward"],
        "predicted_ignoring_in_flight": sum(one.values()),
    }


def every_layout_of_this_world() -> list[dict]:
    """Every layout of :data:`LAYOUTS` whose degrees multiply to this cluster's world size."""
    import math

    world = dtlab.world_size()
    return [
        measured_and_predicted(*layout)
        for layout in LAYOUTS
        if math.prod(layout[0].values()) == world
    ]


def run_every_layout(cluster4=None) -> dict:
    """``{world size: [per rank, per layout of that world size]}``: world 4 on ``cluster4`` (or
    a cluster of its own), world 8 on a cluster of its own."""
    out = {}
    if cluster4 is not None:
        out[4] = cluster4.run(every_layout_of_this_world)
    for world in (4, 8)[cluster4 is not None :]:
        with dtlab.Cluster(world, timeout=300) as cluster:
            out[world] = cluster.run(every_layout_of_this_world)
    return out


@pytest.fixture(scope="module")
def results(cluster4) -> dict:
    return run_every_layout(cluster4)


def _cases(results: dict):
    import math

    for world, per_rank in results.items():
        layouts = [layout for layout in LAYOUTS if math.prod(layout[0].values()) == world]
        for rank, cases in enumerate(per_rank):
            for layout, result in zip(layouts, cases, strict=True):
                yield (world, rank, layout), result


def _within_5_percent(measured: float, predicted: float) -> bool:
    return abs(measured / predicted - 1) <= 0.05


def test_predicted_peak_activation_bytes_per_rank_are_within_5_percent_of_measured(results):
    for where, r in _cases(results):
        assert _within_5_percent(r["measured_peak"], r["predicted_peak"]), (where, r)
        assert r["after_backward"] == 0, where  # backward freed every saved tensor


def test_predicted_bytes_per_category_are_within_5_percent_of_measured(results):
    for where, r in _cases(results):
        for category, predicted in r["predicted_by_category"].items():
            measured = r["measured_by_category"][category]  # summed over the micro-batches
            if predicted == 0:
                assert measured == 0, (where, category, measured)
            else:
                assert _within_5_percent(measured, predicted), (where, category, r)


def test_the_prediction_is_byte_exact_on_the_lab_gpt(results):
    """Stronger than the issue's 5 %: the per-block families are exact (as
    tests/test_activation_families.py asserts), and so is every term the composition adds — a
    forgotten log-sum-exp or mask, inside 5 % at these sizes, fails here."""
    for where, r in _cases(results):
        assert r["measured_peak"] == r["predicted_peak"], where
        measured = {k: r["measured_by_category"][k] for k in r["predicted_by_category"]}
        assert measured == r["predicted_by_category"], where


def test_a_prediction_ignoring_micro_batches_in_flight_fails_the_check(results):
    pipelined = [r for _, r in _cases(results) if r["in_flight"] > 1]
    assert len(pipelined) >= 8  # 1F1B's first stages and every GPipe stage
    for r in pipelined:
        assert not _within_5_percent(r["measured_peak"], r["predicted_ignoring_in_flight"])


def test_bad_layouts_and_schedules_are_refused_with_what_to_change():
    from dataclasses import replace

    from dtlab.mesh import Layout
    from dtlab.plan.predict_activations import predicted_activation_bytes

    config = _config()
    with pytest.raises(ValueError, match="schedule="):
        predicted_activation_bytes(config, Layout(pp=2), global_batch=8, schedule="zb")
    with pytest.raises(ValueError, match="must split"):
        predicted_activation_bytes(config, Layout(pp=2, dp=2), global_batch=6, n_micro=2)
    with pytest.raises(ValueError, match="pp_rank=2"):
        predicted_activation_bytes(config, Layout(pp=2), global_batch=8, pp_rank=2)
    with pytest.raises(ValueError, match="dropout=0.0"):
        predicted_activation_bytes(replace(config, dropout=0.1), Layout(), global_batch=8)
    with pytest.raises(ValueError, match="recompute='full'"):
        predicted_activation_bytes(config, Layout(tp=2), global_batch=8, recompute="full")


if __name__ == "__main__":
    import math

    for world, per_rank in run_every_layout().items():
        layouts = [lay for lay in LAYOUTS if math.prod(lay[0].values()) == world]
        for rank, cases in enumerate(per_rank):
            for layout, r in zip(layouts, cases, strict=True):
                ratio = r["measured_peak"] / r["predicted_peak"]
                print(
                    world,
                    rank,
                    layout,
                    r["pp_rank"],
                    r["measured_peak"],
                    r["predicted_peak"],
                    f"{ratio:.4f}",
                    r["predicted_ignoring_in_flight"],
                )
                for k, v in r["predicted_by_category"].items():
                    mv = r["measured_by_category"][k]
                    if mv != v:
                        print("    ", k, "measured", mv, "predicted", v)
