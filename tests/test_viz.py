"""dtlab.viz: the timeline and memory figures built from hand-made inputs, and the pinned look."""

from __future__ import annotations

from types import SimpleNamespace

import plotly.graph_objects as go
import plotly.io as pio
import pytest

from dtlab import viz
from dtlab.trace import Span, Trace
from dtlab.viz import chart
from dtlab.viz.labels import MIB, format_bytes, format_duration_ns
from dtlab.viz.theme import GROUP_COLORS, HIGHLIGHT_COLORS
from dtlab.viz.timeline import DIMMED, MIN_BAR_FRACTION, MIN_HIGHLIGHT_FRACTION

MS = 1_000_000


@pytest.fixture
def ddp_like_trace() -> Trace:
    return Trace(
        [
            Span(0, "backward", "compute", 0, 10 * MS),
            Span(0, "bucket0", "comm", 6 * MS, 12 * MS, 4096, {"bucket": 0}),
            Span(0, "adam", "optimizer", 12 * MS, 14 * MS),
            Span(1, "backward", "compute", 1 * MS, 9 * MS),
            Span(1, "bucket0", "comm", 9 * MS, 12 * MS, 4096, {"bucket": 0}),
        ]
    )


def bar(fig: go.Figure, name: str) -> go.Bar:
    return next(t for t in fig.data if t.name == name)


def test_timeline_has_one_coloured_bar_trace_per_kind_in_kind_order(ddp_like_trace):
    fig = viz.timeline(ddp_like_trace, title="DDP step")
    assert [t.name for t in fig.data] == ["compute", "comm", "idle", "optimizer"]
    assert all(isinstance(t, go.Bar) and t.orientation == "h" for t in fig.data)
    assert {t.name: t.marker.color for t in fig.data} == {
        k: viz.KIND_COLORS[k] for k in ("compute", "comm", "idle", "optimizer")
    }
    assert fig.layout.title.text == "DDP step"


def test_timeline_bars_start_and_last_in_ms_from_the_run_start(ddp_like_trace):
    fig = viz.timeline(ddp_like_trace)
    compute = bar(fig, "compute")
    assert list(compute.y) == ["rank 0", "rank 1"]
    assert list(compute.base) == [0.0, 1.0]
    assert list(compute.x) == [10.0, 8.0]
    idle = bar(fig, "idle")  # rank 1 starts 1 ms late and finishes 2 ms early
    assert sorted(zip(idle.y, idle.base, idle.x, strict=True)) == [
        ("rank 1", 0.0, 1.0),
        ("rank 1", 12.0, 2.0),
    ]
    assert list(fig.layout.yaxis.categoryarray) == ["rank 0", "rank 1"]
    assert fig.layout.yaxis.autorange == "reversed"  # rank 0 on top


def test_timeline_hover_shows_name_kind_duration_bytes_and_labels(ddp_like_trace):
    hover = bar(viz.timeline(ddp_like_trace), "comm").hovertext[0]
    for part in ("bucket0", "rank 0 · comm", "duration 6.000 ms", "4.0 KiB", "4,096 B", "bucket=0"):
        assert part in hover


def test_timeline_draws_idle_only_when_asked(ddp_like_trace):
    fig = viz.timeline(ddp_like_trace, show_idle=False)
    assert "idle" not in [t.name for t in fig.data]


def test_comm_overlapping_compute_moves_every_ranks_transfers_to_a_lower_lane(ddp_like_trace):
    fig = viz.timeline(ddp_like_trace)
    compute, comm, idle = bar(fig, "compute"), bar(fig, "comm"), bar(fig, "idle")
    # rank 0's bucket0 overlaps its backward: work on the upper half, transfers on the lower
    assert {(o, w) for o, w in zip(compute.offset, compute.width, strict=True)} == {(-0.4, 0.4)}
    assert {(o, w) for o, w in zip(comm.offset, comm.width, strict=True)} == {(0.0, 0.4)}
    assert {(o, w) for o, w in zip(idle.offset, idle.width, strict=True)} == {(-0.4, 0.4)}


def test_timeline_without_overlap_uses_one_full_lane_per_rank():
    naive = Trace(
        [Span(0, "backward", "compute", 0, 5 * MS), Span(0, "ar", "comm", 5 * MS, 7 * MS)]
    )
    fig = viz.timeline(naive)
    assert [(t.name, list(t.offset), list(t.width)) for t in fig.data] == [
        ("compute", [-0.4], [0.8]),
        ("comm", [-0.4], [0.8]),
    ]


def test_timeline_of_an_empty_trace_says_how_to_record_spans():
    fig = viz.timeline(Trace([]))
    assert fig.data == ()
    assert "dtlab.trace.span" in fig.layout.annotations[0].text


