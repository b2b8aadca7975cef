"""``dtlab.parallel`` is one subpackage per family, with no loose files (DESIGN: library map).

Read from the source tree with ``ast``, without importing anything: which ``.py`` files sit
directly in ``lib/dtlab/parallel/``, what each family's ``__init__`` docstring lists, and what
``zero/`` and ``data/`` import from each other — function-local imports included, since an import
deferred into a function is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PARALLEL = Path(__file__).resolve().parents[1] / "lib" / "dtlab" / "parallel"

# The one module beside the families: what DDP (data/) and ZeRO/FSDP (zero/) share.
SHARED = "gradient_sync.py"
FAMILIES = ("data", "zero", "activations")


def _imported_modules(path: Path) -> list[tuple[int, str, list[str]]]:
    """``(line, module, names)`` for every import in ``path``, at any depth, relative resolved."""
    package = ".".join(path.relative_to(PARALLEL.parents[1]).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(anchor + ([module] if module else []))
            found.append((node.lineno, module, [alias.name for alias in node.names]))
    return found


def _touches(module: str, names: list[str], package: str) -> bool:
    """Does importing ``module`` (with ``names`` from it) reach ``package`` or a module in it?"""
    if module == package or module.startswith(package + "."):
        return True
    parent, _, last = package.rpartition(".")
    return module == parent and last in names  # ``from dtlab.parallel import data``


def test_no_loose_module_sits_directly_in_parallel():
    loose = sorted(p.name for p in PARALLEL.glob("*.py") if p.name not in ("__init__.py", SHARED))
    assert loose == [], (
        f"loose modules in lib/dtlab/parallel/: {loose}; put each in its family's subpackage "
        f"({', '.join(FAMILIES)}, tensor, pipeline, context, expert, compose)"
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_docstring_names_every_file_of_the_family(family):
    init = PARALLEL / family / "__init__.py"
    docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
    modules = sorted(p.stem for p in (PARALLEL / family).glob("*.py") if p.stem != "__init__")
    unlisted = [m for m in modules if f"dtlab.parallel.{family}.{m}`" not in docstring]
    assert modules and unlisted == [], (
        f"dtlab.parallel.{family}'s docstring does not list {unlisted}: a reader starts there"
    )


def test_zero_reaches_the_data_family_only_through_its_public_names_and_only_for_stage_0():
    offending = []
    for path in sorted((PARALLEL / "zero").glob("*.py")):
        for line, module, names in _imported_modules(path):
            if not _touches(module, names, "dtlab.parallel.data"):
                continue
            public_surface = module == "dtlab.parallel.data"
            if not (path.name == "by_stage.py" and public_surface):
                offending.append(f"zero/{path.name}:{line} imports {module} {names}")
    assert offending == [], (
        "zero/ must not reach into DDP's implementation (take shared pieces from "
        f"dtlab.parallel.gradient_sync): {offending}"
    )


@pytest.mark.parametrize(
    ("where", "forbidden"),
    [
        ("data", ("dtlab.parallel.zero",)),
        (SHARED, ("dtlab.parallel.data", "dtlab.parallel.zero")),
    ],
)
def test_data_parallel_and_the_shared_module_import_no_zero(where, forbidden):
    target = PARALLEL / where
    paths = sorted(target.glob("*.py")) if target.is_dir() else [target]
    offending = [
        f"{path.relative_to(PARALLEL)}:{line} imports {module}"
        for path in paths
        for line, module, names in _imported_modules(path)
        if any(_touches(module, names, package) for package in forbidden)
    ]
    assert offending == []


def test_the_ast_walk_sees_function_local_and_relative_imports(tmp_path, monkeypatch):
    """The checks above would miss nothing: an import inside a function body, a relative
    import and ``from dtlab.parallel import data`` are all seen."""
    fake = tmp_path / "dtlab" / "parallel"
    (fake / "zero").mkdir(parents=True)
    source = (
        "def f():\n"
        "    from dtlab.parallel.data.base import DataParallelBase\n"
        "    from ..data import naive\n"
        "    from dtlab.parallel import data\n"
    )
    (fake / "zero" / "x.py").write_text(source)
    monkeypatch.setitem(globals(), "PARALLEL", fake)
    seen = [
        _touches(module, names, "dtlab.parallel.data")
        for _, module, names in _imported_modules(fake / "zero" / "x.py")
    ]
    assert seen == [True, True, True]
