"""The planner's layer against one measured layer: Korthikanti et al. 2022, Table 4 (22B GPT,
TP 8, micro-batch 4, A100s; :mod:`dtlab.plan.published_layer_times`). Model outputs against
published measurements; nothing is timed here.

The model, ms (forward / backward): no recomputation 7.49 / 12.60 (measured 7.7 / 11.9), SP
7.01 / 11.95 (7.2 / 11.8), full recomputation 7.49 / 20.09 (7.7 / 19.5), selective 7.49 / 13.84
(7.7 / 13.2), selective + SP 7.01 / 13.19 (7.2 / 13.1): every combined time within 3 %, every
forward within 3 %. The known miss is backward without SP, 3–6 % slow: the model prices the
LayerNorm and dropout backward every TP rank runs whole (0.74 ms a layer) where the paper
measured SP saving only 0.1 ms of backward, and names SP's reduce-scatter plus all-gather
running slower than one all-reduce as the reason."""

from __future__ import annotations

import pytest

from dtlab.plan.published_layer_times import GPT_22B, TABLE4, model_layer_times

ROWS = {row.experiment: row for row in TABLE4}


@pytest.fixture(scope="module")
def modelled():
    return {row.experiment: model_layer_times(GPT_22B, row.plan) for row in TABLE4}


@pytest.mark.parametrize("row", TABLE4, ids=lambda r: r.experiment)
def test_each_measured_layer_is_reproduced_within_3_percent(row, modelled):
    forward, backward = modelled[row.experiment]
    assert (forward + backward) / row.combined_s == pytest.approx(1.0, abs=0.03)
    assert forward / row.forward_s == pytest.approx(1.0, abs=0.03)


@pytest.mark.parametrize("row", TABLE4, ids=lambda r: r.experiment)
def test_backward_without_sequence_parallelism_is_the_known_miss(row, modelled):
    ratio = modelled[row.experiment][1] / row.backward_s
    if row.plan.sequence_parallel:
        assert ratio == pytest.approx(1.0, abs=0.02)
    else:
        assert 1.0 < ratio < 1.07


def test_sequence_parallelism_saves_the_forwards_redundant_norms_and_dropouts(modelled):
    """Table 4's first two rows: SP made the forward 0.5 ms faster, "from the layer-norm and
    dropout layers being performed on 1/t of the data"; the model's bytes give 0.48 ms."""
    baseline, sp = ROWS["baseline, no recomputation"], ROWS["sequence parallelism"]
    measured = baseline.forward_s - sp.forward_s
    model = modelled["baseline, no recomputation"][0] - modelled["sequence parallelism"][0]
    assert model == pytest.approx(measured, rel=0.1)


def test_full_recomputation_costs_more_than_one_forward(modelled):
    """39 % over the baseline, not the 33 % of one more forward: the rerun's TP all-reduces
    are exposed, where backward's hide behind the weight-gradient GEMMs (Sec. 6.2)."""

    def overhead(times, experiment):
        base, full = times["baseline, no recomputation"], times[experiment]
        return sum(full) / sum(base) - 1

    measured = {e: ROWS[e].combined_s / ROWS["baseline, no recomputation"].combined_s - 1
                for e in ROWS}  # fmt: skip
    assert measured["baseline with full recompute"] == pytest.approx(0.39, abs=0.005)
    assert overhead(modelled, "baseline with full recompute") == pytest.approx(
        measured["baseline with full recompute"], abs=0.03
    )
    assert overhead(modelled, "baseline with full recompute") > 1 / 3
    assert overhead(modelled, "selective recomputation") == pytest.approx(
        measured["selective recomputation"], abs=0.02
    )