def test_figures_serialise_identically_and_without_random_ids(ddp_like_trace):
    first, second = viz.timeline(ddp_like_trace).to_json(), viz.timeline(ddp_like_trace).to_json()
    assert first == second
    assert "uid" not in first
    mem = [{"params": MIB}, {"params": MIB}]
    assert viz.memory_bars(mem).to_json() == viz.memory_bars(mem).to_json()


def measured_totals(fig: go.Figure, which: str | None = None) -> list[float]:
    """Sum the stacked bar heights per x position (optionally only measured or formula bars)."""
    totals: dict = {}
    for t in fig.data:
        if not isinstance(t, go.Bar):
            continue
        xs = list(zip(*t.x, strict=True)) if which else list(t.x)
        for x, y in zip(xs, t.y, strict=True):
            if which is None or x[1] == which:
                totals[x] = totals.get(x, 0.0) + y
    return list(totals.values())


def test_memory_bars_stack_to_each_ranks_measured_total():
    measured = [
        {"params": 4 * MIB, "grads": 4 * MIB, "optimizer_state": 8 * MIB, "activations": 3 * MIB},
        {"params": 4 * MIB, "grads": 4 * MIB, "optimizer_state": 8 * MIB, "activations": 1 * MIB},
    ]
    fig = viz.memory_bars(measured, title="ZeRO-0")
    assert fig.layout.barmode == "stack"
    assert measured_totals(fig) == [19.0, 17.0]
    names = [t.name for t in fig.data if isinstance(t, go.Bar)]
    assert names == ["parameters", "gradients", "optimizer state", "activations"]
    assert bar(fig, "gradients").marker.color == viz.MEMORY_COLORS["gradients"]
    totals_text = next(t for t in fig.data if isinstance(t, go.Scatter))
    assert list(totals_text.text) == ["19.0", "17.0"]


def test_memory_bars_put_the_formula_beside_each_measured_bar():
    measured = [SimpleNamespace(by_category={"parameters": 2 * MIB, "gradients": 2 * MIB})] * 2
    predicted = {"parameters": 2 * MIB, "gradients": 1 * MIB, "communication buffers": MIB}
    fig = viz.memory_bars(measured, predicted)
    assert measured_totals(fig, "measured") == [4.0, 4.0]
    assert measured_totals(fig, "formula") == [4.0, 4.0]
    formula = [t for t in fig.data if isinstance(t, go.Bar) and t.x[1][0] == "formula"]
    assert all(t.marker.pattern.shape == "/" and t.showlegend is False for t in formula)
    assert bar(fig, "communication buffers").y[0] == 0.0  # measured has none of it
    per_rank = viz.memory_bars(measured, [predicted, {"parameters": MIB}])
    assert measured_totals(per_rank, "formula") == [4.0, 1.0]


def test_memory_bars_keep_unknown_categories_and_drop_all_zero_ones():
    fig = viz.memory_bars([{"parameters": MIB, "kv_cache": 2 * MIB, "other": 0}])
    assert [t.name for t in fig.data if isinstance(t, go.Bar)] == ["parameters", "kv_cache"]


def test_memory_bars_refuse_a_prediction_for_the_wrong_number_of_ranks():
    with pytest.raises(ValueError, match="predicted has 3 entries but measured has 2 ranks"):
        viz.memory_bars([{"params": 1}] * 2, [{"params": 1}] * 3)
    with pytest.raises(TypeError, match="mapping category->bytes"):
        viz.memory_bars([42])


def test_setup_notebook_pins_the_mimetype_renderer_and_dtlab_template(ddp_like_trace):
    saved = pio.renderers.default, pio.templates.default
    try:
        viz.setup_notebook()
        assert pio.renderers.default == "plotly_mimetype"
        assert pio.templates.default == "dtlab"
        bundle = pio.renderers["plotly_mimetype"].to_mimebundle(
            viz.timeline(ddp_like_trace).to_dict()
        )
        assert list(bundle) == ["application/vnd.plotly.v1+json"]  # no HTML, no random div id
        with pytest.raises(ValueError, match="no renderer"):
            viz.setup_notebook("hologram")
    finally:
        pio.renderers.default, pio.templates.default = saved


def test_numbers_read_in_binary_units_and_sensible_time_units():
    assert format_bytes(512) == "512 B"
    assert format_bytes(4096) == "4.0 KiB"
    assert format_bytes(3 * MIB) == "3.0 MiB"
    assert format_duration_ns(1500) == "1.5 µs"
    assert format_duration_ns(2_500_000) == "2.500 ms"


