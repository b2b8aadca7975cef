"""The memory calculator widget, driven headlessly: set a widget, read the formula's numbers back."""

from __future__ import annotations

import pytest

import dtlab.viz
from dtlab.memory import model_state_bytes
from dtlab.viz.memory_calculator import GB, memory_calculator, stage_bars, stage_table


def bar_totals_gb(fig) -> list[float]:
    bars = [t for t in fig.data if t.type == "bar"]
    return [sum(t.y[i] for t in bars) for i in range(len(bars[0].y))]


def test_calculator_is_exported_from_viz():
    assert dtlab.viz.memory_calculator is memory_calculator


def test_defaults_show_the_16_bytes_per_param_of_mixed_adam_ddp():
    calc = memory_calculator(num_params=7e9, world_size=8, zero_stage=0)
    assert calc.state.total == 16 * 7_000_000_000  # 112 GB: the classic 7B number
    assert "112.00" in calc.table.value


def test_setting_the_stage_and_n_recomputes_the_chosen_state():
    calc = memory_calculator(num_params=7e9, world_size=8)
    calc.zero_stage.value = 3
    calc.world_size.value = 64
    assert calc.state == model_state_bytes(7_000_000_000, 64, 3, "mixed_adam")
    assert calc.state.total == 16 * 7_000_000_000 // 64


def test_every_stage_row_and_bar_matches_the_formula_after_a_change():
    calc = memory_calculator(num_params=1e9, world_size=4)
    calc.recipe.value = "fp32_sgd_momentum"
    want = [model_state_bytes(1_000_000_000, 4, s, "fp32_sgd_momentum").total for s in range(4)]
    assert [row["total"] for row in calc.rows] == want
    assert bar_totals_gb(calc.figure) == pytest.approx([b / GB for b in want])


def test_zero_stages_shrink_memory_monotonically():
    totals = [row["total"] for row in stage_table(7_000_000_000, 8)]
    assert totals == sorted(totals, reverse=True)
    # Mixed Adam on 8 ranks: 16Ψ, 4Ψ + 12Ψ/8, 2Ψ + 14Ψ/8, 16Ψ/8.
    psi = 7_000_000_000
    assert totals == [16 * psi, 4 * psi + 12 * psi // 8, 2 * psi + 14 * psi // 8, 2 * psi]


def test_preset_fills_in_the_parameter_count():
    calc = memory_calculator()
    calc.preset.value = 70e9
    assert calc.num_params == 70_000_000_000
    assert calc.rows[0]["total"] == 16 * 70_000_000_000


def test_the_table_says_what_fits_on_one_device():
    calc = memory_calculator(num_params=7e9, world_size=8, device_gb=80)
    fits = [row.split("</td>")[-2].rsplit(">", 1)[-1] for row in calc.table.value.split("<tr")[2:]]
    assert fits == ["no", "yes", "yes", "yes"]  # 112 GB does not fit; 38.5, 26.25, 14 GB do
    calc.device_gb.value = 20
    fits = [row.split("</td>")[-2].rsplit(">", 1)[-1] for row in calc.table.value.split("<tr")[2:]]
    assert fits == ["no", "no", "no", "yes"]


def test_chosen_stage_is_drawn_solid_and_the_others_faded():
    fig = stage_bars(7_000_000_000, 8, zero_stage=2)
    opacities = list(fig.data[0].marker.opacity)
    assert opacities[2] == 1.0 and all(o < 1.0 for i, o in enumerate(opacities) if i != 2)


def test_unknown_recipe_names_the_choices():
    with pytest.raises(KeyError, match="mixed_adam"):
        memory_calculator(recipe="fp8_magic")


def test_the_model_dropdown_starts_on_custom_not_on_an_empty_selection():
    calc = memory_calculator()
    assert calc.preset.label == "custom" and calc.preset.index == 0
    calc.preset.value = 70e9
    calc.preset.value = 0  # back to custom keeps the count the preset set
    assert calc.params_billions.value == 70
