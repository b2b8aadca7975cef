"""The model knows nothing about parallelism (DESIGN; torchtitan's rule): no module under
``lib/dtlab/models`` imports ``dtlab.parallel``, ``dtlab.mesh`` (where the layout rules live:
:mod:`dtlab.mesh.layout_rules`) or ``dtlab.plan`` — at module level or inside a function.
Whether a layout fits the model is asked from outside, of the config."""

from __future__ import annotations

from pathlib import Path

import dtlab.models
from dtlab.models import GPTConfig
from import_reader import imported_names, is_under

MODELS = Path(__file__).resolve().parents[1] / "lib" / "dtlab" / "models"
PARALLELISM = ("dtlab.parallel", "dtlab.mesh", "dtlab.plan")


def _about_parallelism(name: str) -> bool:
    return is_under(name, PARALLELISM)


def test_the_reader_finds_imports_hidden_inside_functions():
    source = "def f():\n    from dtlab.mesh.layout_rules import validate_layout\n"
    source += "def g():\n    from dtlab import plan\n"
    found = {n for n in imported_names(source, "dtlab.models") if _about_parallelism(n)}
    assert {"dtlab.mesh.layout_rules", "dtlab.plan"} <= found


def test_no_model_module_imports_anything_about_parallelism():
    offenders = {}
    for path in sorted(MODELS.rglob("*.py")):
        bad = sorted(
            n
            for n in imported_names(path.read_text(encoding="utf-8"), "dtlab.models")
            if _about_parallelism(n)
        )
        if bad:
            offenders[path.name] = bad
    assert not offenders, f"the model imports parallelism: {offenders}"


def test_the_model_offers_no_layout_check():
    """Layout validity is asked of :mod:`dtlab.mesh.layout_rules`, not of the model."""
    assert not hasattr(GPTConfig.tiny(), "check_parallel")
    assert not hasattr(dtlab.models, "validate_layout")