def test_timeline_colours_communication_by_mesh_group_when_asked():
    trace = Trace(
        [
            Span(0, "fwd", "compute", 0, 4 * MS, 0, {"phase": "F", "micro_batch": 0}),
            Span(0, "tp.all_reduce", "comm", 4 * MS, 5 * MS, 64, {"group": "tp"}),
            Span(0, "grad_rs", "comm", 5 * MS, 7 * MS, 64, {"group": "dp"}),
            Span(1, "send", "comm", 1 * MS, 2 * MS, 64, {"group": "pp"}),
        ]
    )
    fig = viz.timeline(trace, show_idle=False, color_by="group")
    assert [t.name for t in fig.data] == ["compute", "comm · dp", "comm · pp", "comm · tp"]
    colors = {t.name: t.marker.color for t in fig.data}
    assert colors["comm · tp"] == GROUP_COLORS["tp"] != colors["comm · pp"]
    assert [t.name for t in viz.timeline(trace, show_idle=False).data] == ["compute", "comm"]
    with pytest.raises(ValueError, match="choose 'kind' or 'group'"):
        viz.timeline(trace, color_by="rank")
    # Perfetto export keeps the labels as event args.
    events = [e for e in trace.to_chrome()["traceEvents"] if e.get("ph") == "X"]
    assert {e["args"].get("group") for e in events} >= {"tp", "dp", "pp"}


def test_memory_bar_totals_keep_three_digits_and_compact_bars_fit_many_ranks():
    small = [{"params": 0.347 * MIB}, {"params": 0.314 * MIB}]
    totals = next(t for t in viz.memory_bars(small).data if isinstance(t, go.Scatter))
    assert list(totals.text) == ["0.347", "0.314"]  # not "0.3" twice: the difference shows
    four = [{"params": MIB}] * 4
    fig = viz.memory_bars(four, {"params": MIB}, compact=True)
    assert not [t for t in fig.data if isinstance(t, go.Scatter)]  # totals on hover only
    assert {label for t in fig.data for label in t.x[1]} == {"m", "f"}


# -- issue 21: every chart has a title, axis titles with units, a legend off the data, a caption --


def test_every_library_chart_follows_the_chart_rules(ddp_like_trace):
    from dtlab.bench.collectives import BenchRecord, summarize
    from dtlab.viz.chart import chart_problems
    from dtlab.viz.memory_calculator import stage_bars

    records = [
        BenchRecord("all_reduce", a, 4, "gloo", m, 1e-3 + m / 1e9, 0.0, 0.0, 3)
        for a in ("ring", "torch")
        for m in (1024, 1 << 20)
    ]
    figures = {
        "timeline": viz.timeline(ddp_like_trace),
        "timeline by group": viz.timeline(ddp_like_trace, color_by="group"),
        "memory bars": viz.memory_bars([{"params": MIB}] * 2, {"params": MIB}),
        "memory bars, no formula": viz.memory_bars([{"params": MIB}] * 2),
        "bandwidth": viz.bandwidth_curve(records, summarize(records)),
        "ZeRO stages": stage_bars(7_000_000_000, 8, 2),
    }
    problems = {name: chart_problems(fig) for name, fig in figures.items()}
    assert problems == {name: [] for name in figures}
    assert "latency" in figures["bandwidth"].layout.meta["caption"]


def test_chart_problems_names_what_a_bare_figure_lacks():
    from dtlab.viz.chart import chart_problems, describe

    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))
    fig.update_layout(legend={"x": 0.5, "y": 0.5}, xaxis_title="size")
    assert chart_problems(fig) == [
        "no title",
        "no caption (describe(fig, caption=...))",
        "xaxis title 'size' names no unit in parentheses",
        "yaxis has no title",
        "the legend sits inside the plot area (x=0.5, y=0.5)",
    ]
    describe(fig, title="t", caption="what to see", y="time (ms)")
    fig.update_layout(xaxis_title="size (bytes)")
    assert chart_problems(fig) == []
    with pytest.raises(ValueError, match="caption"):
        describe(fig, caption=" ")


# -- issue 28: timelines show what the prose points at; legends and axis titles are never clipped --


@pytest.fixture
def ranks_started_apart() -> Trace:
    """Two ranks running the same independent step, rank 1 starting 30 ms after rank 0."""
    spans = []
    for rank, t0 in ((0, 0), (1, 30 * MS)):
        spans += [
            Span(rank, "forward", "compute", t0, t0 + 4 * MS),
            Span(rank, "backward", "compute", t0 + 5 * MS, t0 + 12 * MS),
            Span(rank, "recompute", "other", t0 + 6 * MS, t0 + 7 * MS),
            Span(rank, "offload", "memcpy", t0 + 1 * MS, t0 + 1 * MS + 2_000),  # 2 µs
        ]
    return Trace(spans)


