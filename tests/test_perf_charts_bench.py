"""The lab's charts follow dtlab's chart rules, and `dtlab bench runtime_perf` prints CPU
figures whose counted bytes equal the formula beside them."""

from __future__ import annotations

import json

from dtlab.cost.caching_allocator import MiB
from dtlab.perf.charts import roofline_chart, segments_chart, time_per_op_chart
from dtlab.perf.op_census import PlacedOp
from dtlab.perf.roofline import Roofline, datasheet_for
from dtlab.viz.chart import chart_problems


def test_the_roofline_chart_shows_both_bounds_and_the_datasheet_with_units():
    roof = Roofline("cpu", 2e11, 3e10)
    placed = [
        PlacedOp("mm", 3, 1e9, 1e7, 1e-2, "compute"),
        PlacedOp("add", 9, 1e6, 1e7, 1e-3, "memory"),
    ]
    fig = roofline_chart(roof, placed, datasheet_for("NVIDIA H100"))
    assert chart_problems(fig) == []
    names = {trace.name for trace in fig.data}
    assert {
        "measured roofline",
        "compute-bound op (measured)",
        "memory-bound op (measured)",
    } <= names


def test_the_time_and_segment_charts_have_units_and_say_what_they_show():
    assert chart_problems(time_per_op_chart([(1, 1e-6), (1 << 20, 1e-4)], 1e-6)) == []
    fig = segments_chart([[(3 * MiB, True), (17 * MiB, False)]], "simulated caching allocator")
    assert chart_problems(fig) == [] and "simulated" in fig.layout.title.text


def test_the_bench_prints_measured_cpu_figures_beside_their_formulas(tmp_path, capsys):
    from dtlab.bench import available, runtime_perf

    assert "runtime_perf" in available()
    path = tmp_path / "figures.json"
    assert runtime_perf.main(["--fast", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    figures = json.loads(path.read_text())
    assert figures["rmsnorm_counted_bytes"] == figures["rmsnorm_formula_bytes"]
    assert figures["peak_flops"] > 0 and figures["bandwidth"] > 0
    assert figures["graph_measured"] is False  # a CPU has no graphs: an estimate, said so
    assert "no device graphs on this device" in out and "roofline: peak" in out


def test_the_syncs_chart_marks_every_sync_of_a_traced_step():
    import torch

    from dtlab.perf.charts import syncs_chart
    from dtlab.perf.syncs import SyncCounter
    from dtlab.trace import Trace
    from dtlab.trace.recorder import Span

    with SyncCounter() as syncs:
        torch.ones(3).sum().item()
        torch.ones(3).tolist()
    first, last = syncs.spans[0], syncs.spans[-1]
    step = Span(0, "step", "compute", first.start_ns - 1000, last.end_ns + 1000)
    fig = syncs_chart(Trace.from_rank_spans([[s.to_dict() for s in [step, *syncs.spans]]]))
    assert chart_problems(fig) == []
    assert {t.name for t in fig.data} == {"training step", "sync:item", "sync:tolist"}