def test_aligned_timeline_starts_every_rank_at_zero_with_idle_only_between_its_own_spans(
    ranks_started_apart,
):
    fig = viz.timeline(ranks_started_apart, align="step")
    for rank in ("rank 0", "rank 1"):
        starts = [b for t in fig.data for y, b in zip(t.y, t.base, strict=True) if y == rank]
        assert min(starts) == 0.0
    idle = bar(fig, "idle")  # the 1 ms between forward and backward, on each rank, nothing more
    assert sorted(zip(idle.y, idle.base, idle.x, strict=True)) == [
        ("rank 0", 4.0, 1.0),
        ("rank 1", 4.0, 1.0),
    ]
    assert fig.layout.xaxis.title.text == "time since each rank's first span (ms)"


def test_one_clock_timeline_of_ranks_started_apart_is_mostly_idle(ranks_started_apart):
    idle = bar(viz.timeline(ranks_started_apart), "idle")
    assert sum(idle.x) == pytest.approx(2 * 30 + 2 * 1)  # why the labs align such steps


def test_timeline_refuses_an_unknown_alignment(ranks_started_apart):
    with pytest.raises(ValueError, match="'run'.*'step'.*'latest_start'"):
        viz.timeline(ranks_started_apart, align="rank")


def test_highlighted_spans_get_their_own_colour_drawn_on_top_and_the_rest_dimmed(
    ranks_started_apart,
):
    fig = viz.timeline(ranks_started_apart, align="step", highlight="recompute")
    names = [t.name for t in fig.data]
    assert names[-1] == "recompute" and "other" not in names  # its kind had no other span
    picked = bar(fig, "recompute")
    assert picked.marker.color == HIGHLIGHT_COLORS[0]
    assert picked.marker.color not in {*viz.KIND_COLORS.values(), *GROUP_COLORS.values()}
    assert picked.opacity is None
    assert {t.opacity for t in fig.data if t.name != "recompute"} == {DIMMED}


def test_a_span_too_short_to_see_is_drawn_a_few_pixels_wide_but_hovers_its_true_duration(
    ranks_started_apart,
):
    plain = bar(viz.timeline(ranks_started_apart, align="step"), "memcpy")
    assert list(plain.x) == [pytest.approx(12 * MIN_BAR_FRACTION)] * 2  # of the 12-ms axis
    assert "duration 2.0 µs" in plain.hovertext[0]
    picked = bar(viz.timeline(ranks_started_apart, align="step", highlight="offload"), "offload")
    assert list(picked.x) == [pytest.approx(12 * MIN_HIGHLIGHT_FRACTION)] * 2


def test_latest_start_keeps_one_clock_but_cuts_the_early_ranks_wait_for_the_late_one():
    late = Trace(
        [
            Span(0, "all_to_all", "comm", 0, 33 * MS),  # rank 0 waits for rank 1 to arrive
            Span(0, "experts", "compute", 34 * MS, 40 * MS),
            Span(1, "all_to_all", "comm", 30 * MS, 33 * MS),
            Span(1, "experts", "compute", 34 * MS, 38 * MS),
        ]
    )
    fig = viz.timeline(late, align="latest_start")
    comm, compute = bar(fig, "comm"), bar(fig, "compute")
    assert list(zip(comm.y, comm.base, comm.x, strict=True)) == [
        ("rank 0", 0.0, 3.0),
        ("rank 1", 0.0, 3.0),
    ]
    assert list(compute.base) == [4.0, 4.0]  # still one clock: both started experts at 34 ms
    assert fig.layout.xaxis.title.text == "time since the last rank started (ms)"


def test_a_timeline_with_many_kinds_is_tall_enough_for_its_whole_legend():
    kinds = ["compute", "comm", "memcpy", "optimizer", "other"]
    trace = Trace([Span(0, k, k, i * MS, (i + 1) * MS) for i, k in enumerate(kinds)])
    fig = viz.timeline(trace, highlight="other")  # one rank: the shortest timeline there is
    legend_px = chart.LEGEND_TITLE_PX + chart.LEGEND_ITEM_PX * len(fig.data)
    assert fig.layout.height - fig.layout.margin.t - chart.BELOW_PLOT_PX >= legend_px
    assert viz.chart_problems(fig) == []


def test_describe_makes_room_for_a_y_title_longer_than_the_plot_is_tall():
    fig = go.Figure(go.Bar(x=["t = 2"], y=[1.0]))
    fig.update_layout(height=300, title="cost")
    fig.update_yaxes(title_text="time per layer per micro-batch (ms)")
    assert any("y-axis title" in p for p in viz.chart_problems(fig))
    viz.describe(fig, caption="what to see", x="rank")
    assert viz.chart_problems(fig) == []
    assert fig.layout.height > 300


def test_the_caption_sits_at_the_top_clear_of_subplot_titles():
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("TP", "TP + SP"))
    fig.add_bar(x=["rank 0"], y=[1], row=1, col=1)
    viz.describe(fig, title="t", caption="c", x="rank", y="bytes (MiB)")
    assert fig.layout.title.yref == "container" and fig.layout.title.yanchor == "top"
    assert fig.layout.margin.t >= chart.TOP_MARGIN_PX
